#!/usr/bin/env bash
# two_node_check.sh: a real two-node data-parallel run on this machine. Two network namespaces joined by a
# veth pair stand in for two nodes (10.77.0.1 and 10.77.0.2, reachable only from inside them); one launcher
# runs in each with --nnodes 2, the first namespace's address as master and --iface naming its veth, and
# trains the tiny GPT with batch 4 per node. The result must equal one process with batch 8 on the same
# global batch. The namespaces are created and removed here. Exit 77 (skip) where namespaces cannot be made.
#   scripts/dist/two_node_check.sh [--colossal BIN] [--python PY]
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=check_common.sh
source scripts/dist/check_common.sh "$@"
skip() { echo "skip: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "needs root for ip netns"
command -v ip >/dev/null || skip "no ip command (iproute2)"

tag="c$$"
ns0="colossal-${tag}-0" ns1="colossal-${tag}-1" v0="ve${tag}a" v1="ve${tag}b"
TMP="$(mktemp -d "${TMPDIR:-/tmp}/two_node_check.XXXXXX")"
cleanup() {
  ip netns pids "$ns0" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
  ip netns pids "$ns1" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
  ip netns del "$ns0" 2>/dev/null || true
  ip netns del "$ns1" 2>/dev/null || true
  rm -rf "$TMP"
}
trap cleanup EXIT
ip netns add "$ns0" 2>/dev/null || skip "ip netns add is not permitted here"
ip netns add "$ns1" || skip "ip netns add is not permitted here"
ip link add "$v0" type veth peer name "$v1" || skip "veth pairs are not permitted here"
ip link set "$v0" netns "$ns0"
ip link set "$v1" netns "$ns1"
ip -n "$ns0" addr add 10.77.0.1/24 dev "$v0"
ip -n "$ns1" addr add 10.77.0.2/24 dev "$v1"
for ns in "$ns0" "$ns1"; do ip -n "$ns" link set lo up; done
ip -n "$ns0" link set "$v0" up
ip -n "$ns1" link set "$v1" up

"$COLOSSAL" data prepare-recipe "$RECIPE" >/dev/null
export OMP_NUM_THREADS=1
echo "two_node_check: one process, batch 8"
"$COLOSSAL" train "$RECIPE" "${DP_ARGS[@]}" --set train.batch_size=8 --set "output.dir=$TMP/one"
echo "two_node_check: two nodes ($ns0 at 10.77.0.1, $ns1 at 10.77.0.2), batch 4 each"
node() {   # node RANK NAMESPACE IFACE
  ip netns exec "$2" "$COLOSSAL" train "$RECIPE" "${DP_ARGS[@]}" --set train.batch_size=4 --set "output.dir=$TMP/two" \
    --set parallel.timeout_s=60 --nproc-per-node 1 --nnodes 2 --node-rank "$1" --master-addr 10.77.0.1 \
    --master-port 29517 --iface "$3"
}
node 0 "$ns0" "$v0" >"$TMP/node0.log" 2>&1 &
p0=$!
node 1 "$ns1" "$v1" >"$TMP/node1.log" 2>&1 &
p1=$!
rc=0
wait "$p0" || rc=$?
wait "$p1" || rc=$?
if ((rc != 0)); then
  echo "two_node_check: error: the two-node run failed (exit $rc); node logs:" >&2
  tail -n 5 "$TMP/node0.log" "$TMP/node1.log" >&2
  exit 1
fi
grep -h "done:" "$TMP/node0.log" || true
"$PY" scripts/dist/compare_weights.py "$TMP/two" "$TMP/one" 1e-6
