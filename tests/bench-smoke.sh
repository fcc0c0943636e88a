#!/usr/bin/env bash
# Runs every `outboxd bench` scenario at smoke size, so the harness never
# rots. It prints numbers but asserts no timing: each benchmark fails only
# on a correctness check (every event published exactly once and in order,
# every message handled, an invoice per order) or an error.
#
#   OUTBOXD_TEST_DATABASE_URL=postgres://… [OUTBOXD_TEST_KAFKA=host:port] tests/bench-smoke.sh
#
# The full-size commands are in BENCHMARKS.md.
set -euo pipefail
cd "$(dirname "$0")/.."

: "${OUTBOXD_TEST_DATABASE_URL:?set OUTBOXD_TEST_DATABASE_URL (tests/run.sh does)}"
db=outboxd_bench_smoke
psql "$OUTBOXD_TEST_DATABASE_URL" -qc "DROP DATABASE IF EXISTS $db" >/dev/null
psql "$OUTBOXD_TEST_DATABASE_URL" -qc "CREATE DATABASE $db" >/dev/null
url="${OUTBOXD_TEST_DATABASE_URL%/*}/$db"
# The wal benchmark's slot is named after the database; one left behind by a
# failed run would block DROP DATABASE.
trap 'psql "$OUTBOXD_TEST_DATABASE_URL" -qc "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = '"'$db'"' AND NOT active" >/dev/null 2>&1 || true
      psql "$OUTBOXD_TEST_DATABASE_URL" -qc "DROP DATABASE IF EXISTS $db" >/dev/null 2>&1 || true' EXIT

export OUTBOXD_LOG=error PGOPTIONS="--client-min-messages=warning"
# The benchmarks are their own binary, outboxd-bench; `memory` measures the
# outboxd binary beside it. OUTBOXD_BENCH_BIN: an already built one (e.g.
# target/release/outboxd-bench, with target/release/outboxd next to it).
if [ -z "${OUTBOXD_BENCH_BIN:-}" ]; then
  cargo build -q -p outboxd --bin outboxd
  cargo build -q -p outboxd-bench --bin outboxd-bench
  OUTBOXD_BENCH_BIN=${CARGO_TARGET_DIR:-target}/debug/outboxd-bench
fi
bench() { "$OUTBOXD_BENCH_BIN" "$@"; }

sink=(--sink null)
if [ -n "${OUTBOXD_TEST_KAFKA:-}" ]; then
  sink=(--sink kafka --brokers "$OUTBOXD_TEST_KAFKA")
fi
# claim needs the empty database; relay, memory and drain empty the outbox first.
bench claim --url "$url" --published 20000 --pending 1000 --claims 20
bench relay --url "$url" --events 2000 --seed-events 200 --aggregates 200 \
  --batch 100 --workers 2 --pipeline false,true \
  --plugin plugins/dist/cloudevents.wasm "${sink[@]}"
bench consumer --url "$url" --plugin plugins/dist/billing.wasm \
  --messages 200 --batch 20 --partitions 2 --repeat 1
bench latency --url "$url" --rates 100 --seconds 2 --poll-ms 200
bench memory --url "$url" --backlogs 1000,4000
bench drain --url "$url" --capacity-events 1000 --warmup-seconds 1 --outage-seconds 1 \
  --load 0.5 --max-drain-seconds 20
wake_dir=$(mktemp -d)
bench sqlite-wake --db "$wake_dir/wake.db" --commits 20 --idle-seconds 1
rm -rf "$wake_dir"
bench sql-gate --iterations 200
# The WAL relay against polling (needs wal_level = logical, which tests/run.sh
# sets): latency and throughput go through Kafka, idle runs on either.
if [ -n "${OUTBOXD_TEST_KAFKA:-}" ]; then
  bench wal --url "$url" --brokers "$OUTBOXD_TEST_KAFKA" --runs 1 \
    --rate 200 --seconds 2 --backlog 2000 --aggregates 200 \
    --plugin plugins/dist/cloudevents.wasm --idle-seconds 2 --idle-settle-seconds 1
else
  bench wal --url "$url" --scenarios idle --idle-seconds 2 --idle-settle-seconds 1
fi
# The micro-benchmarks of one plugin call, each call run once (`cargo
# bench` measures them).
cargo test -q -p outboxd-bench --bench plugin_calls
