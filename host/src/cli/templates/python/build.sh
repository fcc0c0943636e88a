#!/usr/bin/env bash
# Builds {{name}}.wasm with componentize-py {{componentize_py}} (what `outboxd
# plugin build` runs, after installing componentize-py when it is missing).
set -euo pipefail
cd "$(dirname "$0")"
componentize-py -d wit -w {{world}} componentize -p . app -o {{name}}.wasm
