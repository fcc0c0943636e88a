#!/usr/bin/env bash
# Builds every plugin from source into plugins/dist/*.wasm (components).
# Rust plugins: cargo, wasm32-wasip2 (added by wasm-target.sh when
# missing), release. Python: componentize-py
# 0.25.1 (pip install componentize-py==0.25.1), with the helper modules of
# guest-sdk/python; skipped only when PLUGINS_SKIP_PYTHON=1. JavaScript:
# componentize-js 0.18.5 from npm (plugins/js-tag/package-lock.json), with
# the helper modules of guest-sdk/js; skipped only when PLUGINS_SKIP_JS=1.
set -euo pipefail
cd "$(dirname "$0")"
export CARGO_TARGET_DIR="$PWD/target"
dist="$PWD/dist"
mkdir -p "$dist"

source ./wasm-target.sh
ensure_wasm_target
cargo build --release --target wasm32-wasip2 --workspace
for crate in cloudevents redact-pii route-by-amount hostile-spin hostile-memory-bomb \
    hostile-panic hostile-huge-output hostile-escape billing invoicing \
    hostile-consumer-sql hostile-consumer-loop hostile-consumer-trap \
    hostile-misbehave hostile-consumer-misbehave hostile-consumer-attack hostile-consumer-http hostile-transformer-http ledger charge; do
  cp "$CARGO_TARGET_DIR/wasm32-wasip2/release/${crate//-/_}.wasm" "$dist/$crate.wasm"
done
# The chaos soak's second consumer version (same effect, another writer),
# in a target dir of its own so the two builds never overwrite each other.
CARGO_TARGET_DIR="$PWD/target/v2" cargo build --release --target wasm32-wasip2 -p ledger --features v2
cp "$PWD/target/v2/wasm32-wasip2/release/ledger.wasm" "$dist/ledger-v2.wasm"
# The fix-forward tests' transformer: v1 dead-letters an amount written as
# text, v2 (the fix) reads it.
cp "$CARGO_TARGET_DIR/wasm32-wasip2/release/amount_cents.wasm" "$dist/amount-cents.wasm"
CARGO_TARGET_DIR="$PWD/target/v2" cargo build --release --target wasm32-wasip2 -p amount-cents --features v2
cp "$PWD/target/v2/wasm32-wasip2/release/amount_cents.wasm" "$dist/amount-cents-v2.wasm"

if [[ "${PLUGINS_SKIP_PYTHON:-0}" != 1 ]]; then
  if ! command -v componentize-py >/dev/null; then
    echo "plugins/build.sh: installing componentize-py 0.25.1 from PyPI" >&2
    python3 -m pip install --quiet componentize-py==0.25.1 >&2 || {
      echo "plugins/build.sh: cannot install componentize-py; run: pip install componentize-py==0.25.1" >&2
      exit 1
    }
  fi
  # componentize-py takes ~25 s: rebuild only when the source, the helper
  # modules (guest-sdk/python) or the WIT changed.
  py_plugin() { # name world
    local out="$dist/$1.wasm" newer
    newer=$(find "$1" ../guest-sdk/python ../wit -newer "$out" -type f 2>/dev/null | head -1 || true)
    if [[ ! -f "$out" || -n "$newer" ]]; then
      (cd "$1" && componentize-py -d ../../wit -w "$2" componentize -p . -p ../../guest-sdk/python app -o "$out.tmp" >/dev/null)
      mv "$out.tmp" "$out"
    fi
  }
  py_plugin python-tag transformer
  py_plugin py-ledger consumer
  # The Python billing consumer, for `outboxd bench consumer` (same effect as
  # plugins/billing).
  py_plugin py-billing consumer
fi
if [[ "${PLUGINS_SKIP_JS:-0}" != 1 ]]; then
  # JavaScript: componentize-js from npm (pinned by js-tag/package-lock.json),
  # installed once into js-tag/node_modules; the build itself is offline.
  if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    echo "plugins/build.sh: node and npm are needed for plugins/js-tag (Debian: apt-get install nodejs npm), or set PLUGINS_SKIP_JS=1" >&2
    exit 1
  fi
  # The marker is written only after `npm ci` succeeded, so an install that
  # was interrupted half-way is redone (npm ci starts from scratch).
  installed=js-tag/node_modules/.outboxd-installed
  if [[ ! -f "$installed" || js-tag/package-lock.json -nt "$installed" ]]; then
    echo "plugins/build.sh: installing componentize-js from npm (js-tag/package-lock.json)" >&2
    (cd js-tag && npm ci --no-audit --no-fund >&2) || {
      echo "plugins/build.sh: cannot install componentize-js; run: (cd plugins/js-tag && npm ci)" >&2
      exit 1
    }
    touch "$installed"
  fi
  # One install (js-tag/node_modules) builds every JavaScript plugin; the
  # helper modules of guest-sdk/js are staged next to each source.
  js_plugin() { # name world
    local out="$dist/$1.wasm" newer
    newer=$(find "$1/src" ../guest-sdk/js ../wit js-tag/build.mjs -newer "$out" -type f 2>/dev/null | head -1 || true)
    if [[ ! -f "$out" || -n "$newer" ]]; then
      node js-tag/build.mjs ../wit "$out" "$2" "$1/src/app.js" ../guest-sdk/js >/dev/null
    fi
  }
  js_plugin js-tag transformer
  js_plugin js-ledger consumer
  js_plugin js-billing consumer
  js_plugin js-charge consumer-http
fi
ls -l "$dist"
