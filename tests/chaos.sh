#!/usr/bin/env bash
# The chaos soak, to show nothing is lost, duplicated or reordered when
# processes and the broker die: two relay and two consumer processes, tansu with
# durable storage, Postgres; faults for --seconds (default 100), then a
# drain and the checks. Prints one line of figures; exits non-zero when
# something was lost, duplicated or reordered.
#
#   bash tests/chaos.sh                   # the short soak .ci/run runs
#   bash tests/chaos.sh --seconds 1800    # the long soak (RELIABILITY.md)
#   bash tests/chaos.sh --seed N --keep   # replay a run, keep db and logs
#
# CHAOS_PROFILE=release builds and runs the optimized binaries (the long
# soak uses it: less CPU per event leaves more of two cores to tansu and
# Postgres); the default is the debug build the tests already made.
#
# Postgres: $OUTBOXD_TEST_DATABASE_URL (a user that may CREATE DATABASE),
# else the server on 127.0.0.1:5432.
set -euo pipefail
cd "$(dirname "$0")/.."

export OUTBOXD_TEST_DATABASE_URL=${OUTBOXD_TEST_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}
# A broker of its own, with storage that survives SIGKILL.
# CHAOS_TANSU_STATE_DIR lets a long soak run beside a short one.
export TANSU_STATE_DIR=${CHAOS_TANSU_STATE_DIR:-/tmp/outboxd-chaos-tansu}
TANSU_STATE_DIR=$TANSU_STATE_DIR bash tests/tansu.sh stop >/dev/null 2>&1 || true
rm -rf "$TANSU_STATE_DIR"
export TANSU_STORAGE=sqlite://tansu.db
eval "$(bash tests/tansu.sh start)"
trap 'bash tests/tansu.sh stop' EXIT

profile=${CHAOS_PROFILE:-debug}
case "$profile" in
  debug) cargo build -q -p outboxd --bin outboxd && cargo build -q -p outboxd-bench --example chaos ;;
  release) cargo build -q --release -p outboxd --bin outboxd && cargo build -q --release -p outboxd-bench --example chaos ;;
  *) echo "CHAOS_PROFILE must be debug or release, not '$profile'" >&2; exit 2 ;;
esac
bash plugins/build.sh >/dev/null
bin=${CARGO_TARGET_DIR:-target}/$profile
"$bin/examples/chaos" --bootstrap "$KAFKA_BOOTSTRAP" \
  --outboxd "$bin/outboxd" --tansu-script tests/tansu.sh "$@"
