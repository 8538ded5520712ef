#!/bin/sh
# Runs `mpirun -np 2 CMD...` with one rank on each of two "hosts": two network namespaces joined
# by a veth pair (10.77.X.1 and 10.77.X.2), made here and removed on exit. Open MPI starts the
# second host's daemon through this script as its rsh agent (`ip netns exec` instead of ssh) and
# is held to TCP over the veth, so the ranks talk as two machines on one link would; they share
# the file system, as hosts with a shared file system do. Needs root (CAP_NET_ADMIN): otherwise
# it prints why and exits 77, which the test reports as a skip.
#   two_hosts.sh CMD...            the job; exits with mpirun's status
#   two_hosts.sh --agent HOST CMD  (Open MPI's rsh agent) CMD in HOST's namespace
# With LOOM_CUT_LINK_WHEN=PATH, the link goes down once PATH exists (as a cut cable or a lost
# switch would: nothing is refused, packets just stop arriving), and the script prints
# "two_hosts.sh: link cut at T" (T in seconds since the epoch); with LOOM_CUT_LINK_FOR=S as well,
# it comes back S seconds later ("two_hosts.sh: link back at T"). Whatever is left running in the
# namespaces when the job ends (a daemon that lost its peer) is killed.
set -u
if [ "${1:-}" = "--agent" ]; then
  host=$2
  shift 2
  for pair in $LOOM_TWO_HOSTS; do
    [ "${pair%%=*}" = "$host" ] && exec ip netns exec "${pair#*=}" sh -c "$*"
  done
  echo "two_hosts.sh: unknown host $host" >&2
  exit 1
fi
command -v mpirun > /dev/null || { echo "SKIP: mpirun not found"; exit 77; }
command -v ip > /dev/null || { echo "SKIP: no ip command (iproute2)"; exit 77; }
id=$$
net=$((id % 250 + 1))
a=loom${id}a b=loom${id}b
cutter=
cleanup() {
  [ -n "$cutter" ] && kill "$cutter" 2> /dev/null
  for ns in "$a" "$b"; do
    ip netns pids "$ns" 2> /dev/null | xargs -r kill -KILL 2> /dev/null
  done
  ip netns del "$a" 2> /dev/null
  ip netns del "$b" 2> /dev/null  # removing a namespace removes its end of the veth, and so the pair
}
trap cleanup EXIT
trap 'exit 130' INT TERM
if ! ip netns add "$a" 2> /dev/null; then
  echo "SKIP: cannot create a network namespace (ip netns add needs root or CAP_SYS_ADMIN + CAP_NET_ADMIN)"
  exit 77
fi
set -e
ip netns add "$b"
ip link add "v$a" type veth peer name "v$b"
ip link set "v$a" netns "$a"
ip link set "v$b" netns "$b"
ip -n "$a" addr add "10.77.$net.1/24" dev "v$a"
ip -n "$b" addr add "10.77.$net.2/24" dev "v$b"
for ns in "$a" "$b"; do
  ip -n "$ns" link set lo up
  ip -n "$ns" link set "v$ns" up
done
set +e
export LOOM_TWO_HOSTS="10.77.$net.1=$a 10.77.$net.2=$b"
if [ -n "${LOOM_CUT_LINK_WHEN:-}" ]; then
  (
    while [ ! -e "$LOOM_CUT_LINK_WHEN" ]; do sleep 0.1; done
    ip -n "$b" link set "v$b" down
    echo "two_hosts.sh: link cut at $(date +%s.%N)"
    if [ -n "${LOOM_CUT_LINK_FOR:-}" ]; then
      sleep "$LOOM_CUT_LINK_FOR"
      ip -n "$b" link set "v$b" up
      echo "two_hosts.sh: link back at $(date +%s.%N)"
    fi
  ) &
  cutter=$!
fi
# `timeout`: a job that hangs ends (mpirun passes the TERM on to its ranks) and the namespaces go.
# Generous: under a sanitizer on a loaded 2-core machine, reaching the step that cuts the link
# alone has taken over 120 s; what the tests time starts at the cut, not here.
ip netns exec "$a" timeout 300 mpirun --allow-run-as-root --host "10.77.$net.1,10.77.$net.2" -np 2 \
  --mca plm_rsh_agent "$(readlink -f "$0") --agent" --mca btl tcp,self \
  --mca btl_tcp_if_include "10.77.$net.0/24" --mca oob_tcp_if_include "10.77.$net.0/24" "$@"
