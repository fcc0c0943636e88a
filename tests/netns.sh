#!/usr/bin/env bash
# The chaos soak's network: one network namespace per host, all joined to
# a bridge that lives in a namespace of its own, so nothing the soak does
# touches the machine's own network.
#
#   tests/netns.sh check            root, iproute2, nftables, netns: or why not
#   tests/netns.sh up PREFIX        create PREFIX-hub and the hosts below
#   tests/netns.sh down PREFIX      kill what runs inside them, delete them
#   tests/netns.sh hosts            print "name address" per host
#
# Hosts (10.213.0.0/24; bench/examples/chaos/net.rs knows the same
# addresses): drv (the soak's driver and its delay proxy), pg,
# kafka, relay-1, relay-2, consumer-1, consumer-2. Each host namespace has
# an nftables table `inet chaos` whose base chains jump to per-target
# chains (pg_out/pg_in, kafka_out/kafka_in): the driver adds drop rules to
# those and flushes them to heal.
#
# Missing tools are installed from Debian's packages. Without root or
# network namespaces it fails and says why: the soak never runs without
# its network faults.
set -euo pipefail

NET=10.213.0
HOSTS=(drv:2 pg:10 kafka:11 relay-1:21 relay-2:22 consumer-1:31 consumer-2:32)

die() { echo "netns.sh: $*" >&2; exit 1; }

install_tools() {
  local missing=()
  command -v ip >/dev/null || missing+=(iproute2)
  command -v nft >/dev/null || missing+=(nftables)
  command -v ping >/dev/null || missing+=(iputils-ping)
  [ ${#missing[@]} -eq 0 ] && return
  [ "$(id -u)" = 0 ] || die "needs ${missing[*]} and root to install them (apt-get install ${missing[*]})"
  echo "netns.sh: installing ${missing[*]} from Debian's packages" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >/dev/null 2>&1 ||
    { apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >/dev/null; } ||
    die "could not install ${missing[*]} with apt-get"
}

check() {
  [ "$(id -u)" = 0 ] || die "the soak's network faults need root (network namespaces and nftables); run it as root"
  install_tools
  local probe="obxprobe$$"
  ip netns add "$probe" 2>/dev/null ||
    die "cannot create a network namespace ('ip netns add' failed): the soak needs CAP_SYS_ADMIN and netns support"
  if ! ip netns exec "$probe" nft add table inet probe 2>/dev/null; then
    ip netns del "$probe"
    die "nftables does not work inside a network namespace (nft add table failed): the kernel needs nf_tables"
  fi
  ip netns del "$probe"
}

ns_of() { echo "$1-$2"; }

up() {
  local p=$1 hub
  hub=$(ns_of "$p" hub)
  check
  down "$p" 2>/dev/null || true
  ip netns add "$hub"
  ip -n "$hub" link set lo up
  ip -n "$hub" link add br0 type bridge
  ip -n "$hub" link set br0 up
  local entry name octet ns
  for entry in "${HOSTS[@]}"; do
    name=${entry%%:*}; octet=${entry##*:}; ns=$(ns_of "$p" "$name")
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    ip -n "$hub" link add "v-$name" type veth peer name eth0 netns "$ns"
    ip -n "$hub" link set "v-$name" master br0 up
    ip -n "$ns" addr add "$NET.$octet/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip netns exec "$ns" nft -f - <<'NFT'
table inet chaos {
  chain pg_out { }
  chain pg_in { }
  chain kafka_out { }
  chain kafka_in { }
  chain output { type filter hook output priority 0; jump pg_out; jump kafka_out; }
  chain input { type filter hook input priority 0; jump pg_in; jump kafka_in; }
}
NFT
  done
  # The bridge forwards once its ports are up; wait for drv to reach pg.
  local i
  for i in $(seq 50); do
    ip netns exec "$(ns_of "$p" drv)" ping -c1 -W1 "$NET.10" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  die "the namespaces are up but $NET.2 cannot reach $NET.10 over the bridge"
}

down() {
  local p=$1 entry ns pids
  for entry in "${HOSTS[@]}" hub:0; do
    ns=$(ns_of "$p" "${entry%%:*}")
    ip netns list | grep -qw "^$ns" || continue
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    [ -z "$pids" ] || kill -9 $pids 2>/dev/null || true
    ip netns del "$ns"
  done
}

hosts() {
  local entry
  for entry in "${HOSTS[@]}"; do echo "${entry%%:*} $NET.${entry##*:}"; done
}

case "${1:-}" in
  check) check ;;
  up) [ -n "${2:-}" ] || die "usage: $0 up PREFIX"; up "$2" ;;
  down) [ -n "${2:-}" ] || die "usage: $0 down PREFIX"; down "$2" ;;
  hosts) hosts ;;
  *) echo "usage: $0 check | up PREFIX | down PREFIX | hosts" >&2; exit 2 ;;
esac
