# Sourced by tests/run.sh and tests/chaos.sh: a throwaway Postgres cluster
# (initdb + pg_ctl in a temporary directory) with wal_level = logical.
#
#   throwaway_postgres HOST PORT [NETNS] [EXTRA_OPTIONS]
#
# starts it listening on HOST:PORT (inside network namespace NETNS when
# given) and sets THROWAWAY_PG_URL (the postgres database),
# THROWAWAY_PG_STOP (a command that stops it and removes its files) and
# THROWAWAY_PG_DIR (its data and log).

find_pg_bin() {
  local name=$1
  if command -v "$name" >/dev/null 2>&1; then command -v "$name"; return; fi
  ls -d /usr/lib/postgresql/*/bin/"$name" 2>/dev/null | sort -V | tail -1
}

throwaway_postgres() {
  local host=$1 port=$2 netns=${3:-} extra=${4:-} initdb pg_ctl dir runas=() in_netns=()
  initdb=$(find_pg_bin initdb); pg_ctl=$(find_pg_bin pg_ctl)
  if [ -z "$initdb" ] || [ -z "$pg_ctl" ]; then
    echo "error: initdb/pg_ctl are not installed, so no throwaway Postgres can start." >&2
    echo "       Install them (Debian: apt-get install postgresql) or set OUTBOXD_TEST_DATABASE_URL" >&2
    echo "       to a server where the user may CREATE DATABASE." >&2
    return 1
  fi
  dir=$(mktemp -d /tmp/outboxd-pg.XXXXXX)
  if [ "$(id -u)" = 0 ]; then
    # initdb refuses to run as root.
    id postgres >/dev/null 2>&1 || useradd --system --no-create-home postgres
    chown postgres "$dir"
    runas=(runuser -u postgres --)
  fi
  [ -z "$netns" ] || in_netns=(ip netns exec "$netns")
  "${runas[@]}" "$initdb" -D "$dir/data" -U postgres --auth=trust >/dev/null
  # initdb trusts only loopback; a cluster on another address trusts its
  # own subnet (the soak's namespaces), for replication connections too.
  printf 'host all all samenet trust\nhost replication all samenet trust\n' >>"$dir/data/pg_hba.conf"
  "${in_netns[@]}" "${runas[@]}" "$pg_ctl" -D "$dir/data" -l "$dir/log" -w \
    -o "-c listen_addresses=$host -p $port -k $dir -c fsync=off -c wal_level=logical $extra" start >/dev/null
  THROWAWAY_PG_URL="postgres://postgres@$host:$port/postgres"
  THROWAWAY_PG_DIR=$dir
  THROWAWAY_PG_STOP="${runas[*]} $pg_ctl -D $dir/data -m immediate stop >/dev/null 2>&1; rm -rf $dir"
}
