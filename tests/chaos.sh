#!/usr/bin/env bash
# The chaos soak (issue 8): two relay and two consumer processes, tansu with
# durable storage, Postgres; faults for --seconds (default 100), then a
# drain and the checks. Prints one line of figures; exits non-zero when
# something was lost, duplicated or reordered.
#
#   bash tests/chaos.sh                   # the short soak .ci/run runs
#   bash tests/chaos.sh --seconds 1800    # the long soak (RELIABILITY.md)
#   bash tests/chaos.sh --seed N --keep   # replay a run, keep db and logs
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

cargo build -q -p outboxd --bin outboxd --example chaos
bash plugins/build.sh >/dev/null
bin=${CARGO_TARGET_DIR:-target}/debug
"$bin/examples/chaos" --bootstrap "$KAFKA_BOOTSTRAP" \
  --outboxd "$bin/outboxd" --tansu-script tests/tansu.sh "$@"
