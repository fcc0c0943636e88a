#!/usr/bin/env bash
# The dashboard in a real headless Chromium, against `outboxd run` on a
# SQLite file: a file transformer, a registry consumer plugin with a
# candidate in shadow, a relay dead event and consumer dead letters (one
# key parked behind one). test.mjs checks each panel against the API, then
# clicks redrive on the relay's dead event, redrive on one consumer dead
# letter and discard on another; this script then checks in the database
# that each was applied. Installs Debian's chromium and playwright-core
# (npm) when missing.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
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
for p in redact-pii billing invoicing; do
  if [ ! -f "plugins/dist/$p.wasm" ]; then
    echo "error: plugins/dist/$p.wasm is missing; run: bash plugins/build.sh" >&2; exit 1
  fi
done

cargo build -q -p outboxd
bin=$root/target/debug/outboxd
work=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
token="dashboard-test-token-42"
db="$work/dash.db"
cfg="$work/outboxd.toml"
cat >"$cfg" <<EOF
[database]
url = "sqlite://$db"

[transport]
partitions = 2

[relay]
poll_interval = "50ms"

[[routes]]
event_type = "order.*"
topic = "orders"
transformers = ["redact-pii"]

[[plugins]]
name = "redact-pii"
path = "$root/plugins/dist/redact-pii.wasm"
version = "0.1.0"

[[plugins]]
name = "c"
source = "registry"
limits = { timeout = "2s" }

[[consumers]]
name = "billing"
topics = ["orders"]
handler = "plugin:c"
max_attempts = 2
tables = { write = ["invoices"] }

[plugin_runtime]
registry_poll = "300ms"
cache_dir = "$work/cache"

[admin]
enabled = true
listen = "127.0.0.1:$port"
token = "$token"
sample_seconds = 1
EOF
ob() { "$bin" --config "$cfg" "$@"; }
sql() { python3 - "$db" "$@" <<'PY'
import sqlite3, sys
c = sqlite3.connect(sys.argv[1], timeout=30)
for stmt in sys.argv[2:]:
    rows = c.execute(stmt).fetchall()
    c.commit()
    for r in rows:
        print("|".join("" if v is None else str(v) for v in r))
PY
}
order() { # aggregate, order id
  ob enqueue --aggregate "$1" --type order.confirmed \
    --payload "{\"order_id\":\"$2\",\"customer_id\":\"c1\",\"total_cents\":100}" >/dev/null
}

ob migrate >/dev/null
# The billing plugin's table, and a trigger that refuses the invoices of
# two orders: their messages become consumer dead letters until it goes.
sql "CREATE TABLE invoices (id INTEGER PRIMARY KEY AUTOINCREMENT, order_id TEXT NOT NULL,
       customer_id TEXT NOT NULL, amount_cents INTEGER NOT NULL, message_id TEXT NOT NULL,
       issued_at INTEGER NOT NULL)" \
    "CREATE TRIGGER refuse_poison BEFORE INSERT ON invoices WHEN NEW.order_id IN ('o-poison', 'o-poison-q')
       BEGIN SELECT RAISE(ABORT, 'invoice refused: order on hold'); END"
ob plugin deploy plugins/dist/billing.wasm --name c --activate >/dev/null
ob plugin deploy plugins/dist/invoicing.wasm --name c >/dev/null
ob plugin shadow c 2 >/dev/null

# The relay's dead event: the first row, dead as if the relay had given up.
order order-7 o-7
sql "UPDATE outbox SET dead_at = 1, dead_reason = 'poison: schema mismatch', attempts = 10 WHERE aggregate_id = 'order-7'"
for i in 1 2 3 4; do order "order-$i" "o-$i"; done
order order-p o-poison   # dead letter; parks key order-p
order order-p o-p2       # parked behind it
order order-q o-poison-q # dead letter (parks key order-q), to be discarded

# The binary itself in the background (not through `ob`), so $! is its pid
# and the trap stops it.
"$bin" --config "$cfg" run >"$work/outboxd.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true; wait $pid 2>/dev/null || true; rm -rf "$work"' EXIT
fail() { echo "dashboard test FAILED: $1" >&2; tail -n 40 "$work/outboxd.log" >&2; exit 1; }
api() { curl -fsS -H "Authorization: Bearer $token" "http://127.0.0.1:$port$1"; }
# Waits until the JSON of $1 satisfies the Python expression $2 (over `j`).
wait_for() {
  for _ in $(seq 1 300); do
    if api "$1" 2>/dev/null | python3 -c "import json,sys; j=json.load(sys.stdin); sys.exit(0 if ($2) else 1)" 2>/dev/null; then
      return 0
    fi
    sleep 0.1
  done
  echo "dashboard test FAILED: $1 never satisfied: $2" >&2
  api "$1" >&2 || true
  tail -n 40 "$work/outboxd.log" >&2
  exit 1
}
billing="[c for c in j if c['name'] == 'billing'][0]"
wait_for /api/consumers "$billing['processed_total'] == 4 and $billing['dead_letters'] == 2 and $billing['parked_keys'] == 2 and $billing['parked_messages'] == 1"
# A redelivery, as a relay killed between publish and mark makes: the
# inbox drops it.
sql "INSERT INTO transport_messages (topic, partition, message_key, payload, headers, message_id, published_at)
       SELECT topic, partition, message_key, payload, headers, message_id, published_at FROM transport_messages
        WHERE message_key = CAST('order-1' AS BLOB)"
wait_for /api/consumers "$billing['duplicates_total'] == 1 and $billing['lag'] == 0 and $billing['processed_per_second'] == 0"
# The shadow counters reach the registry at the rollout's next refresh.
wait_for /api/plugins "[p for p in j if p['name'] == 'c' and p['version'] == 2][0]['shadow_stats']['matches'] >= 4"
# The cause is fixed: the dead letters can now be applied.
sql "DROP TRIGGER refuse_poison"
# The first record of a key is its dead letter; later ones are parked.
first_of() { sql "SELECT min(id) FROM consumer_dead_letters WHERE consumer = 'billing' AND message_key = CAST('$1' AS BLOB)"; }
dead_id=$(first_of order-p)
discard_id=$(first_of order-q)
[ -n "$dead_id" ] && [ -n "$discard_id" ] || fail "no consumer dead letters for keys order-p and order-q"

URL="http://127.0.0.1:$port/" TOKEN="$token" SHOT="${DASHBOARD_SCREENSHOT:-$work/dashboard.png}" \
  REDRIVE_ID="$dead_id" DISCARD_ID="$discard_id" node "$here/test.mjs"

published=$(sql "SELECT count(*) FROM outbox WHERE published_at IS NOT NULL AND dead_at IS NULL AND aggregate_id = 'order-7'")
[ "$published" = 1 ] || fail "the redriven event was not published (published=$published)"
# The redriven dead letter and the message parked behind it were applied,
# once each and in order; the discarded one never was.
applied=""
for _ in $(seq 1 150); do
  applied=$(sql "SELECT group_concat(order_id, ',') FROM (SELECT order_id FROM invoices
                  WHERE order_id IN ('o-poison', 'o-p2', 'o-poison-q') ORDER BY id)")
  [ "$applied" = "o-poison,o-p2" ] && break
  sleep 0.1
done
[ "$applied" = "o-poison,o-p2" ] || fail "after redrive the invoices of key order-p are '$applied', want 'o-poison,o-p2'"
resolution=$(sql "SELECT resolution FROM consumer_dead_letters WHERE id = $dead_id")
[ "$resolution" = applied ] || fail "dead letter $dead_id is resolved as '$resolution', want 'applied'"
resolution=$(sql "SELECT resolution || ':' || resolve_reason FROM consumer_dead_letters WHERE id = $discard_id")
[ "$resolution" = "discarded:fixed by hand in billing" ] || fail "dead letter $discard_id is '$resolution', want discarded with its reason"
inbox=$(sql "SELECT count(*) FROM inbox WHERE consumer = 'billing'")
echo "dashboard: 1 passed, 0 failed (inbox rows of billing: $inbox)"
