#!/usr/bin/env bash
# tools/netns_cluster.sh — N "hosts" on this machine, for multi-host runs
# without a cluster: one network namespace per host (ddp-h1, ddp-h2, ...),
# each with its own address on a bridge (ddp-br0, 10.77.0.0/24; host i is
# 10.77.0.1i), its own loopback, and an rsh agent so that
# `mpirun --host 10.77.0.11:2,10.77.0.12:2` starts ranks inside them; and a
# head (ddp-h0, 10.77.0.10) to run mpirun on, as a cluster's login node.
#
#   tools/netns_cluster.sh up N      make N hosts (needs root); prints the
#                                    mpirun options that use them; run
#                                    mpirun on the head:
#                                    ip netns exec ddp-h0 mpirun OPTIONS ...
#   tools/netns_cluster.sh agent HOST COMMAND...
#                                    (the rsh agent mpirun calls) runs
#                                    COMMAND in HOST's namespace
#   tools/netns_cluster.sh link HOST down|up
#                                    takes a host's link down or up (a
#                                    host cut off mid-run)
#   tools/netns_cluster.sh down      removes every namespace and the bridge
#
# Every step is idempotent, so `down` after a failed `up` cleans up.
set -euo pipefail
BRIDGE=ddp-br0
NET=10.77.0
PREFIX=ddp-h

ns_of() {  # 10.77.0.12 -> ddp-h2
  local last=${1##*.}
  echo "$PREFIX$((last - 10))"
}

up() {
  local n=$1
  [ "$(id -u)" -eq 0 ] || { echo "netns_cluster: needs root (network namespaces)" >&2; exit 77; }
  down >/dev/null 2>&1 || true
  ip link add "$BRIDGE" type bridge
  ip addr add "$NET.1/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  local hosts=()
  for i in $(seq 0 "$n"); do  # 0: the head, where mpirun runs
    local ns=$PREFIX$i addr=$NET.$((10 + i))
    ip netns add "$ns"
    ip link add "veth-$ns" type veth peer name eth0 netns "$ns"
    ip link set "veth-$ns" master "$BRIDGE" up
    ip -n "$ns" addr add "$addr/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
    [ "$i" -eq 0 ] || hosts+=("$addr")
  done
  local agent
  agent=$(realpath "$0")
  # mpirun runs on the head (ip netns exec ddp-h0 mpirun ...), as on a
  # cluster's login node. Open MPI 4.1's mpirun has no check of its own that
  # a host is still there: once a rank fails, it sends the kill to every
  # daemon and waits until each answers or TCP gives up on it, which by
  # default (net.ipv4.tcp_retries2 = 15) takes some 15 minutes for a lost
  # host. The head's TCP gives up after one retransmission (about 2 s), so
  # that a run that loses a host ends seconds after its ranks report it.
  ip netns exec "${PREFIX}0" sysctl -q -w net.ipv4.tcp_retries2=1
  echo "--host $(IFS=,; echo "${hosts[*]/%/:1}") --mca plm_rsh_agent '$agent agent'" \
       "--mca oob_tcp_if_include $NET.0/24 --mca btl_tcp_if_include $NET.0/24"
}

agent() {  # its own network and its own host name (ddp-h2), as a real host
  local host=$1 ns
  shift
  ns=$(ns_of "$host")
  exec ip netns exec "$ns" unshare -u sh -c "hostname $ns; $*"
}

link() {  # HOST: 10.77.0.12, as elsewhere (ddp-h2 and 2 are taken too)
  local ns
  case $1 in
    *.*) ns=$(ns_of "$1") ;;
    *) ns=$PREFIX${1#"$PREFIX"} ;;
  esac
  ip link set "veth-$ns" "$2"
}

down() {
  for ns in $(ip netns list | awk '{print $1}' | grep "^$PREFIX" || true); do
    ip link del "veth-$ns" 2>/dev/null || true
    ip netns del "$ns"
  done
  ip link del "$BRIDGE" 2>/dev/null || true
}

case "${1:-}" in
  up) up "${2:?usage: netns_cluster.sh up N}" ;;
  agent) shift; agent "$@" ;;
  link) link "${2:?host}" "${3:?down|up}" ;;
  down) down ;;
  *) echo "usage: tools/netns_cluster.sh up N | agent HOST COMMAND... | link HOST down|up | down" >&2; exit 2 ;;
esac
