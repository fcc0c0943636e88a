#!/usr/bin/env bash
# Runs every fuzz target for a bounded time and fails if any finds a crash,
# a panic, a failed property or a hang.
#
#   bash fuzz/run.sh                 # every target, 60 s each
#   FUZZ_SECONDS=30 bash fuzz/run.sh sql_guard config_parse
#   FUZZ_BUILD_ONLY=1 bash fuzz/run.sh  # install cargo-fuzz and build, no run
#
# cargo-fuzz (libFuzzer) is installed when missing. Targets build on the
# pinned stable toolchain with `-s none` (no sanitizer: AddressSanitizer
# needs nightly, and the targets are safe Rust; libFuzzer's coverage
# instrumentation works on stable). The committed seeds in
# fuzz/corpus/<target>/ are read, never written: new inputs go to a
# temporary directory, and a finding is saved in fuzz/artifacts/<target>/
# (add it to the corpus once the bug is fixed). The targets depend only on
# outboxd-core (host/core), which links neither wasmtime, cranelift nor
# librdkafka, so the instrumented build is sqlx, SQLite, serde and toml.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${FUZZ_SECONDS:-60}
# Never the host workspace's target dir (an inherited CARGO_TARGET_DIR):
# the instrumented build has different flags and would rebuild everything.
export CARGO_TARGET_DIR="$PWD/fuzz/target"

if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "fuzz/run.sh: installing cargo-fuzz" >&2
  cargo install cargo-fuzz --locked >&2
fi

targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  mapfile -t targets < <(cargo fuzz list --fuzz-dir fuzz)
fi

start=$(date +%s)
# One build for every target; the first compiles outboxd-core's
# dependency tree with coverage instrumentation (minutes), later ones only
# what changed.
cargo fuzz build --fuzz-dir fuzz -s none
echo "fuzz/run.sh: build took $(( $(date +%s) - start )) s" >&2
if [ "${FUZZ_BUILD_ONLY:-0}" = 1 ]; then
  exit 0
fi

failed=()
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for t in "${targets[@]}"; do
  mkdir -p "$work/$t" "fuzz/artifacts/$t"
  log="$work/$t.log"
  echo "==> fuzz $t for ${seconds}s" >&2
  if cargo fuzz run --fuzz-dir fuzz -s none "$t" "$work/$t" "fuzz/corpus/$t" -- \
      -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 \
      -artifact_prefix="fuzz/artifacts/$t/" -print_final_stats=1 >"$log" 2>&1; then
    runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo '?')
    echo "    ok: $runs executions in ${seconds}s, corpus $(ls "$work/$t" | wc -l) new inputs" >&2
  else
    failed+=("$t")
    tail -40 "$log" >&2
    echo "    FAILED: $t (input saved in fuzz/artifacts/$t/)" >&2
  fi
done

if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz/run.sh: findings in: ${failed[*]}" >&2
  exit 1
fi
echo "fuzz/run.sh: no findings in ${#targets[@]} targets" >&2
