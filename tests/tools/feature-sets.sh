#!/usr/bin/env bash
# Checks that every build CI makes of the workspace gives each dependency
# the same features, so each dependency compiles once.
#
# Cargo enables a dependency's features from the packages a command
# selects, and from their dev-dependencies when it builds tests, examples
# or benches. A dev-dependency that asks for one more feature of a crate the
# binaries also use (tokio's test-util, say) makes the tests' build compile
# that crate again, and every crate that depends on it: sqlx, wasmtime-wasi,
# rdkafka, outboxd itself, minutes of a CI run. The builds compared are the
# ones .ci/run and the scripts it calls make: `cargo run -p outboxd-demo`,
# `cargo nextest run --workspace`, `cargo build -p outboxd --bin outboxd`,
# `cargo build -p outboxd-bench --bin outboxd-bench` and `--example chaos`.
#
#   bash tests/tools/feature-sets.sh     # exits 1, naming what differs
set -euo pipefail
cd "$(dirname "$0")/../.."

# One line per package: "name version [features]", for the packages built
# by a command with these selection arguments (outboxd's own crates left
# out: they are built per target anyway).
features() {
  cargo tree -q --locked --prefix none -f '{p} [{f}]' "$@" |
    sed 's/ (\*)$//; s/ (proc-macro)$//' | grep -v '^outboxd' | sort -u
}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
features -e normal,build,dev --workspace >"$work/tests"
declare -A builds=(
  ["cargo run -p outboxd-demo"]="-e normal,build -p outboxd-demo"
  ["cargo build -p outboxd --bin outboxd"]="-e normal,build -p outboxd"
  ["cargo build -p outboxd-bench --bin outboxd-bench"]="-e normal,build -p outboxd-bench"
  ["cargo build -p outboxd-bench --example chaos"]="-e normal,build,dev -p outboxd-bench"
  ["cargo test -p outboxd"]="-e normal,build,dev -p outboxd"
)
status=0
for build in "${!builds[@]}"; do
  # shellcheck disable=SC2086 # the selection is several words
  features ${builds[$build]} >"$work/this"
  # A package both lists hold with other features is in the symmetric
  # difference twice; one only the tests use is in it once.
  differ=$(comm -3 "$work/this" "$work/tests" | sed 's/^\t//' | awk '{print $1" "$2}' | sort | uniq -d)
  if [ -n "$differ" ]; then
    status=1
    echo "feature-sets: \`$build\` and the tests' build (\`cargo nextest run --workspace\`) give these crates different features:" >&2
    while read -r name version; do
      echo "  $name $version" >&2
      echo "    $build: $(grep "^$name $version " "$work/this" | head -1 | sed 's/^[^[]*//')" >&2
      echo "    tests:  $(grep "^$name $version " "$work/tests" | head -1 | sed 's/^[^[]*//')" >&2
    done <<<"$differ"
  fi
done
if [ "$status" != 0 ]; then
  echo "feature-sets: so CI compiles them, and every crate that depends on them, twice." >&2
  echo "  Fix: enable the same features in the [dependencies] that need them, or drop the" >&2
  echo "  dev-dependency that turns them on (\`cargo tree -e features -i CRATE\` shows which)." >&2
  exit 1
fi
echo "feature-sets: every build gives each dependency the features the tests' build gives it" >&2
