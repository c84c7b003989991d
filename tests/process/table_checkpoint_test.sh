#!/usr/bin/env bash
# Real processes: a hash table trained by a chief on 2 ps, checkpointed every 20 steps, one save in
# three whole and the others increments; one ps is killed (kill -9) after an increment, the job
# fails naming it, and a new job on 3 ps resumes from the newest checkpoint through its chain (the
# whole save, then each increment). It ends with exactly the table of a run never interrupted and
# saved whole: every row, its Adagrad slot, when it was last named and the clock came back
# (tests/process/table_trainer.cpp).
# usage: table_checkpoint_test.sh PSCORO_LAUNCH TABLE_TRAINER
set -uo pipefail
launch=$1
trainer=$2
here=$(dirname "$0")
source "$here/checks.sh"

steps=120
digest_of() { sed -nE "s/$(line_of chief:0)"'table_trainer: digest ([0-9a-f]{16}) of [0-9]+ rows held$/\1/p' "$1"; }

echo "--- a run of $steps steps on 2 ps, never interrupted"
"$launch" --ps 2 --workers 1 -- "$trainer" --steps "$steps" --checkpoint-dir "$work/whole" > "$work/whole.log" 2>&1
code=$?
check "it exits 0 (got $code)" test "$code" -eq 0
whole=$(digest_of "$work/whole.log")
check "it prints the table's digest" test -n "$whole"
grep -E 'digest' "$work/whole.log"

echo "--- the same run with incremental saves, ps:1 killed after the step-40 checkpoint"
"$launch" --ps 2 --workers 1 -- "$trainer" --steps "$steps" --checkpoint-dir "$work/ckpt" --full-every 3 \
  --step-delay-ms 20 > "$work/killed.log" 2>&1 &
launcher=$!
increment_40="table_trainer: saved $work/ckpt/ckpt-40.safetensors \\(an increment on $work/ckpt/ckpt-20.safetensors\\)"
if check "it saves step 40 as an increment on step 20" wait_for "$work/killed.log" "$increment_40" 300; then
  kill -9 "$(pid_of "$work/killed.log" ps-1)"
  wait_exit "$launcher"
  check "the job fails (got $code)" test "$code" -ne 0
  check "the chief's error names ps:1" grep -qE "$(line_of chief:0)"'table_trainer: .*ps:1' "$work/killed.log"
  check "it did not finish" test -z "$(digest_of "$work/killed.log")"
else
  kill -9 "$launcher" 2>/dev/null
fi
newest=$(ls "$work/ckpt" | sed -nE 's/^ckpt-([0-9]+)\.safetensors$/\1/p' | sort -n | tail -n 1)
echo "the newest checkpoint is step ${newest:-none}"

echo "--- a new job on 3 ps resumes from it and ends with the same table"
"$launch" --ps 3 --workers 1 -- "$trainer" --steps "$steps" --checkpoint-dir "$work/ckpt" > "$work/resumed.log" 2>&1
code=$?
check "it exits 0 (got $code)" test "$code" -eq 0
check "it resumed from step ${newest:-?} on 3 ps" \
  grep -qE "$(line_of chief:0)table_trainer: resumed from $work/ckpt/ckpt-${newest:-x}.safetensors at step ${newest:-x} on 3 ps$" \
  "$work/resumed.log"
resumed=$(digest_of "$work/resumed.log")
grep -E 'resumed|digest' "$work/resumed.log"
check "its table is the uninterrupted run's (digest $resumed, $whole)" test -n "$resumed" -a "$resumed" = "$whole"
[ "$failed" -eq 0 ] || cat "$work/whole.log" "$work/killed.log" "$work/resumed.log"
finish
