#!/usr/bin/env bash
# Checks docs/alerts.yml with promtool (from Debian's prometheus package,
# unpacked without installing the server) and runs the rule unit tests.
set -euo pipefail
cd "$(dirname "$0")/../.."
promtool=$(command -v promtool || true)
if [ -z "$promtool" ]; then
  cache=${XDG_CACHE_HOME:-$HOME/.cache}/outboxd/promtool
  promtool="$cache/usr/bin/promtool"
  if [ ! -x "$promtool" ]; then
    echo "==> fetching promtool from Debian's prometheus package" >&2
    mkdir -p "$cache"
    (cd "$cache" && { apt-get download prometheus >/dev/null 2>&1 || { apt-get update -qq && apt-get download prometheus >/dev/null; }; } \
      && dpkg -x prometheus_*.deb . && rm -f prometheus_*.deb)
  fi
fi
"$promtool" check rules docs/alerts.yml
"$promtool" test rules tests/alerts/alerts_test.yml
echo "alerts: 1 passed, 0 failed"
