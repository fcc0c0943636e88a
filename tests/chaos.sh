#!/usr/bin/env bash
# The chaos soak, to show nothing is lost, duplicated or reordered when
# processes, the broker and the network fail: two relay and two consumer
# processes, a Postgres and the broker with durable storage (tansu for
# Kafka, nats-server for NATS, a RabbitMQ node for RabbitMQ; none for the
# embedded transport), each in a
# network namespace of its own (tests/netns.sh); faults for --seconds
# (default 100), then a drain and the checks. Prints one line of figures
# and the network faults by kind; exits non-zero when something was lost,
# duplicated or reordered.
#
#   bash tests/chaos.sh                   # the short soak .ci/run runs
#   bash tests/chaos.sh --seconds 1800    # a long soak
#   bash tests/chaos.sh --transport embedded --consumers group
#   bash tests/chaos.sh --transport nats       # group consumers (the default)
#   bash tests/chaos.sh --transport rabbitmq
#   bash tests/chaos.sh --relay-source wal
#   bash tests/chaos.sh --seed N --keep   # replay a run, keep db and logs
#   bash tests/chaos.sh --consumers group --churn 1-4s --seconds 300 --rate 100
#       # restart a consumer process every 1-4 s (with the same
#       # instance id; --no-static-membership for dynamic members), the only
#       # fault unless --with-faults adds the others, and
#       # print handled_during_churn= and arrivals_during_churn=
#
# Faults: SIGKILLs of every outboxd process, the broker SIGKILLed and
# started again on the same storage (Kafka, NATS, RabbitMQ: broker_kills=),
# pg_terminate_backend, two plugin hot swaps, and network faults between
# each process and Postgres or the broker: partitions shorter and longer
# than publish_timeout and packet loss (nftables drop rules), delay,
# jitter and hung connections (the driver's TCP proxy).
#
# The brokers are the soak's own servers in the PREFIX-kafka namespace
# (10.213.0.11), never the machine's shared ones (127.0.0.1:4222 and
# 127.0.0.1:5672 are not touched), reached by every process through the
# driver's proxy (10.213.0.2:19092), so the network faults hit the broker
# links as they do on Kafka:
# - NATS (--transport nats): `nats-server -js` with a file store in a state
#   dir (tests/broker-node.sh); the kills are SIGKILL of the server, the
#   restart on the same store and port.
# - RabbitMQ (--transport rabbitmq): a second RabbitMQ node of the soak's
#   own, not the shared one (tests/broker-node.sh: rabbit@localhost on the
#   namespace's loopback with its own epmd, cookie, Mnesia and quorum-queue
#   data, guest allowed from the proxy); the kills are SIGKILL of the
#   Erlang VM and its helpers (a node crash), the restart on the same data
#   (about 5 s on an idle machine, 4-35 s while the soak loads both cores).
#   Real broker restarts, not only connection faults.
# A restart runs beside the fault plan (the driver prints when the broker
# is back and how long it took) and is waited for before the drain, so a
# slow one can stretch the fault phase (seconds=) past --seconds.
# Both run with four partitions (a stream with subjects TOPIC.0-3; an
# exchange with quorum queues TOPIC.0-3) and one consumer group, `ledger`,
# in both consumer processes: one group per topic, as RabbitMQ requires
# (outboxd refuses two [[consumers]] on one RabbitMQ topic), so no consumer
# had to be moved or dropped. Their consumers are group members
# (--consumers group, the default there; static is Kafka only): NATS
# through leases in Postgres, RabbitMQ through single-active-consumer
# queues.
#
# Needs root (network namespaces, nftables); installs iproute2 and nftables
# from Debian's packages when missing, and fails, saying why, where it
# cannot make namespaces. The namespaces, the Postgres cluster and the
# broker (with its storage) are removed at the end, also when the soak
# fails.
#
# CHAOS_OUTBOXD_LOG=FILTER sets the outboxd processes' log filter (default
# warn) for a post-mortem with --keep, e.g. warn,outboxd::broker=debug.
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
case "$transport" in
  kafka | embedded) ;;
  nats) command -v nats-server >/dev/null ||
    { echo "chaos: --transport nats needs nats-server (apt-get install nats-server)" >&2; exit 2; } ;;
  rabbitmq) [ -x /usr/lib/rabbitmq/bin/rabbitmq-server ] ||
    { echo "chaos: --transport rabbitmq needs rabbitmq-server (apt-get install rabbitmq-server)" >&2; exit 2; } ;;
  *) echo "chaos: --transport must be kafka, embedded, nats or rabbitmq, not '$transport'" >&2; exit 2 ;;
esac

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
  if [ -n "${BROKER_NETNS:-}" ]; then
    bash tests/broker-node.sh stop >/dev/null 2>&1 || true
    [ "$keep" = 1 ] || rm -rf "$BROKER_STATE_DIR"
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

broker_args=()
if [ "$transport" = kafka ]; then
  # tansu in its namespace with storage that survives SIGKILL, advertising
  # the driver's delay proxy (10.213.0.2:19092) to every client.
  export TANSU_STATE_DIR=${CHAOS_TANSU_STATE_DIR:-/tmp/outboxd-chaos-tansu-$prefix}
  rm -rf "$TANSU_STATE_DIR"
  export TANSU_STORAGE=sqlite://tansu.db TANSU_NETNS="$prefix-kafka" TANSU_HOST=10.213.0.11 \
    TANSU_PORT=9092 TANSU_ADVERTISE=10.213.0.2:19092
  bash tests/tansu.sh install
  ip netns exec "$prefix-drv" bash tests/tansu.sh start >/dev/null
  broker_args=(--broker-upstream 10.213.0.11:9092 --broker-script tests/tansu.sh)
elif [ "$transport" = nats ] || [ "$transport" = rabbitmq ]; then
  # The soak's own server in its namespace, storage that survives SIGKILL.
  export BROKER_KIND=$transport BROKER_NETNS="$prefix-kafka" BROKER_HOST=10.213.0.11
  export BROKER_STATE_DIR=${CHAOS_BROKER_STATE_DIR:-/tmp/outboxd-chaos-$transport-$prefix}
  if [ "$transport" = nats ]; then export BROKER_PORT=4222; else export BROKER_PORT=5672; fi
  rm -rf "$BROKER_STATE_DIR"
  ip netns exec "$prefix-drv" bash tests/broker-node.sh start >/dev/null
  broker_args=(--broker-upstream "$BROKER_HOST:$BROKER_PORT" --broker-script tests/broker-node.sh)
fi

ip netns exec "$prefix-drv" "$bin/examples/chaos" --database-url "$database_url" \
  --netns "$prefix" "${broker_args[@]}" \
  --outboxd "$bin/outboxd" "$@"
