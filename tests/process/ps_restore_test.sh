#!/usr/bin/env bash
# Real processes: the Fashion-MNIST cluster with --on-ps-loss restore; ps:1 (the bias) is killed
# with kill -9 after a checkpoint and pscoro-launch --restart-ps starts it again at its address.
# The same chief restores ps:1 alone from the newest checkpoint and finishes the run: the accuracy
# is reached, and every step ran (the --count-runs table on ps:0, not in any checkpoint, was never
# rolled back: no step is counted less than once). Then the CTR example on raw ids and hash tables,
# saved incrementally: ps:1 killed after a save, restored from the newest file through its chain,
# and the run ends with its test AUC. Last the CTR example on 1M-row tables, large enough that a
# save and a restore take a while: ps:1 killed during a save, then its replacement killed during its
# restore; the same chief waits for it again, restores it from the newest complete checkpoint and
# makes the interrupted save again (PSCORO_PS_RESTORE_CTR=0: not the CTR parts).
# usage: ps_restore_test.sh PSCORO_LAUNCH FASHION_MNIST CTR
set -uo pipefail
launch=$1
example=$2
ctr=$3
source "$(dirname "$0")/checks.sh"
# 3000 steps, a checkpoint every 500; the sanitizer build asks for fewer (both reach the accuracy).
steps=${PSCORO_PS_RESTORE_STEPS:-3000}
every=$((steps / 6))

log=$work/run.log
"$launch" --ps 2 --workers 2 --restart-ps -- "$example" --steps "$steps" --log-every 100 --count-runs \
  --checkpoint-dir "$work/ckpt" --checkpoint-every "$every" --on-ps-loss restore > "$log" 2>&1 &
launcher=$!
if check "it saves step $((2 * every))" wait_for "$log" "$(line_of chief:0)chief: saved $work/ckpt/ckpt-$((2 * every)).safetensors$"; then
  chief=$(pid_of "$log" chief)
  kill -9 "$(pid_of "$log" ps-1)"
  newest=$(ls "$work/ckpt" | sed -nE 's/^ckpt-([0-9]+)\.safetensors$/\1/p' | sort -n | tail -n 1)
  wait_exit "$launcher" 300
  check "the job exits 0 (got $code)" test "$code" -eq 0
  check "the launcher started ps-1 again" grep -qE "$(line_of launcher)"'restarting ps-1 in' "$log"
  check "the chief was never started again" test "$(grep -cE "$(line_of launcher)"'started chief' "$log")" -eq 1
  check "the same chief ($chief) restored ps:1 from the newest checkpoint at the kill (step $newest)" \
    grep -qE "$(line_of chief:0)chief: ps:1 restored from $work/ckpt/ckpt-$newest.safetensors \(step $newest\) in [0-9.]+ s$" "$log"
  check "every step ran at least once" grep -qE "$(line_of chief:0)chief: steps 1-$steps ran: [0-9]+ once, [0-9]+ again after a worker was lost, 0 never$" "$log"
  check "the model converges (accuracy >= 0.80)" grep -qE "$(line_of chief:0)"'chief: test accuracy 0\.[89]' "$log"
else
  kill -9 "$launcher" 2>/dev/null
fi
grep -E 'restor|lost|saved|test accuracy|ran:' "$log" | grep -E '(WARNING|ERROR) \[|\] chief: '
[ "$failed" -eq 0 ] || cat "$log"
[ "${PSCORO_PS_RESTORE_CTR:-1}" = 1 ] || finish

echo "--- the CTR example on hash tables, saved incrementally (one save in 3 whole)"
ctr_log=$work/ctr.log
# 30,000 raw-id lines, 105 steps of 256; a save every 20 steps. The model's quality is ctr_hash's
# to check: a loose bound.
"$launch" --ps 2 --workers 2 --restart-ps -- "$ctr" --ids raw --embedding hash --data-dir "$work/data" \
  --train-examples 30000 --files 2 --batch-size 256 --test-examples 5000 --max-auc-gap 0.5 --log-every 20 \
  --checkpoint-dir "$work/ctr-ckpt" --checkpoint-every 20 --full-every 3 --on-ps-loss restore > "$ctr_log" 2>&1 &
launcher=$!
if check "it saves step 60 (an increment on 40, itself on the whole save of 20)" \
  wait_for "$ctr_log" "$(line_of chief:0)chief: saved $work/ctr-ckpt/ckpt-60.safetensors$"; then
  kill -9 "$(pid_of "$ctr_log" ps-1)"
  wait_exit "$launcher" 300
  check "the job exits 0 (got $code)" test "$code" -eq 0
  # The newest save before the restore (a save under way at the kill may still end: it read ps:1
  # before; one that meets the loss is made again after the restore).
  newest=$(sed -nE -e '/is back and restored/q' -e "s/$(line_of chief:0)"'chief: saved .*ckpt-([0-9]+)\.safetensors$/\1/p' "$ctr_log" | tail -n 1)
  check "the same chief restored ps:1's table parts from the newest checkpoint (step $newest)" \
    grep -qE "$(line_of chief:0)chief: ps:1 restored from $work/ctr-ckpt/ckpt-$newest.safetensors \(step $newest\) in [0-9.]+ s$" \
    "$ctr_log"
  check "and finished: its test AUC is printed" grep -qE "$(line_of chief:0)"'chief: test AUC 0\.[0-9]{4}' "$ctr_log"
else
  kill -9 "$launcher" 2>/dev/null
fi
grep -E 'restor|lost|saved|test AUC' "$ctr_log" | grep -E '(WARNING|ERROR) \[|\] chief: '
[ "$failed" -eq 0 ] || cat "$ctr_log"

echo "--- the CTR example on 1M-row tables (136 MB a checkpoint): ps:1 killed during a save, then during its restore"
big_log=$work/big.log
"$launch" --ps 2 --workers 2 --restart-ps -- "$ctr" --data-dir "$work/data" --train-examples 30000 --files 2 \
  --batch-size 256 --steps 300 --test-examples 5000 --max-auc-gap 0.5 --log-every 20 \
  --checkpoint-dir "$work/big-ckpt" --checkpoint-every 20 --on-ps-loss restore > "$big_log" 2>&1 &
launcher=$!
# rss_kib PID: the resident memory of a process, in KiB (0 once it is gone).
rss_kib() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status" 2>/dev/null || echo 0; }
if check "it saves step 20" wait_for "$big_log" "$(line_of chief:0)chief: saved $work/big-ckpt/ckpt-20.safetensors$"; then
  # A save runs while its temporary file exists: ps:1 is stopped then, and killed with the save under way.
  victim=$(pid_of "$big_log" ps-1)
  for _ in $(seq 6000); do
    if ls "$work/big-ckpt" | grep -q '\.tmp-'; then stop_process "$victim"; break; fi
    sleep 0.01
  done
  check "ps:1 stopped while a save was under way (its temporary file is there)" \
    test -n "$(ls "$work/big-ckpt" | grep '\.tmp-')"
  newest=$(ls "$work/big-ckpt" | sed -nE 's/^ckpt-([0-9]+)\.safetensors$/\1/p' | sort -n | tail -n 1)
  kill -9 "$victim"
  continue_process "$victim" 2> /dev/null
  # Its replacement: stopped once it holds 16 MiB more than when it started listening (the chief is
  # making its shards again or restoring them, which takes a fraction of a second: polled every
  # 10 ms), then killed before the restore can end.
  second=
  for _ in $(seq 6000); do
    second=$(pid_of "$big_log" ps-1)
    [ "$second" != "$victim" ] && grep -qE "$(line_of ps:1)pscoro: ps:1 listening on " <(sed -n '/restarting ps-1/,$p' "$big_log") &&
      break
    sleep 0.01
  done
  check "ps-1 is started again, and listens" test -n "$second" -a "$second" != "$victim"
  idle=$(rss_kib "$second")
  for _ in $(seq 6000); do
    [ "$(rss_kib "$second")" -gt $((idle + 16384)) ] && { stop_process "$second"; break; }
    sleep 0.01
  done
  check "its replacement stopped while the chief was restoring it" \
    test "$(grep -c 'ps:1 is back and restored' "$big_log")" -eq 0 -a "$(rss_kib "$second")" -gt $((idle + 16384))
  kill -9 "$second"
  continue_process "$second" 2> /dev/null
  wait_exit "$launcher" 300
  check "the job exits 0 (got $code)" test "$code" -eq 0
  check "the save the kill met is made again" grep -qE "$(line_of chief:0 WARNING)checkpoint .*: a ps was lost during the save" "$big_log"
  check "the chief waited for ps:1 again when it was lost during its restore" \
    grep -qE "$(line_of chief:0 WARNING)ps:1 was lost again while being restored; waiting for it again$" "$big_log"
  check "and restored it from the newest complete checkpoint at the first kill (step $newest)" \
    grep -qE "$(line_of chief:0)chief: ps:1 restored from $work/big-ckpt/ckpt-$newest.safetensors \(step $newest\) in [0-9.]+ s$" \
    "$big_log"
  check "the launcher started ps-1 twice" grep -qE "$(line_of launcher)restarting ps-1 in 500 ms \(restart 2\)$" "$big_log"
  check "the run makes its last save" grep -qE "$(line_of chief:0)chief: saved $work/big-ckpt/ckpt-300.safetensors$" "$big_log"
  check "and ends with its test AUC" grep -qE "$(line_of chief:0)"'chief: test AUC 0\.[0-9]{4}' "$big_log"
  check "no temporary file is left in the checkpoint directory" test "$(ls "$work/big-ckpt" | grep -c '\.tmp-')" -eq 0
else
  kill -9 "$launcher" 2>/dev/null
fi
grep -E 'restor|lost|saved|test AUC' "$big_log" | grep -E '(WARNING|ERROR) \[|\] chief: ' | cut -c1-300
[ "$failed" -eq 0 ] || cat "$big_log"
finish
