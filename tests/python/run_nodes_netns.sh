#!/usr/bin/env bash
# ctest python_nodes_netns_<case>: tests/python/run_nodes.sh's cases (the same steps and checks),
# each gpurun "node" in its own network and mount namespace (issue 46's "network namespaces
# where the machine allows"): node k has its own address 10.77.0.<k+1>/24 on a veth joined to a
# bridge, its own loopback and its own empty tmpfs /dev/shm; they share the file system (the
# test's output folder, like a shared FS) and nothing else. All of it inside one unprivileged
# user namespace with its own PID namespace (unshare -Urnm -p): whatever the test leaves dies
# with it. Node 0 runs with --master-addr 10.77.0.1 (its store and its workers' Gloo pairs are
# reached there); node k > 0 with --master-addr 10.77.0.1 in place of run_nodes.sh's 127.0.0.1.
# Where the machine does not allow it (no user namespaces, no veth, no nsenter), the test is
# skipped (exit 77, ctest SKIP_RETURN_CODE) with the reason.
# Usage: run_nodes_netns.sh GPURUN join|leave|kill|two_to_three_to_two|pause_copy|pause_leave|cut
#   pause_<c>: run_nodes_pause.sh's case <c>:
#   the pause snapshot written in node 1's /dev/shm must reach nodes 0 and 2 over TCP.
#   cut: run_nodes_cut.sh: node 1's veth taken off the bridge while the job trains.
# KEEP_TMP=1 keeps the scratch folders (the line "kept DIR" names them).
# The recipe by hand (docs/cli.md#elastic-nodes, "Tested across network namespaces"):
#   unshare -Urnm -p --fork --mount-proc; ip link add br0 type bridge; ip link set br0 up
#   per node k: unshare -nm sh -c 'mount -t tmpfs none /dev/shm; exec sleep inf' & (pid H)
#     ip link add vk type veth peer name eth0 netns H; ip link set vk master br0 up
#     nsenter -t H -n -m: ip link set lo up; ip addr add 10.77.0.<k+1>/24 dev eth0;
#                         ip link set eth0 up
#   then gpurun for node k: nsenter -t H -n -m gpurun --master-addr 10.77.0.1 ...
set -euo pipefail
NODES=3  # node 0, 1, 2 (run_nodes.sh's two_to_three_to_two needs three)
addr() { echo "10.77.0.$(($1 + 1))"; }

# Role 3: "gpurun" as run_nodes.sh calls it: the real one in the namespaces of its --node-rank
# (node 0 when none: `gpurun status`), with node 0's address as the master address.
if [[ -n ${NETNS_REAL_GPURUN:-} ]]; then
  args=("$@")
  k=0 has_addr=
  for ((i = 0; i < ${#args[@]}; i++)); do
    case ${args[i]} in
      --node-rank) k=${args[i + 1]} ;;
      --master-addr)
        args[i + 1]=$(addr 0)
        has_addr=1
        ;;
    esac
  done
  holders=($NETNS_HOLDERS)
  [[ -n ${holders[k]:-} ]] || {
    echo "run_nodes_netns.sh: no namespaces for node $k (only $NODES nodes)" >&2
    exit 2
  }
  # node 0 (`--node-rank 0`, not `gpurun status`): its store and workers at its own address
  if [[ ${args[0]:-} == --* && -z $has_addr ]]; then
    args=(--master-addr "$(addr 0)" "${args[@]}")
  fi
  exec nsenter -t "${holders[k]}" -n -m -- "$NETNS_REAL_GPURUN" "${args[@]}"
fi

GPURUN=${1:?usage: run_nodes_netns.sh GPURUN CASE}
CASE=${2:?usage: run_nodes_netns.sh GPURUN join|leave|kill|two_to_three_to_two|pause_<case>}
TEST=python_nodes_netns_$CASE
skip() {
  echo "$TEST: SKIP: $* (this machine does not allow a network namespace per node)"
  exit 77
}

# Role 1: outside. Can this machine make the namespaces? Then run role 2 inside them.
if [[ ${3:-} != --inside ]]; then
  for tool in unshare nsenter ip; do
    command -v "$tool" > /dev/null || skip "'$tool' is not installed"
  done
  # What role 2 does, once: a bridge, a nested network + mount namespace with its own tmpfs
  # /dev/shm, a veth end moved into it and given an address there.
  probe='ip link add probebr type bridge || exit
    unshare -nm --propagation private sh -c "mount -t tmpfs none /dev/shm && exec sleep 20" &
    h=$!
    for i in $(seq 100); do case $(readlink /proc/$h/exe) in */sleep) break ;; esac; sleep 0.05; done
    ip link add probe0 type veth peer name eth0 netns $h && ip link set probe0 master probebr up &&
      nsenter -t $h -n -m sh -c "ip addr add 10.77.0.9/24 dev eth0 && ip link set eth0 up" &&
      nsenter -t $h -m test -w /dev/shm
    rc=$?
    kill $h
    exit $rc'
  why=$(timeout 20 unshare -Urnm --propagation private sh -c "$probe" 2>&1) \
    || skip "an unprivileged user namespace with a veth, a bridge and a tmpfs failed: $why"
  # --kill-child: when ctest ends this script, the PID namespace's init and so all in it go
  exec unshare -Urnm -p --fork --kill-child --mount-proc --propagation private \
    "$0" "$GPURUN" "$CASE" --inside
fi

# Role 2: PID 1 of the namespaces: a bridge, then per node a holder process (its network and
# mount namespace, a private tmpfs /dev/shm) with a veth end on the bridge.
ip link set lo up
ip link add br0 type bridge
ip link set br0 up
holders=()
for ((k = 0; k < NODES; k++)); do
  unshare -nm --propagation private sh -c \
    'mount -t tmpfs -o mode=1777 none /dev/shm && exec sleep 3600' &
  holders[k]=$!
done
for ((k = 0; k < NODES; k++)); do
  for ((i = 0; i < 50; i++)); do  # the holder has unshared and mounted: it sleeps
    [[ $(readlink /proc/${holders[k]}/exe) == */sleep ]] && break
    sleep 0.05
  done
  ip link add "v$k" type veth peer name eth0 netns "${holders[k]}"
  ip link set "v$k" master br0 up
  nsenter -t "${holders[k]}" -n -m sh -c "ip link set lo up &&
    ip addr add $(addr "$k")/24 dev eth0 && ip link set eth0 up"
done
# The nodes share no /dev/shm: a file made in node 0's is not in node 1's.
nsenter -t "${holders[0]}" -m touch /dev/shm/node0-only
if nsenter -t "${holders[1]}" -m test -e /dev/shm/node0-only; then
  echo "$TEST: FAIL: node 1 sees node 0's /dev/shm" >&2
  exit 1
fi
nsenter -t "${holders[0]}" -m rm /dev/shm/node0-only
echo "$TEST: nodes 0..$((NODES - 1)) at $(addr 0)..$(addr $((NODES - 1))), each its own /dev/shm"
export NETNS_REAL_GPURUN=$GPURUN NETNS_HOLDERS="${holders[*]}"
# A temp folder of its own: the run folders of gpuruns of this PID namespace stay out of the
# machine's /tmp/gpurun-<uid>/runs (before 585eb97 each side took the other's for stale).
TMPDIR=$(mktemp -d)
export TMPDIR
rc=0
# pause_<c>: run_nodes_pause.sh's case <c>; any other: run_nodes.sh's
here=$(cd "$(dirname "$0")" && pwd)
script=run_nodes.sh arg=$CASE
[[ $CASE == pause_* ]] && script=run_nodes_pause.sh arg=${CASE#pause_}
[[ $CASE == cut ]] && script=run_nodes_cut.sh arg=cut  # node 1's link cut (it needs the bridge)
# The script as it is, but for the patterns it greps node 0's lines with: a node's endpoint
# there is 10.77.0.<k+1>:PORT, not 127.0.0.1:PORT (the regex `127\.0\.0\.1` -> `[0-9.]+`; its
# own --master-addr 127.0.0.1 is role 3's to replace). bash -c: $0 is still the script's path.
bash -c "$(sed 's/127\\\.0\\\.0\\\.1/[0-9.]+/g' "$here/$script")" "$here/$script" \
  "$here/$(basename "$0")" "$arg" || rc=$?
[[ -n ${KEEP_TMP:-} ]] && echo "$TEST: kept $TMPDIR" || rm -rf "$TMPDIR"
((rc == 0)) && echo "$TEST: OK ($script $arg, each node in its own namespaces)" \
  || echo "$TEST: FAIL ($script $arg above, each node in its own namespaces)" >&2
exit $rc
