#!/usr/bin/env bash
# The chaos soak, to show nothing is lost, duplicated or reordered when
# processes, the broker and the network fail: two relay and two consumer
# processes, a Postgres and (Kafka) tansu with durable storage, each in a
# network namespace of its own (tests/netns.sh); faults for --seconds
# (default 100), then a drain and the checks. Prints one line of figures
# and the network faults by kind; exits non-zero when something was lost,
# duplicated or reordered.
#
#   bash tests/chaos.sh                   # the short soak .ci/run runs
#   bash tests/chaos.sh --seconds 1800    # a long soak
#   bash tests/chaos.sh --transport embedded --consumers group
#   bash tests/chaos.sh --relay-source wal
#   bash tests/chaos.sh --seed N --keep   # replay a run, keep db and logs
#   bash tests/chaos.sh --consumers group --churn 1-4s --seconds 300 --rate 100
#       # restart a consumer process every 1-4 s (with the same
#       # instance id; --no-static-membership for dynamic members), the only
#       # fault unless --with-faults adds the others, and
#       # print handled_during_churn= and arrivals_during_churn=
#
# Faults: SIGKILLs of every outboxd process, tansu killed (Kafka),
# pg_terminate_backend, two plugin hot swaps, and network faults between
# each process and Postgres or the broker: partitions shorter and longer
# than publish_timeout and packet loss (nftables drop rules), delay,
# jitter and hung connections (the driver's TCP proxy).
#
# Needs root (network namespaces, nftables); installs iproute2 and nftables
# from Debian's packages when missing, and fails, saying why, where it
# cannot make namespaces. The namespaces, the Postgres cluster and tansu
# are removed at the end, also when the soak fails.
#
# CHAOS_PROFILE=release builds and runs the optimized binaries (the long
# soak uses it: less CPU per event leaves more of two cores to tansu and
# Postgres); the default is the debug build the tests already made.
set -euo pipefail
cd "$(dirname "$0")/.."

transport=kafka keep=0
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case "${args[$i]}" in
    --transport) transport=${args[$((i + 1))]:-} ;;
    --transport=*) transport=${args[$i]#--transport=} ;;
    --keep) keep=1 ;;
  esac
done

bash tests/netns.sh check
bash tests/deps.sh
# Namespace names are short (interface and namespace names have limits)
# and unique per run, so a long soak can run beside a short one.
prefix="ox$$"
pg_stop=""
cleanup() {
  local status=$?
  if [ -n "${TANSU_NETNS:-}" ]; then
    bash tests/tansu.sh stop >/dev/null 2>&1 || true
    [ "$keep" = 1 ] || rm -rf "$TANSU_STATE_DIR"
  fi
  if [ "$keep" = 1 ] && [ -n "$pg_stop" ]; then
    echo "chaos: --keep: the Postgres cluster's files stay in $THROWAWAY_PG_DIR (stopped)" >&2
    pg_stop=${pg_stop%%; rm -rf*}
  fi
  [ -z "$pg_stop" ] || eval "$pg_stop" || true
  bash tests/netns.sh down "$prefix" || true
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
bash tests/netns.sh up "$prefix"

# Postgres in its namespace, with wal_level = logical for the WAL relay.
source tests/pg-throwaway.sh
throwaway_postgres 10.213.0.10 5432 "$prefix-pg" \
  "-c max_connections=300 -c max_replication_slots=10 -c max_wal_senders=10"
pg_stop=$THROWAWAY_PG_STOP
database_url=$THROWAWAY_PG_URL

profile=${CHAOS_PROFILE:-debug}
case "$profile" in
  debug) cargo build -q -p outboxd --bin outboxd && cargo build -q -p outboxd-bench --example chaos ;;
  release) cargo build -q --release -p outboxd --bin outboxd && cargo build -q --release -p outboxd-bench --example chaos ;;
  *) echo "CHAOS_PROFILE must be debug or release, not '$profile'" >&2; exit 2 ;;
esac
bash plugins/build.sh >/dev/null
bin=${CARGO_TARGET_DIR:-target}/$profile

kafka_args=()
if [ "$transport" = kafka ]; then
  # tansu in its namespace with storage that survives SIGKILL, advertising
  # the driver's delay proxy (10.213.0.2:19092) to every client.
  export TANSU_STATE_DIR=${CHAOS_TANSU_STATE_DIR:-/tmp/outboxd-chaos-tansu-$prefix}
  rm -rf "$TANSU_STATE_DIR"
  export TANSU_STORAGE=sqlite://tansu.db TANSU_NETNS="$prefix-kafka" TANSU_HOST=10.213.0.11 \
    TANSU_PORT=9092 TANSU_ADVERTISE=10.213.0.2:19092
  bash tests/tansu.sh install
  ip netns exec "$prefix-drv" bash tests/tansu.sh start >/dev/null
  kafka_args=(--kafka-upstream 10.213.0.11:9092)
fi

ip netns exec "$prefix-drv" "$bin/examples/chaos" --database-url "$database_url" \
  --netns "$prefix" "${kafka_args[@]}" \
  --outboxd "$bin/outboxd" --tansu-script tests/tansu.sh "$@"
