#!/usr/bin/env bash
# The six scaffolds (transformer and consumer, in Rust, Python and
# JavaScript): each is created by `outboxd plugin new` in a temporary
# directory outside the repository, built by `outboxd plugin build`, and
# must pass its own `outboxd plugin test --expect expected.json`.
#
# Kept fast by reusing what plugins/build.sh already installed or built:
# the Rust scaffolds share one CARGO_TARGET_DIR (plugins/target/scaffolds),
# the JavaScript ones link plugins/js-tag/node_modules (so `npm ci` is not
# repeated), and `plugin test` uses the compiled-component cache. Run
# plugins/build.sh first (tests/run.sh does).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
start=$(date +%s)

cargo build -q -p outboxd --bin outboxd
outboxd="${CARGO_TARGET_DIR:-$repo/target}/debug/outboxd"
if [[ ! -d plugins/js-tag/node_modules/@bytecodealliance/componentize-js ]]; then
  echo "tests/scaffolds.sh: plugins/js-tag/node_modules is missing: run bash plugins/build.sh first" >&2
  exit 1
fi

work=$(mktemp -d /tmp/outboxd-scaffolds.XXXXXX)
trap 'rm -rf "$work"' EXIT
export CARGO_TARGET_DIR="$repo/plugins/target/scaffolds"

failed=()
for lang in rust python js; do
  for world in transformer consumer; do
    name="sc-$lang-$world"
    t0=$(date +%s)
    "$outboxd" plugin new "$name" --world "$world" --lang "$lang" --dir "$work" >/dev/null
    dir="$work/$name"
    [[ $lang == js ]] && ln -s "$repo/plugins/js-tag/node_modules" "$dir/node_modules"
    if ! "$outboxd" plugin build "$dir" >"$dir/build.log" 2>&1; then
      echo "FAIL $name: outboxd plugin build" >&2
      tail -30 "$dir/build.log" >&2
      failed+=("$name")
      continue
    fi
    # The README's command line, run as written in the project directory.
    cmd=$(grep -m1 '^    outboxd plugin test ' "$dir/README.md" | sed 's/^ *outboxd //')
    if ! (cd "$dir" && eval "\"$outboxd\" $cmd") >"$dir/test.log" 2>&1; then
      echo "FAIL $name: outboxd $cmd" >&2
      cat "$dir/test.log" >&2
      failed+=("$name")
      continue
    fi
    echo "ok   $name ($(( $(date +%s) - t0 )) s)"
  done
done
echo "scaffolds: $(( 6 - ${#failed[@]} ))/6 passed in $(( $(date +%s) - start )) s"
[[ ${#failed[@]} -eq 0 ]]
