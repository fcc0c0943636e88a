#!/usr/bin/env bash
# The dashboard in a real headless Chromium: it loads with no external
# assets, shows a dead event, and one click on "redrive" really moves it.
# Installs Debian's chromium and playwright-core (npm) when missing.
set -euo pipefail
cd "$(dirname "$0")/../.."
here=tests/dashboard

if ! command -v chromium >/dev/null 2>&1; then
  echo "==> installing Debian's chromium (needed by the dashboard test)" >&2
  if [ "$(id -u)" = 0 ]; then
    # Wait for another apt (an unattended upgrade, a parallel job) rather
    # than failing on its lock.
    apt-get -o DPkg::Lock::Timeout=600 update -qq &&
      DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq chromium >/dev/null
  else
    echo "error: chromium is not installed; run: sudo apt-get install chromium" >&2; exit 1
  fi
fi
if [ ! -d "$here/node_modules/playwright-core" ]; then
  echo "==> installing playwright-core into $here/node_modules" >&2
  (cd "$here" && npm install --no-audit --no-fund --silent playwright-core@1.64.1 >/dev/null)
fi

cargo build -q -p outboxd
bin=target/debug/outboxd
work=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
token="dashboard-test-token-42"
db="$work/dash.db"
export OUTBOXD__DATABASE__URL="sqlite://$db"
"$bin" migrate >/dev/null
"$bin" enqueue --aggregate order-7 --type order.confirmed --payload '{"order_id":"order-7"}' >/dev/null
# Make it dead, as if the relay had given up on it.
python3 - "$db" <<'PY'
import sqlite3, sys
c = sqlite3.connect(sys.argv[1])
c.execute("UPDATE outbox SET dead_at = 1, dead_reason = 'poison: schema mismatch', attempts = 10")
c.commit()
PY
OUTBOXD__ADMIN__ENABLED=true OUTBOXD__ADMIN__LISTEN="127.0.0.1:$port" OUTBOXD__ADMIN__TOKEN="$token" \
OUTBOXD__RELAY__POLL_INTERVAL_MS=50 OUTBOXD__ADMIN__SAMPLE_SECONDS=1 \
  "$bin" run >"$work/outboxd.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true; wait $pid 2>/dev/null || true; rm -rf "$work"' EXIT
for _ in $(seq 1 100); do
  curl -fs "http://127.0.0.1:$port/healthz" >/dev/null 2>&1 && break
  python3 -c "import socket,sys; socket.create_connection(('127.0.0.1',$port),1)" 2>/dev/null && break
  sleep 0.1
done

URL="http://127.0.0.1:$port/" TOKEN="$token" SHOT="${DASHBOARD_SCREENSHOT:-$work/dashboard.png}" \
  node "$here/test.mjs"

published=$(python3 -c "
import sqlite3; c = sqlite3.connect('$db')
print(c.execute('SELECT count(*) FROM outbox WHERE published_at IS NOT NULL AND dead_at IS NULL').fetchone()[0])")
if [ "$published" != 1 ]; then
  echo "dashboard test FAILED: the redriven event was not published (published=$published)" >&2
  cat "$work/outboxd.log" >&2
  exit 1
fi
echo "dashboard: 1 passed, 0 failed"
