#!/usr/bin/env bash
# The whole benchmark suite at full size, one command:
#
#   bash tests/bench-all.sh [OUT_DIR]        # default OUT_DIR: bench-results/
#
# Builds the release binary and the plugins, starts tansu (tests/tansu.sh)
# and uses the Postgres on 127.0.0.1:5432 (or $OUTBOXD_TEST_DATABASE_URL),
# then runs every scenario at the sizes its targets are stated for: the relay grid
# (100,000 events over 2,000 aggregates, batch 50/100/500 x workers 1/2/4,
# without and with the cloudevents plugin, through tansu) with a sequential
# poll-and-mark relay in the same run, claim latency with 5 million published rows,
# end-to-end latency at 100/1,000/5,000 events/s with NOTIFY and polling,
# consumer throughput, peak RSS under a 100,000-event backlog, backlog and
# drain after an outage, and the criterion micro-benchmarks. Tables go to
# the terminal and to OUT_DIR/*.txt, JSON to OUT_DIR/*.json. Every scenario
# checks its own correctness and fails the script if it does not hold; no
# timing is asserted. On the 2-core CI machine kind this takes on the order
# of an hour; tests/bench-smoke.sh runs the same commands at smoke size.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench-results}
mkdir -p "$out"

base=${OUTBOXD_TEST_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}
db=outboxd_bench_all
psql "$base" -qc "DROP DATABASE IF EXISTS $db" >/dev/null
psql "$base" -qc "CREATE DATABASE $db" >/dev/null
url="${base%/*}/$db"

bash plugins/build.sh
cargo build --release -p outboxd -p outboxd-bench
eval "$(bash tests/tansu.sh start)"
bin=target/release/outboxd-bench
export OUTBOXD_LOG=error PGOPTIONS="--client-min-messages=warning"

run() {
  local name=$1; shift
  printf '\n==> %s: %s\n' "$name" "$*"
  "$bin" "$@" | tee "$out/$name.txt"
}

# claim needs the empty database; the others empty the outbox first.
run claim claim --url "$url"
psql "$base" -qc "DROP DATABASE IF EXISTS $db" >/dev/null
psql "$base" -qc "CREATE DATABASE $db" >/dev/null
run relay relay --url "$url" --sink kafka --brokers "$KAFKA_BOOTSTRAP" \
  --plugin plugins/dist/cloudevents.wasm --seed-events 20000 --json "$out/relay.json"
run consumer consumer --url "$url" --plugin plugins/dist/billing.wasm --partitions 1 --repeat 5
run consumer-4 consumer --url "$url" --plugin plugins/dist/billing.wasm --partitions 4 --repeat 3
run latency latency --url "$url" --json "$out/latency.json"
run memory memory --url "$url"
run drain drain --url "$url" --json "$out/drain.json"
printf '\n==> criterion: cargo bench -p outboxd-bench --bench plugin_calls\n'
cargo bench -p outboxd-bench --bench plugin_calls | tee "$out/plugin_calls.txt"
psql "$base" -qc "DROP DATABASE IF EXISTS $db" >/dev/null
echo "bench-all: results in $out/"
