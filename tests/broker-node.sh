#!/usr/bin/env bash
# A throwaway NATS JetStream server or RabbitMQ node of the chaos soak's
# own (tests/chaos.sh --transport nats|rabbitmq), in a network namespace,
# with durable storage in a state dir, so the soak can SIGKILL it and start
# it again on the same data, as tests/tansu.sh does for tansu. Never the
# machine's shared servers (127.0.0.1:4222, 127.0.0.1:5672): those are left
# alone.
#
#   tests/broker-node.sh start      start it (or report the one running)
#   tests/broker-node.sh kill       SIGKILL it (the soak's broker fault)
#   tests/broker-node.sh restart    stop what is left and start it again
#   tests/broker-node.sh stop       stop it (SIGTERM, then SIGKILL)
#
# Settings (environment):
#   BROKER_KIND       nats or rabbitmq
#   BROKER_NETNS      the namespace it runs in (tests/netns.sh's PREFIX-kafka);
#                     it must run nothing else: kill and stop signal every
#                     process in it
#   BROKER_HOST       the address it listens on there (10.213.0.11)
#   BROKER_PORT       its client port (default 4222 NATS, 5672 RabbitMQ)
#   BROKER_STATE_DIR  store, logs and pid (default /tmp/outboxd-broker-KIND)
#
# NATS: `nats-server -js -sd STATE/store -a HOST -p PORT` (file storage);
# it starts again on the same store in well under a second.
#
# RabbitMQ: a second node, `rabbit@localhost` inside the namespace (the
# namespace's own loopback, so its epmd on 127.0.0.1:4369 and distribution
# port 25672 never meet the machine's node), run as root from
# /usr/lib/rabbitmq/bin/rabbitmq-server with its own cookie (HOME), Mnesia
# and quorum-queue data (RABBITMQ_MNESIA_BASE), logs, no plugins, and a
# config file listening on HOST:PORT only, with `loopback_users = none` so
# guest may log in from the soak's proxy. RABBITMQ_CONF_ENV_FILE points at
# an empty file, so /etc/rabbitmq/rabbitmq-env.conf (the shared node's
# name and addresses) does not apply. A kill is SIGKILL of every process in
# the namespace but epmd (the Erlang VM, its port programs, the wrapper
# script): the node crashes; the restart recovers its quorum queues from
# their write-ahead log. Starting takes about 5 s on an idle machine (most
# of it RabbitMQ's own boot: feature flags, the Mnesia schema) and up to
# 35 s while the soak keeps both cores busy; `start` waits up to
# BROKER_START_WAIT seconds (default 120) for the port.
set -euo pipefail

KIND=${BROKER_KIND:-}
NETNS=${BROKER_NETNS:-}
HOST=${BROKER_HOST:-10.213.0.11}
case "$KIND" in
  nats) PORT=${BROKER_PORT:-4222} ;;
  rabbitmq) PORT=${BROKER_PORT:-5672} ;;
  *) echo "broker-node.sh: BROKER_KIND must be nats or rabbitmq, not '$KIND'" >&2; exit 2 ;;
esac
[ -n "$NETNS" ] || { echo "broker-node.sh: set BROKER_NETNS (the namespace it runs in)" >&2; exit 2; }
STATE_DIR=${BROKER_STATE_DIR:-/tmp/outboxd-broker-$KIND}
mkdir -p "$STATE_DIR"
STATE_DIR=$(cd "$STATE_DIR" && pwd)
LOG=$STATE_DIR/log
START_WAIT=${BROKER_START_WAIT:-120}
RABBIT_BIN=/usr/lib/rabbitmq/bin/rabbitmq-server

die() { echo "broker-node.sh: $*" >&2; exit 1; }

# The namespace's processes, but epmd (which outlives a node's crash).
node_pids() {
  local p
  for p in $(ip netns pids "$NETNS" 2>/dev/null || true); do
    [ "$(cat "/proc/$p/comm" 2>/dev/null)" = epmd ] || echo "$p"
  done
}

is_running() { [ -n "$(node_pids)" ]; }

# Whether the port accepts, seen from inside the namespace (from outside,
# this machine's network may answer for any address).
accepts() {
  ip netns exec "$NETNS" bash -c "(exec 3<>/dev/tcp/$HOST/$PORT) 2>/dev/null"
}

launch() {
  case "$KIND" in
    nats)
      command -v nats-server >/dev/null || die "nats-server is not installed (apt-get install nats-server)"
      (exec ip netns exec "$NETNS" setsid nats-server -js -sd "$STATE_DIR/store" \
        -a "$HOST" -p "$PORT" -P "$STATE_DIR/pid" </dev/null >>"$LOG" 2>&1) &
      ;;
    rabbitmq)
      [ -x "$RABBIT_BIN" ] || die "$RABBIT_BIN is missing (apt-get install rabbitmq-server)"
      mkdir -p "$STATE_DIR/home" "$STATE_DIR/mnesia" "$STATE_DIR/logs"
      if [ ! -f "$STATE_DIR/home/.erlang.cookie" ]; then
        head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$STATE_DIR/home/.erlang.cookie"
        chmod 400 "$STATE_DIR/home/.erlang.cookie"
      fi
      : >"$STATE_DIR/rabbitmq-env.conf"
      echo "[]." >"$STATE_DIR/enabled_plugins"
      cat >"$STATE_DIR/rabbitmq.conf" <<EOF
listeners.tcp.1 = $HOST:$PORT
loopback_users = none
EOF
      (cd "$STATE_DIR" && exec env -u ERL_FLAGS -u RABBITMQ_NODENAME \
        HOME="$STATE_DIR/home" \
        RABBITMQ_CONF_ENV_FILE="$STATE_DIR/rabbitmq-env.conf" \
        RABBITMQ_NODENAME=rabbit@localhost \
        ERL_EPMD_ADDRESS=127.0.0.1 RABBITMQ_DIST_PORT=25672 \
        RABBITMQ_MNESIA_BASE="$STATE_DIR/mnesia" \
        RABBITMQ_LOG_BASE="$STATE_DIR/logs" \
        RABBITMQ_PID_FILE="$STATE_DIR/pid" \
        RABBITMQ_ENABLED_PLUGINS_FILE="$STATE_DIR/enabled_plugins" \
        RABBITMQ_CONFIG_FILE="$STATE_DIR/rabbitmq.conf" \
        ip netns exec "$NETNS" setsid "$RABBIT_BIN" </dev/null >>"$LOG" 2>&1) &
      ;;
  esac
}

start() {
  if is_running && accepts; then
    echo "BROKER=$HOST:$PORT"
    return
  fi
  launch
  local i=0 deadline=$((SECONDS + START_WAIT))
  while [ "$SECONDS" -lt "$deadline" ]; do
    i=$((i + 1))
    if accepts; then
      echo "BROKER=$HOST:$PORT"
      return
    fi
    if [ "$i" -gt 10 ] && ! is_running; then
      echo "broker-node.sh: the $KIND server exited; last lines of $LOG:" >&2
      tail -20 "$LOG" >&2
      [ "$KIND" != rabbitmq ] || tail -20 "$STATE_DIR"/logs/*.log >&2 2>/dev/null || true
      exit 1
    fi
    sleep 0.1
  done
  die "the $KIND server did not accept connections on $HOST:$PORT within $START_WAIT s; see $LOG"
}

kill_node() {
  local pids
  pids=$(node_pids)
  [ -z "$pids" ] || kill -9 $pids 2>/dev/null || true
  for _ in $(seq 50); do is_running || break; sleep 0.1; done
  rm -f "$STATE_DIR/pid"
}

stop() {
  local pids
  pids=$(ip netns pids "$NETNS" 2>/dev/null || true)
  [ -z "$pids" ] || kill $pids 2>/dev/null || true
  for _ in $(seq 100); do [ -n "$(ip netns pids "$NETNS" 2>/dev/null || true)" ] || break; sleep 0.1; done
  pids=$(ip netns pids "$NETNS" 2>/dev/null || true)
  [ -z "$pids" ] || kill -9 $pids 2>/dev/null || true
  rm -f "$STATE_DIR/pid"
}

case "${1:-start}" in
  start) start ;;
  kill) kill_node ;;
  restart)
    kill_node
    start
    ;;
  stop) stop ;;
  *)
    echo "usage: $0 [start|kill|restart|stop]" >&2
    exit 2
    ;;
esac
