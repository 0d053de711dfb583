#!/usr/bin/env bash
# Multi-host for real on one machine: two network namespaces joined by a veth pair are two
# hosts, each running `stratbench launch -n 2` (node 0 serves the store); together they run the
# smoke suite's 2x2 and 4-rank meshes as 2 hosts x 2 ranks over the veth link. The records
# must equal a threads run's in numerics and communication, and the link's byte counters must
# show the traffic crossed it. Needs root (network namespaces); skips with the reason
# otherwise. Usage: ci/multihost_test.sh BUILD_DIR SOURCE_DIR
set -uo pipefail
build=$1
src=$2
sb="$build/stratbench"
source "$src/ci/test_lib.sh"

skip() {
  echo "SKIP: $*"
  exit 0
}
[ "$(id -u)" -eq 0 ] || skip "needs root to create network namespaces (running as $(id -un))"
command -v ip >/dev/null || skip "needs the ip command (Debian's iproute2)"
"$sb" run --help | grep -q gloo || skip "this build has no gloo backend"

a=sbhostA$$
b=sbhostB$$
cleanup() {
  pkill -9 -f -- "$tmp" 2>/dev/null
  ip netns del "$a" 2>/dev/null
  ip netns del "$b" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
ip netns add "$a" && ip netns add "$b" || skip "cannot create network namespaces here"
ip link add "veth$$a" type veth peer name "veth$$b" || skip "cannot create a veth pair here"
ip link set "veth$$a" netns "$a"
ip link set "veth$$b" netns "$b"
ip -n "$a" addr add 10.213.0.1/24 dev "veth$$a"
ip -n "$b" addr add 10.213.0.2/24 dev "veth$$b"
for ns in "$a" "$b"; do
  ip -n "$ns" link set lo up
done
ip -n "$a" link set "veth$$a" up
ip -n "$b" link set "veth$$b" up

check "threads reference run" 0 "total +[0-9]+ +0 +0" -- \
  "$sb" run "$src/suites/smoke.yaml" --out "$tmp/threads" --repetitions 2

tx_before=$(ip netns exec "$a" cat "/sys/class/net/veth$$a/statistics/tx_bytes")
launch() {  # launch NODE_RANK NAMESPACE
  ip netns exec "$2" "$sb" launch -n 2 --nnodes 2 --node-rank "$1" --master-addr 10.213.0.1 \
    --master-port 29731 --timeout 60 -- run "$src/suites/smoke.yaml" --backend gloo \
    --out "$tmp/node$1" --repetitions 2 --timeout 60
}
launch 0 "$a" >"$tmp/node0.log" 2>&1 &
n0=$!
launch 1 "$b" >"$tmp/node1.log" 2>&1 &
n1=$!
wait "$n0"
rc0=$?
wait "$n1"
rc1=$?
tx_after=$(ip netns exec "$a" cat "/sys/class/net/veth$$a/statistics/tx_bytes")
if [ "$rc0" -eq 0 ] && [ "$rc1" -eq 0 ] && grep -qE "total +[0-9]+ +0 +0" "$tmp/node0.log" &&
   grep -q "4 ranks on gloo (launcher stratbench, store 10.213.0.1:29731" "$tmp/node0.log"; then
  pass "2 hosts x 2 ranks: the smoke suite passes"
else
  cat "$tmp/node0.log" "$tmp/node1.log" | tail -20 >"$tmp/out"
  fail "2 hosts x 2 ranks: exit codes $rc0 and $rc1"
fi
[ ! -e "$tmp/node1/results.csv" ] && pass "only rank 0 (node 0) wrote results" ||
  fail "node 1 wrote results"
check "records equal the threads run's" 0 "rows compared" -- \
  python3 "$src/ci/compare_results.py" "$tmp/threads/results.csv" "$tmp/node0/results.csv"
sent=$((tx_after - tx_before))
[ "$sent" -gt 1000000 ] && pass "the veth link carried $sent bytes from host A" ||
  fail "the veth link carried only $sent bytes"
finish
