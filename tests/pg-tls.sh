#!/usr/bin/env bash
# A throwaway Postgres cluster that accepts TLS connections only, for the
# TLS tests (tests/integration/config/postgres_tls.rs), with every certificate
# generated here by the openssl command:
#
#   bash tests/pg-tls.sh start DIR    prints PORT=N once the cluster answers
#   bash tests/pg-tls.sh stop DIR     stops it and removes DIR
#
# DIR gets a CA (ca.pem), a server certificate for `localhost` only (so
# verify-full to 127.0.0.1 fails on the name), a client certificate for the
# role outboxd_tls_cert (client.pem, client.key), and what the bad-input
# tests need: another CA (other-ca.pem), a key of no certificate
# (stray.key), and an expired server certificate (expired.pem,
# expired.key). pg_hba.conf: outboxd_tls_cert logs in (and replicates) by
# client certificate, outboxd_tls_scram by SCRAM over TLS, postgres by
# trust over TLS, and no plaintext TCP connection is accepted.
set -euo pipefail
cd "$(dirname "$0")/.."
source tests/pg-throwaway.sh

cmd=${1:-}
dir=${2:-}
[ -n "$dir" ] || { echo "usage: $0 start|stop DIR" >&2; exit 2; }

as_postgres=()
[ "$(id -u)" = 0 ] && as_postgres=(runuser -u postgres --)

certs() {
  local d=$1
  command -v openssl >/dev/null || {
    echo "error: the openssl command is missing (Debian: apt-get install openssl)" >&2
    exit 1
  }
  (
    cd "$d"
    quiet() { "$@" >/dev/null 2>&1 || { echo "error: $*" >&2; "$@"; exit 1; }; }
    quiet openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2 -subj "/CN=outboxd test CA"
    quiet openssl req -x509 -newkey rsa:2048 -nodes -keyout other-ca.key -out other-ca.pem -days 2 -subj "/CN=another CA"
    printf 'subjectAltName=DNS:localhost\n' >server.ext
    quiet openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj "/CN=localhost"
    quiet openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -extfile server.ext -out server.pem
    quiet openssl req -newkey rsa:2048 -nodes -keyout expired.key -out expired.csr -subj "/CN=localhost"
    quiet openssl x509 -req -in expired.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days -1 -extfile server.ext -out expired.pem
    quiet openssl req -newkey rsa:2048 -nodes -keyout client.key -out client.csr -subj "/CN=outboxd_tls_cert"
    printf 'extendedKeyUsage=clientAuth\n' >client.ext
    quiet openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -extfile client.ext -out client.pem
    quiet openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out stray.key
    rm -f ./*.csr ./*.srl ./*.ext
  )
}

start() {
  local initdb pg_ctl psql port
  initdb=$(find_pg_bin initdb); pg_ctl=$(find_pg_bin pg_ctl); psql=$(find_pg_bin psql)
  if [ -z "$initdb" ] || [ -z "$pg_ctl" ]; then
    echo "error: initdb/pg_ctl are not installed (Debian: apt-get install postgresql)" >&2
    exit 1
  fi
  mkdir -p "$dir"
  certs "$dir"
  if [ "$(id -u)" = 0 ]; then
    id postgres >/dev/null 2>&1 || useradd --system --no-create-home postgres
    chown -R postgres "$dir"
  fi
  chmod 600 "$dir"/*.key
  "${as_postgres[@]}" "$initdb" -D "$dir/data" -U postgres --auth=trust >/dev/null
  cat >"$dir/data/pg_hba.conf" <<'EOF'
local     all          all                             trust
hostssl   all          outboxd_tls_cert  127.0.0.1/32  cert
hostssl   replication  outboxd_tls_cert  127.0.0.1/32  cert
hostssl   all          outboxd_tls_scram 127.0.0.1/32  scram-sha-256
hostssl   all          postgres          127.0.0.1/32  trust
hostssl   replication  postgres          127.0.0.1/32  trust
EOF
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  "${as_postgres[@]}" "$pg_ctl" -D "$dir/data" -l "$dir/log" -w -o \
    "-c listen_addresses=127.0.0.1 -p $port -k $dir -c fsync=off -c wal_level=logical \
     -c ssl=on -c ssl_cert_file=$dir/server.pem -c ssl_key_file=$dir/server.key -c ssl_ca_file=$dir/ca.pem" \
    start >/dev/null || { tail -20 "$dir/log" >&2; exit 1; }
  "$psql" -h "$dir" -p "$port" -U postgres -d postgres -qAtc \
    "CREATE ROLE outboxd_tls_cert LOGIN SUPERUSER REPLICATION;
     CREATE ROLE outboxd_tls_scram LOGIN SUPERUSER PASSWORD 'scram-over-tls';" >/dev/null
  echo "$port" >"$dir/port"
  echo "PORT=$port"
}

stop() {
  local pg_ctl
  pg_ctl=$(find_pg_bin pg_ctl)
  if [ -d "$dir/data" ]; then
    "${as_postgres[@]}" "$pg_ctl" -D "$dir/data" -m immediate stop >/dev/null 2>&1 || true
  fi
  rm -rf "$dir"
}

case "$cmd" in
  start) start ;;
  stop) stop ;;
  *) echo "usage: $0 start|stop DIR" >&2; exit 2 ;;
esac
