#!/usr/bin/env bash
# Real processes: the Fashion-MNIST cluster saves checkpoints while the sidecar evaluator evaluates
# each one; an independent reader (Debian's python3 + numpy, from the safetensors spec) agrees with
# the evaluator's accuracy; a restarted chief resumes from the newest checkpoint at its step; a
# process killed mid-save leaves the previous checkpoints intact and restorable; a checkpoint
# stripped of its checksums, with a flipped byte, is refused instead of restored.
# usage: checkpoint_test.sh PSCORO_LAUNCH FASHION_MNIST EVALUATOR CHECKPOINT_WRITER
set -uo pipefail
launch=$1
example=$2
evaluator=$3
writer=$4
here=$(dirname "$0")
data=/usr/share/datasets/fashion-mnist
source "$here/checks.sh"

echo "--- training saves a checkpoint every 250 steps; the evaluator evaluates each one"
"$evaluator" --checkpoint-dir "$work/ckpt" --until-step 1000 --timeout 300 > "$work/eval.log" 2>&1 &
evaluator_pid=$!
"$launch" --ps 2 --workers 2 -- "$example" --steps 1000 --checkpoint-dir "$work/ckpt" --checkpoint-every 250 \
  --max-to-keep 2 --log-every 500 --min-accuracy 0.75 > "$work/run.log" 2>&1
code=$?
check "the cluster exits 0 (got $code)" test "$code" -eq 0
wait "$evaluator_pid"
code=$?
check "the evaluator exits 0 after the step-1000 checkpoint (got $code)" test "$code" -eq 0
for step in 250 500 750 1000; do
  check "the chief saved step $step" grep -qE "$(line_of chief:0)chief: saved $work/ckpt/ckpt-$step.safetensors$" "$work/run.log"
done
check "the newest 2 are kept" test "$(ls "$work/ckpt" | tr '\n' ' ')" = "ckpt-1000.safetensors ckpt-750.safetensors "
check "the evaluator evaluated the last one" \
  grep -qE "$(line_of -)"'evaluator: ckpt-1000.safetensors step 1000 test accuracy 0\.[0-9]{4} on 10000 images$' "$work/eval.log"
chief_accuracy=$(sed -nE "s/$(line_of chief:0)"'chief: test accuracy (0\.[0-9]+) on 10000 images$/\1/p' "$work/run.log")
evaluator_accuracy=$(sed -nE "s/$(line_of -)"'evaluator: ckpt-1000.safetensors step 1000 test accuracy (0\.[0-9]+) .*/\1/p' "$work/eval.log")
check "the evaluator's accuracy is the chief's ($evaluator_accuracy, $chief_accuracy)" \
  test -n "$chief_accuracy" -a "$evaluator_accuracy" = "$chief_accuracy"
check "an independent reader agrees" /usr/bin/python3 "$here/read_checkpoint.py" "$work/ckpt/ckpt-1000.safetensors" \
  "$data" "${evaluator_accuracy:-0}" 1000
[ "$failed" -eq 0 ] || { cat "$work/run.log" "$work/eval.log"; }

echo "--- a new chief resumes from the newest checkpoint at its step"
"$launch" --ps 2 --workers 2 -- "$example" --steps 1500 --checkpoint-dir "$work/ckpt" --checkpoint-every 250 \
  --max-to-keep 2 --log-every 500 --min-accuracy 0.75 > "$work/resume.log" 2>&1
code=$?
check "the cluster exits 0 (got $code)" test "$code" -eq 0
check "it resumes at step 1000" \
  grep -qE "$(line_of chief:0)chief: resumed from $work/ckpt/ckpt-1000.safetensors at step 1000$" "$work/resume.log"
check "it runs steps 1001 to 1500 only" \
  test "$(grep -cE "$(line_of chief:0)"'chief: saved' "$work/resume.log")" -eq 2 -a \
  "$(grep -cE "$(line_of chief:0)"'chief: step 500/' "$work/resume.log")" -eq 0
check "it saved step 1500" test -f "$work/ckpt/ckpt-1500.safetensors"
[ "$failed" -eq 0 ] || cat "$work/resume.log"

echo "--- kill -9 in the middle of a save: the previous checkpoints are intact"
mkdir -p "$work/crash"
caught=0
for attempt in 1 2 3; do
  rm -rf "$work/crash"/*
  "$writer" save "$work/crash" > "$work/writer.log" 2>&1 &
  writer_pid=$!
  # A temporary file exists only while a save runs; kill as soon as one shows after a complete save.
  for _ in $(seq 3000); do
    if ls "$work/crash" 2>/dev/null | grep -q '\.safetensors$' && ls "$work/crash" | grep -q '\.tmp-'; then
      kill -9 "$writer_pid"
      break
    fi
    sleep 0.01
  done
  kill -9 "$writer_pid" 2>/dev/null
  wait "$writer_pid" 2>/dev/null
  if ls "$work/crash" | grep -q '\.tmp-'; then caught=1; break; fi
done
check "the writer was killed mid-save (a temporary file remains)" test "$caught" -eq 1
ls -l "$work/crash"
"$writer" verify "$work/crash" > "$work/verify.log" 2>&1
code=$?
cat "$work/verify.log"
check "every complete checkpoint reads back and the newest restores (exit $code)" test "$code" -eq 0
check "the next manager removed the dead save's temporary file" test "$(ls "$work/crash" | grep -c '\.tmp-')" -eq 0

echo "--- a checkpoint stripped of its checksums, a byte of its table flipped: refused, never restored"
mkdir -p "$work/stripped"
newest=$(ls "$work/crash"/ckpt-*.safetensors | sort -V | tail -n 1)
stripped="$work/stripped/$(basename "$newest")"
/usr/bin/python3 - "$newest" "$stripped" <<'EOF'
import json, struct, sys
import crc32c
raw = open(sys.argv[1], "rb").read()
(n,) = struct.unpack_from("<Q", raw, 0)
header = json.loads(raw[8:8 + n])
del header["__metadata__"]["crc32c"]
header["__metadata__"]["header_crc32c"] = "00000000"
text = json.dumps(header, separators=(",", ":")).encode()
text += b" " * (-len(text) % 8)
# Signed again, as a tool that rewrote the header on purpose would: what is wrong is the record.
prefix = struct.pack("<Q", len(text))
at = text.index(b'"header_crc32c":"') + len(b'"header_crc32c":"')
text = text[:at] + b"%08x" % crc32c.crc32c(prefix + text) + text[at + 8:]
data = bytearray(raw[8 + n:])
data[len(data) // 2] ^= 0x10  # in the middle of the table
open(sys.argv[2], "wb").write(prefix + text + bytes(data))
EOF
"$writer" verify "$work/stripped" > "$work/stripped.log" 2>&1
code=$?
cat "$work/stripped.log"
check "the stripped checkpoint is refused (exit $code)" test "$code" -ne 0
check "as data loss naming the file and the missing record" \
  grep -qF "checkpoint $stripped: __metadata__ has no \"crc32c\" record" "$work/stripped.log"

finish
