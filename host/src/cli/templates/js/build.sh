#!/usr/bin/env bash
# Builds {{name}}.wasm with componentize-js (what `outboxd plugin build`
# runs, after `npm ci` when node_modules is missing).
set -euo pipefail
cd "$(dirname "$0")"
node build.mjs wit {{name}}.wasm {{world}} src/app.js
