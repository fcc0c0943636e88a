#!/usr/bin/env bash
# Starts a throwaway tansu broker (Kafka-compatible) on a free loopback port
# for the Kafka integration tests, and prints KAFKA_BOOTSTRAP=127.0.0.1:PORT.
#
#   tests/tansu.sh              start (or report the one already running)
#   tests/tansu.sh stop         stop it
#   tests/tansu.sh kill         SIGKILL it (the chaos soak's broker fault)
#   tests/tansu.sh restart      stop it and start it again on the same port
#   tests/tansu.sh install      only install it (needs the crate registry)
#
# Storage is ${TANSU_STORAGE:-sqlite://tansu.db}, a file in the state dir, so
# that a killed broker keeps what it acknowledged, as a real Kafka cluster
# would (the chaos soak kills it).
#
# Not memory:// by default: tansu 0.6.0's memory engine answers a fetch whose
# offset falls inside a stored batch by skipping that whole batch. librdkafka
# fetches from mid-batch offsets whenever a consumer resumes a paused
# partition, so a consumer 1,000 messages behind (outboxd pauses a partition
# whose buffer is full) saw offsets jump, e.g. 1,008 arriving where 1,001 was
# due, and librdkafka's debug log showed it asking for the right offset. The
# sqlite engine answers the same fetches in full
# (tests/integration/kafka/consumers.rs: *_reads_a_long_backlog_in_full_fetches_*).
# memory:// remains available (TANSU_STORAGE=memory://tansu/) for benchmarks
# that never pause a partition.
#
# tansu is installed once per machine into ${TANSU_ROOT} with the
# `dynostore` (memory://) and `libsql` (sqlite://) storage engines.
#
# Then: OUTBOXD_TEST_KAFKA=127.0.0.1:PORT cargo test --test integration kafka
#
# State lives in ${TANSU_STATE_DIR:-/tmp/outboxd-tansu}: pid, port and log.
#
# The chaos soak runs tansu inside a network namespace of its own:
# TANSU_NETNS=NAME starts it there (through `ip netns exec`), listening on
# TANSU_HOST:TANSU_PORT and advertising TANSU_ADVERTISE (host:port, the
# soak's delay proxy) to clients.
set -euo pipefail

TANSU_VERSION=0.6.0
STATE_DIR=${TANSU_STATE_DIR:-/tmp/outboxd-tansu}
TANSU_ROOT=${TANSU_ROOT:-$HOME/.cache/outboxd/tansu-$TANSU_VERSION}
TANSU_FEATURES=dynostore,libsql
STORAGE=${TANSU_STORAGE:-sqlite://tansu.db}
INSTALL_LOG=/tmp/tansu-install.log
HOST=${TANSU_HOST:-127.0.0.1}
NETNS=${TANSU_NETNS:-}
in_netns=()
[[ -z "$NETNS" ]] || in_netns=(ip netns exec "$NETNS")
mkdir -p "$STATE_DIR"
STATE_DIR=$(cd "$STATE_DIR" && pwd)

# Only our own install counts: a tansu elsewhere on PATH may lack libsql.
find_tansu() {
  if [[ -x "$TANSU_ROOT/bin/tansu" ]]; then
    echo "$TANSU_ROOT/bin/tansu"
  else
    return 1
  fi
}

ensure_tansu() {
  local bin
  if bin=$(find_tansu); then
    echo "$bin"
    return
  fi
  # Another `cargo install tansu` may already be running; wait for it rather
  # than starting a second build of the same crate.
  if pgrep -f "cargo install tansu" >/dev/null 2>&1; then
    echo "waiting for the running 'cargo install tansu' (see $INSTALL_LOG)" >&2
    while pgrep -f "cargo install tansu" >/dev/null 2>&1; do sleep 5; done
    if bin=$(find_tansu); then
      echo "$bin"
      return
    fi
    echo "the running install finished without a tansu binary; see $INSTALL_LOG" >&2
  fi
  echo "installing tansu $TANSU_VERSION (several minutes)" >&2
  cargo install tansu --version "$TANSU_VERSION" --locked --features "$TANSU_FEATURES" \
    --root "$TANSU_ROOT" >&2
  find_tansu
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

is_running() {
  [[ -f "$STATE_DIR/pid" ]] && kill -0 "$(cat "$STATE_DIR/pid")" 2>/dev/null
}

accepts() {
  (exec 3<>"/dev/tcp/$HOST/$1") 2>/dev/null
}

stop() {
  if is_running; then
    local pid
    pid=$(cat "$STATE_DIR/pid")
    kill "$pid"
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
  fi
  rm -f "$STATE_DIR/pid"
}

# tansu 0.6.0's SQLite schema has no index on its `header` table, so every
# fetched record scans all the headers ever written: 15 ms a record at
# 28,000 records, growing with the topic, until a consumer's fetches take
# the broker's whole CPU (that is what stalled the 30-minute soak). The
# index makes it 0.02 ms. tansu creates its tables at startup, so this runs
# once it answers; IF NOT EXISTS makes it free after the first time.
index_headers() {
  case "$STORAGE" in
    sqlite://*) ;;
    *) return 0 ;;
  esac
  local file="$STATE_DIR/${STORAGE#sqlite://}"
  python3 - "$file" <<'PY' >&2
import sqlite3, sys
db = sqlite3.connect(sys.argv[1], timeout=30)
db.execute("CREATE INDEX IF NOT EXISTS outboxd_header_by_record ON header (topition, offset_id)")
db.commit()
PY
}

start() {
  local port=${1:-} bin
  bin=$(ensure_tansu)
  if is_running; then
    echo "KAFKA_BOOTSTRAP=$HOST:$(cat "$STATE_DIR/port")"
    return
  fi
  [[ -n "$port" ]] || port=${TANSU_PORT:-$(free_port)}
  local advertise=${TANSU_ADVERTISE:-$HOST:$port}
  # sqlite:// paths are relative to tansu's working directory: the state dir.
  (cd "$STATE_DIR" && exec "${in_netns[@]}" "$bin" broker \
    --listener-url "tcp://$HOST:$port" \
    --advertised-listener-url "tcp://$advertise" \
    --storage-engine "$STORAGE" \
    >>"$STATE_DIR/log" 2>&1) &
  echo $! >"$STATE_DIR/pid"
  echo "$port" >"$STATE_DIR/port"
  for _ in $(seq 100); do
    if accepts "$port"; then
      index_headers
      echo "KAFKA_BOOTSTRAP=$HOST:$port"
      return
    fi
    if ! is_running; then
      echo "tansu exited; last lines of $STATE_DIR/log:" >&2
      tail -20 "$STATE_DIR/log" >&2
      exit 1
    fi
    sleep 0.1
  done
  echo "tansu did not accept connections on $HOST:$port within 10 s; see $STATE_DIR/log" >&2
  stop
  exit 1
}

case "${1:-start}" in
  start) start ;;
  install) ensure_tansu >/dev/null ;;
  stop) stop ;;
  kill)
    if is_running; then kill -9 "$(cat "$STATE_DIR/pid")"; fi
    rm -f "$STATE_DIR/pid"
    ;;
  restart)
    port=$(cat "$STATE_DIR/port" 2>/dev/null || true)
    stop
    start "$port"
    ;;
  *)
    echo "usage: $0 [start|stop|kill|restart|install]" >&2
    exit 2
    ;;
esac
