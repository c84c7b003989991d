#!/usr/bin/env bash
# Real processes: the DLRM example (libtorch on the workers, the embedding table sharded over 2 ps)
# trains a small version of itself on the CTR example's generated data, asynchronously with 4
# closures per worker, then its single-process libtorch reference; checks what the chief prints,
# that the cluster's AUC is near the reference's, that the workers' model pools never grew past
# the closures in flight; with one worker and one closure at a time, that the cluster takes the
# reference's steps (the same mean losses, AUC and live hidden units), and that the chief exits 1
# when the AUC misses the bound; and that the 2-thread reference trains, or is refused naming why.
# usage: dlrm_test.sh PSCORO_LAUNCH DLRM
set -uo pipefail
launch=$1
example=$2
source "$(dirname "$0")/checks.sh"

small=(--data-dir "$work/data" --train-examples 20000 --files 4 --rows 16384 --batch-size 128 --test-examples 5000 --warmup-steps 50 --learning-rate 0.1
       --log-every 50)

echo "--- 2 ps, 2 workers, 4 closures each, 300 steps; then the reference in the chief's process"
"$launch" --ps 2 --workers 2 -- "$example" "${small[@]}" --steps 300 --closures-per-worker 4 --max-auc-gap 0.2 \
  --max-reference-gap 0.1 > "$work/run.log" 2>&1
code=$?
check "the cluster exits 0 (got $code)" test "$code" -eq 0
check "the table is split over both ps, the MLPs' 8 parameters are variables" \
  grep -qE "$(line_of chief:0)"'chief: embedding 16384 x \(16 \+ 1\) in 2 shards; MLPs 13-64-16 and 367-64-1 over 351 dot products \([0-9]+ parameters in 8 variables\); 300 steps of 128 examples on 2 workers$' \
  "$work/run.log"
check "the chief prints the test AUC and the bound on one line" \
  grep -qE "$(line_of chief:0)"'chief: test AUC 0\.[0-9]{4} \(bound 0\.[0-9]{4}\)$' "$work/run.log"
check "and the cluster's and the reference's AUC and steps/s side by side" \
  test "$(grep -cE "$(line_of chief:0)"'chief: (cluster \(2 workers, asynchronous\)|reference \(one process, libtorch\)): +test AUC 0\.[0-9]{4} +[0-9.]+ steps/s' "$work/run.log")" -eq 2
check "the reference trains too (its losses print)" grep -qE "$(line_of chief:0)"'chief: reference step 300/300 loss [0-9.]+ [0-9.]+ steps/s done in [0-9:]+s?$' \
  "$work/run.log"
check "and how many of the MLPs' hidden units fire on the test set, for both" \
  test "$(grep -cE "$(line_of chief:0)"'chief: (cluster|reference): [0-9]+ of 64 bottom-MLP and [0-9]+ of 64 top-MLP hidden units fire on the test set$' "$work/run.log")" -eq 2
auc=$(sed -nE "s/$(line_of chief:0)"'chief: test AUC (0\.[0-9]+) \(bound (0\.[0-9]+)\)$/\1/p' "$work/run.log")
bound=$(sed -nE "s/$(line_of chief:0)"'chief: test AUC (0\.[0-9]+) \(bound (0\.[0-9]+)\)$/\2/p' "$work/run.log")
check "it learned: AUC $auc, bound $bound" awk -v a="${auc:-0}" 'BEGIN { exit !(a > 0.62) }'
made=$(grep -cE "$(line_of 'worker:[01]')"'worker: model [0-9]+ made' "$work/run.log")
most=$(sed -nE "s/$(line_of 'worker:[01]')"'worker: model ([0-9]+) made.*/\1/p' "$work/run.log" | sort -n | tail -1)
check "each worker made at most 4 models, one per step in flight (made $made, at most ${most:-0} on one)" \
  test "$made" -ge 2 -a "${most:-0}" -le 4
[ "$failed" -eq 0 ] || cat "$work/run.log"
grep -E 'AUC|model' "$work/run.log"

echo "--- 1 worker, 1 closure at a time: the reference's steps exactly; an AUC below the bound exits 1"
# The reference reads the files as a single worker does, from the same initial values, so the two
# take the same steps; they differ only in the rounding of the two Adagrad implementations. Those
# steps include the first-order gradient's scale (x30 by default; with x1 on one side only, the mean
# losses of steps 1-50 would differ by ~0.02), so the check also says both sides apply it.
"$launch" --ps 2 --workers 1 -- "$example" "${small[@]}" --steps 100 --closures-per-worker 1 --max-auc-gap 0.0001 \
  > "$work/one.log" 2>&1
code=$?
check "the cluster exits 1 (got $code)" test "$code" -eq 1
check "the chief names the gap and the limit" \
  grep -qE "$(line_of chief:0)"'chief: the AUC gap 0\.[0-9]{4} to the bound is above the allowed 0\.000$' "$work/one.log"
losses() {  # losses PREFIX: the mean losses the chief printed for the cluster ("step") or the reference
  sed -nE "s/$(line_of chief:0)chief: $1 [0-9]+\/100 loss ([0-9.]+) [0-9.]+ steps\/s .*$/\1/p" "$work/one.log" |
    tr '\n' ' '
}
cluster_losses=$(losses step)
reference_losses=$(losses 'reference step')
check "the same mean losses over steps 1-50 and 51-100 (cluster $cluster_losses, reference $reference_losses)" \
  awk -v c="$cluster_losses" -v r="$reference_losses" 'BEGIN {
    n = split(c, a, " "); m = split(r, b, " "); if (n != 2 || m != 2) exit 1
    for (i = 1; i <= n; i++) if (a[i] - b[i] > 0.002 || b[i] - a[i] > 0.002) exit 1 }'
aucs=$(sed -nE "s/$(line_of chief:0)"'chief: (cluster|reference) .* test AUC (0\.[0-9]+) .*/\2/p' "$work/one.log" | tr '\n' ' ')
check "and the same test AUC ($aucs)" awk -v x="$aucs" 'BEGIN { split(x, a, " "); d = a[1] - a[2]; exit !(a[1] > 0 && d < 0.002 && d > -0.002) }'
units() {  # units WHO: the chief's line on the live hidden units of the cluster or the reference
  sed -nE "s/$(line_of chief:0)chief: $1: (.*) hidden units fire on the test set$/\1/p" "$work/one.log"
}
check "the same hidden units fire (cluster: $(units cluster); reference: $(units reference))" \
  test -n "$(units cluster)" -a "$(units cluster)" = "$(units reference)"
check "one model made" test "$(grep -c 'worker: model [0-9]* made' "$work/one.log")" -eq 1
[ "$failed" -eq 0 ] || cat "$work/one.log"

echo "--- the reference on 2 threads: trained as 2 workers do, or refused, naming why, on a BLAS that cannot multiply on 2 threads"
"$example" --reference-only --threaded-reference 2 "${small[@]}" --steps 100 --max-auc-gap 0.3 > "$work/threads.log" 2>&1
code=$?
if [ "$code" -eq 2 ]; then
  check "refused: OpenBLAS's serial build is named, and the build to use" \
    grep -q "OpenBLAS's serial build (Debian's libopenblas0-serial), which then returns wrong products; .*install libopenblas0-pthread" "$work/threads.log"
else
  check "it exits 0 (got $code)" test "$code" -eq 0
  check "and reports both references" \
    test "$(grep -cE "$(line_of -)"'chief: reference \(one process, (libtorch|2 threads)\): +test AUC 0\.[0-9]{4}' "$work/threads.log")" -eq 2
fi
[ "$failed" -eq 0 ] || cat "$work/threads.log"

finish
