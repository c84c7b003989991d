#!/usr/bin/env bash
# Real processes: the hello_cluster example under pscoro-launch, on clusters of several sizes. The
# results the chief prints and the total it reads back from the ps are checked against sums
# computed here.
# usage: hello_cluster_test.sh PSCORO_LAUNCH HELLO_CLUSTER
set -uo pipefail
launch=$1
example=$2
source "$(dirname "$0")/checks.sh"

for cluster in "1 1 1" "2 2 10" "2 3 25"; do
  read -r ps workers steps <<< "$cluster"
  echo "--- $ps ps, $workers workers, $steps closures"
  "$launch" --ps "$ps" --workers "$workers" -- "$example" "$steps" > "$work/run.log" 2>&1
  code=$?
  check "the launcher exits 0 with the chief (got $code)" test "$code" -eq 0
  results=$(seq -s ' ' 6 6 $((6 * steps)))  # closure k adds k * (1 + 2 + 3), k = 1..steps
  total=$((3 * steps * (steps + 1)))         # their sum
  check "the chief prints every result, in order: $results" \
    grep -qE "$(line_of chief:0)chief: $steps closures on $workers workers returned $results\$" "$work/run.log"
  check "the total, on the next ps after the weights', is their sum $total" \
    grep -qE "$(line_of chief:0)chief: total on ps:$((1 % ps)) is $total, the sum of the results $total\$" "$work/run.log"
  [ "$failed" -eq 0 ] || cat "$work/run.log"
done

finish
