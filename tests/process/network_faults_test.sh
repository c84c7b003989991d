#!/usr/bin/env bash
# Real processes on four test hosts, each a network namespace on one bridge, whose links lose 5% of
# the packets and delay each by 20 ms (tc netem): the Fashion-MNIST cluster (1 ps, 2 workers, the
# chief) still completes its training, every step runs and the model converges.
# A kernel without netem cannot delay packets: the links then only lose 5% of what arrives
# (nftables), and the test says so. Without root (namespaces) or either tool, it says why and is
# skipped (exit 77), not passed.
# usage: network_faults_test.sh FASHION_MNIST
set -uo pipefail
example=$1
skip() { echo "SKIPPED: $1"; exit 77; }

[ "$(id -u)" -eq 0 ] || skip "creating network namespaces needs root"
command -v ip > /dev/null && command -v tc > /dev/null || skip "ip and tc (iproute2) are not installed"
tag=psft$$
if ! ip netns add "${tag}probe" 2> /dev/null; then skip "this machine does not allow network namespaces"; fi
no_netem=$(ip netns exec "${tag}probe" tc qdisc add dev lo root netem delay 1ms 2>&1) && impairment=netem
if [ -z "${impairment:-}" ] && command -v nft > /dev/null &&
  ip netns exec "${tag}probe" nft add table inet probe 2> /dev/null; then
  impairment=nftables
fi
ip netns del "${tag}probe"
case "${impairment:-}" in
  netem) faults="5% loss and 20 ms delay (tc netem)" ;;
  nftables) faults="5% loss (nftables); NOT delayed: this kernel has no netem (tc says: $no_netem)" ;;
  *) skip "this kernel has no netem (tc says: $no_netem) and nftables is not usable" ;;
esac
echo "links between the test hosts: $faults"

source "$(dirname "$0")/checks.sh"
hosts=(ps0 worker0 worker1 chief)
cleanup() {
  kill -9 $(jobs -p) 2> /dev/null
  wait 2> /dev/null
  for h in "${hosts[@]}"; do ip netns del "$tag-$h" 2> /dev/null; done
  ip netns del "$tag-switch" 2> /dev/null
  rm -rf "$work"
}
trap cleanup EXIT

# A switch namespace with a bridge; host i is 10.231.0.(i+1) behind a veth pair whose host end
# delays and drops what it sends.
ip netns add "$tag-switch"
ip -n "$tag-switch" link add br0 type bridge
ip -n "$tag-switch" link set br0 up
for i in "${!hosts[@]}"; do
  ns=$tag-${hosts[$i]}
  ip netns add "$ns"
  ip link add "v$tag$i" type veth peer name "p$tag$i"
  ip link set "v$tag$i" netns "$ns"
  ip link set "p$tag$i" netns "$tag-switch"
  ip -n "$tag-switch" link set "p$tag$i" master br0 up
  ip -n "$ns" link set lo up
  ip -n "$ns" addr add "10.231.0.$((i + 1))/24" dev "v$tag$i"
  ip -n "$ns" link set "v$tag$i" up
  if [ "$impairment" = netem ]; then
    ip netns exec "$ns" tc qdisc add dev "v$tag$i" root netem delay 20ms loss 5%
  else
    ip netns exec "$ns" nft add table inet faults
    ip netns exec "$ns" nft add chain inet faults in '{ type filter hook input priority 0; }'
    ip netns exec "$ns" nft add rule inet faults in iifname "v$tag$i" numgen random mod 100 '<' 5 counter drop
  fi
done
faulty_links() {
  for i in "${!hosts[@]}"; do
    tc -n "$tag-${hosts[$i]}" qdisc show dev "v$tag$i"
    ip netns exec "$tag-${hosts[$i]}" nft list ruleset 2> /dev/null
  done | grep -cE 'netem|numgen random mod 100 < 5 counter'
}
check "every host's link is faulty ($faults)" test "$(faulty_links)" -eq 4

# The hosts listen on their own addresses, not loopback: the tasks must share a cluster secret.
export PSCORO_AUTH_SECRET_FILE="$work/cluster-secret"
(umask 077; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$PSCORO_AUTH_SECRET_FILE")
cluster='{"chief": ["10.231.0.4:2222"], "ps": ["10.231.0.1:2222"], "worker": ["10.231.0.2:2222", "10.231.0.3:2222"]}'
config() { echo "{\"cluster\": $cluster, \"task\": {\"type\": \"$1\", \"index\": $2}}"; }
ip netns exec "$tag-ps0" env TF_CONFIG="$(config ps 0)" "$example" > "$work/ps0.log" 2>&1 &
ip netns exec "$tag-worker0" env TF_CONFIG="$(config worker 0)" "$example" > "$work/worker0.log" 2>&1 &
ip netns exec "$tag-worker1" env TF_CONFIG="$(config worker 1)" "$example" > "$work/worker1.log" 2>&1 &
start=$(date +%s)
ip netns exec "$tag-chief" env TF_CONFIG="$(config chief 0)" timeout 900 "$example" --steps 300 --log-every 50 \
  --count-runs --min-accuracy 0.70 > "$work/chief.log" 2>&1
code=$?
echo "training over the lossy links took $(($(date +%s) - start)) s"
check "the chief exits 0 (got $code)" test "$code" -eq 0
check "every result resolves, up to the last step" grep -qE "$(line_of chief:0)"'chief: step 300/300 loss ' "$work/chief.log"
check "every step ran" grep -qE "$(line_of chief:0)"'chief: steps 1-300 ran: [0-9]+ once, [0-9]+ again after a worker was lost, 0 never$' \
  "$work/chief.log"
check "the model converges" grep -qE "$(line_of chief:0)"'chief: test accuracy 0\.[7-9][0-9]+ on 10000 images$' "$work/chief.log"
grep -E 'chief: (steps|test accuracy)|lost|back' "$work/chief.log"
dropped=$(for h in "${hosts[@]}"; do ip netns exec "$tag-$h" nft list ruleset 2> /dev/null; done |
  sed -nE 's/.*counter packets ([0-9]+).*/\1/p' | awk '{ n += $1 } END { if (NR) print n }')
[ -n "$dropped" ] && echo "packets dropped on the links: $dropped"
[ "$failed" -eq 0 ] || tail -n 30 "$work"/*.log

finish
