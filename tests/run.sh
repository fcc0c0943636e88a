#!/usr/bin/env bash
# Runs the whole test suite, starting what it needs.
#
# Postgres: uses $OUTBOXD_TEST_DATABASE_URL if set, else the server on
# 127.0.0.1:5432 if it answers, else a throwaway cluster (initdb + pg_ctl in
# a temporary directory) when the PostgreSQL binaries are installed.
# The WAL relay's tests read a logical replication slot, so the server must
# run with wal_level = logical: the throwaway cluster starts with it, and the
# local cluster on 127.0.0.1:5432 is switched (ALTER SYSTEM and a restart,
# once; a no-op when it already is). Another server is only checked.
# Kafka-compatible broker: see tests/tansu.sh (started here when present).
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '==> [%s] %s\n' "$(date +%T)" "$*" >&2; }
cleanup_cmds=()
cleanup() { for c in "${cleanup_cmds[@]:-}"; do [ -n "$c" ] && eval "$c" || true; done; }
trap cleanup EXIT

# OpenSSL's headers and pkg-config, which librdkafka builds against.
bash tests/deps.sh

source tests/pg-throwaway.sh

start_throwaway_postgres() {
  local port
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  log "starting a throwaway Postgres on port $port"
  throwaway_postgres 127.0.0.1 "$port" || exit 1
  cleanup_cmds+=("$THROWAWAY_PG_STOP")
  export OUTBOXD_TEST_DATABASE_URL=$THROWAWAY_PG_URL
}

if [ -z "${OUTBOXD_TEST_DATABASE_URL:-}" ]; then
  if python3 -c 'import socket; socket.create_connection(("127.0.0.1",5432),2)' 2>/dev/null; then
    export OUTBOXD_TEST_DATABASE_URL="postgres://postgres@127.0.0.1:5432/postgres"
  else
    start_throwaway_postgres
  fi
fi
log "Postgres for tests: $OUTBOXD_TEST_DATABASE_URL"

pg_answers() { psql "$OUTBOXD_TEST_DATABASE_URL" -Atqc "SELECT 1" >/dev/null 2>&1; }

# The WAL relay reads a logical replication slot: wal_level must be
# `logical`, a setting that takes a server restart.
ensure_logical_wal() {
  local level cluster
  level=$(psql "$OUTBOXD_TEST_DATABASE_URL" -Atqc "SHOW wal_level" 2>/dev/null || true)
  if [ "$level" = logical ]; then
    return
  fi
  case "$OUTBOXD_TEST_DATABASE_URL" in
    *@127.0.0.1:5432/* | *@localhost:5432/*)
      # The cluster that listens on 5432, as pg_lsclusters lists it
      # ("15 main"); else the only version under /etc/postgresql.
      cluster=$(pg_lsclusters --no-header 2>/dev/null | awk '$3 == 5432 { print $1, $2; exit }')
      [ -n "$cluster" ] || cluster="$(ls /etc/postgresql 2>/dev/null | sort -V | tail -1) main"
      log "Postgres on 127.0.0.1:5432 runs wal_level = ${level:-unknown}; the WAL relay's tests need logical:"
      log "ALTER SYSTEM SET wal_level = logical, then restarting cluster $cluster"
      psql "$OUTBOXD_TEST_DATABASE_URL" -qc "ALTER SYSTEM SET wal_level = logical" >/dev/null
      # shellcheck disable=SC2086 # "$cluster" is two words: version and name
      pg_ctlcluster --skip-systemctl-redirect $cluster restart
      for _ in $(seq 1 120); do
        pg_answers && break
        sleep 0.5
      done
      level=$(psql "$OUTBOXD_TEST_DATABASE_URL" -Atqc "SHOW wal_level" 2>/dev/null || true)
      if [ "$level" != logical ]; then
        echo "error: Postgres on 127.0.0.1:5432 still runs wal_level = ${level:-unknown (it does not answer)} after the restart of cluster $cluster." >&2
        echo "       Set wal_level = logical in its postgresql.conf (or ALTER SYSTEM) and restart it." >&2
        exit 1
      fi
      log "Postgres on 127.0.0.1:5432 now runs wal_level = logical"
      ;;
    *)
      {
        echo
        echo "!!! WARNING: the Postgres at $OUTBOXD_TEST_DATABASE_URL runs wal_level = ${level:-unknown},"
        echo "!!! not logical. The WAL relay's tests (relay.source = \"wal\", every test under wal::)"
        echo "!!! will FAIL, not skip. Fix: as a superuser run"
        echo "!!!     ALTER SYSTEM SET wal_level = logical;"
        echo "!!! then restart that server (max_replication_slots and max_wal_senders >= 4 as well)."
        echo
      } >&2
      ;;
  esac
}

if command -v psql >/dev/null 2>&1; then
  ensure_logical_wal
  # Replication slots left behind by earlier runs, each named after its
  # test's database. A slot pins WAL for ever and blocks DROP DATABASE, so
  # these go first: terminate the walsender still reading one (a killed
  # test's relay), then drop it.
  psql "$OUTBOXD_TEST_DATABASE_URL" -Atqc \
    "SELECT slot_name FROM pg_replication_slots WHERE database LIKE 'outboxd\_t\_%'" 2>/dev/null |
    while read -r slot; do
      for _ in $(seq 1 50); do
        psql "$OUTBOXD_TEST_DATABASE_URL" -Atqc \
          "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = '$slot' AND active_pid IS NOT NULL" >/dev/null 2>&1 || true
        if psql "$OUTBOXD_TEST_DATABASE_URL" -qc "SELECT pg_drop_replication_slot('$slot')" >/dev/null 2>&1; then
          break
        fi
        sleep 0.1
      done
    done
fi

# Drop databases left behind by earlier runs (each test makes its own).
if command -v psql >/dev/null 2>&1; then
  psql "$OUTBOXD_TEST_DATABASE_URL" -Atqc \
    "SELECT datname FROM pg_database WHERE datname LIKE 'outboxd_t_%'" 2>/dev/null |
    while read -r db; do psql "$OUTBOXD_TEST_DATABASE_URL" -qc "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1 || true; done
  # Consumer plugins' roles made by tests (named after their databases):
  # roles belong to the cluster and outlive the databases dropped above.
  psql "$OUTBOXD_TEST_DATABASE_URL" -Atqc \
    "SELECT rolname FROM pg_roles WHERE rolname LIKE 'outboxd\_t\_%'" 2>/dev/null |
    while read -r role; do psql "$OUTBOXD_TEST_DATABASE_URL" -qc "DROP ROLE IF EXISTS \"$role\"" >/dev/null 2>&1 || true; done
  # Tablespaces a failed full-disk test left (config/full_postgres_disk.rs), with their
  # tmpfs: dropped only after the databases above, and unmounted only after
  # the tablespace is gone (unmounting first would make Postgres PANIC).
  psql "$OUTBOXD_TEST_DATABASE_URL" -Atqc \
    "SELECT spcname || ' ' || pg_tablespace_location(oid) FROM pg_tablespace WHERE spcname LIKE 'outboxd_full_%'" 2>/dev/null |
    while read -r space dir; do
      if psql "$OUTBOXD_TEST_DATABASE_URL" -qc "DROP TABLESPACE $space" >/dev/null 2>&1; then
        umount "$dir" 2>/dev/null || true
        rmdir "$dir" 2>/dev/null || true
      fi
    done
fi

if [ -x tests/tansu.sh ] && [ -z "${OUTBOXD_TEST_KAFKA:-}" ]; then
  eval "$(tests/tansu.sh start)"
  export OUTBOXD_TEST_KAFKA="$KAFKA_BOOTSTRAP"
  cleanup_cmds+=("tests/tansu.sh stop")
  log "Kafka-compatible broker for tests: $OUTBOXD_TEST_KAFKA"
fi

log "alert rules (promtool)"
bash tests/alerts/check.sh
log "each dependency compiles once: the same features in every build (tests/tools/feature-sets.sh)"
bash tests/tools/feature-sets.sh
log "building the Wasm plugins (plugins/build.sh)"
bash plugins/build.sh >/dev/null
log "dashboard in headless Chromium (runs plugins from plugins/dist)"
bash tests/dashboard/run.sh

status=0
log "guest SDK unit tests (host target)"
(cd guest-sdk/consumer && CARGO_TARGET_DIR="$PWD/../../target/guest-sdk" cargo test -q) || status=$?
log "the workspace's tests"
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --no-fail-fast "$@" || status=$?
else
  cargo test --workspace --no-fail-fast "$@" || status=$?
fi
# Every test drops what it made on Postgres when it ends, passed or failed
# (support/db.rs: DropDatabase, SlotGuard); whatever is still there now was
# leaked by a test, and a leak fails the run.
if command -v psql >/dev/null 2>&1; then
  # A publication belongs to its database: those of the test databases go
  # with them; this catches one a test made in the server's own database.
  log "nothing the tests made is left on Postgres (databases, roles, replication slots, publications named outboxd_t_*)"
  if ! left=$(psql "$OUTBOXD_TEST_DATABASE_URL" -Atqc "
      SELECT 'database ' || datname FROM pg_database WHERE datname LIKE 'outboxd\_t\_%'
      UNION ALL SELECT 'role ' || rolname FROM pg_roles WHERE rolname LIKE 'outboxd\_t\_%'
      UNION ALL SELECT 'replication slot ' || slot_name FROM pg_replication_slots
        WHERE slot_name LIKE 'outboxd\_t\_%'
      UNION ALL SELECT 'publication ' || pubname FROM pg_publication
        WHERE pubname LIKE 'outboxd\_t\_%'" 2>&1); then
    left="cannot ask Postgres: $left"
  fi
  if [ -n "$left" ]; then
    echo "error: the tests left these on $OUTBOXD_TEST_DATABASE_URL (a test that creates one must drop it when it ends; see DropDatabase in tests/integration/support/db.rs):" >&2
    echo "$left" | head -40 >&2
    status=1
  fi
fi
if [ "$#" -eq 0 ]; then
  if [ "${OUTBOXD_SCAFFOLDS_IN_CI:-0}" = 1 ]; then
    # .ci/run runs them next to the fuzzer, whose run leaves a core idle.
    log "the six plugin scaffolds: left to .ci/run, which runs tests/scaffolds.sh while fuzzing"
  else
    log "the six plugin scaffolds: plugin new, plugin build, plugin test --expect (tests/scaffolds.sh)"
    bash tests/scaffolds.sh || status=$?
  fi
  log "benchmarks at smoke size (tests/bench-smoke.sh; numbers only, no timing assertions)"
  bash tests/bench-smoke.sh || status=$?
fi
log "tests/run.sh: exit $status"
exit "$status"
