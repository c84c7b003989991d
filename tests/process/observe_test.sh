#!/usr/bin/env bash
# Real processes: what a user sees of a run. Log lines carry an ISO-8601 UTC time, the
# level and the task, the chief's too; PSCORO_LOG_FORMAT=json makes every line a JSON object, the
# launcher's and the programs' own output (progress, results) included; a bad
# PSCORO_LOG_LEVEL is warned about. A TensorBoard event file read back by an independent reader
# (Python, Debian's python3-protobuf and python3-crc32c) holds exactly the scalars and histograms
# written; fashion_mnist --logdir writes its curves there and reports progress in plain lines, or
# in a bar redrawn on the launcher's terminal.
# usage: observe_test.sh PSCORO_LAUNCH HELLO_CLUSTER FASHION_MNIST WRITE_SUMMARIES PROTO_DIR
set -uo pipefail
launch=$1
hello=$2
fashion=$3
write_summaries=$4
proto_dir=$5
here=$(dirname "$0")
source "$here/checks.sh"
iso='[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3}Z'

echo "--- text log lines: time, level and task on every line, results and the launcher's included"
"$launch" --ps 1 --workers 1 -- "$hello" 3 > "$work/text.log" 2>&1
code=$?
check "the job exits 0 (got $code)" test "$code" -eq 0
check "the job runs" grep -q 'chief: total on ps:0' "$work/text.log"
check "the chief names itself" grep -qE "^$iso INFO \[chief:0\] connected to 1 ps and 1 workers$" "$work/text.log"
check "the servers name themselves" \
  grep -qE "^$iso INFO \[ps:0\] the chief \(chief:0 at [0-9.:]+\) ended the job with exit code 0: ps:0 stops$" \
  "$work/text.log"
check "every line has the form, the results' and the launcher's too" \
  test -s "$work/text.log" -a "$(grep -cvE "^$iso (DEBUG|INFO|WARNING|ERROR) \[((chief|ps|worker):[0-9]+|launcher)\] " "$work/text.log")" -eq 0

echo "--- PSCORO_LOG_FORMAT=json: one JSON object a line, every task's and the launcher's"
PSCORO_LOG_FORMAT=json PSCORO_LOG_LEVEL=debug "$launch" --ps 1 --workers 1 -- "$hello" 3 > "$work/json.log" 2>&1
code=$?
check "the job exits 0 (got $code)" test "$code" -eq 0
check "the job runs" grep -q 'chief: total on ps:0' "$work/json.log"
# json_lines LOG [PYTHON]: every line of LOG is a JSON log line, from the chief, ps:0, worker:0 and
# the launcher at least; PYTHON then checks the list `records` further.
json_lines() {
  /usr/bin/python3 - "$1" "${2:-}" <<'PY'
import json, re, sys
tasks = set()
lines = open(sys.argv[1]).read().splitlines()
assert lines, "no lines"
records = []
for line in lines:
    try:
        record = json.loads(line)
    except ValueError as e:
        sys.exit(f"not JSON ({e}): {line!r}")
    assert isinstance(record, dict) and list(record) == ["time", "level", "task", "message"], line
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", record["time"]), record
    assert record["level"] in ("DEBUG", "INFO", "WARNING", "ERROR"), record
    tasks.add(record["task"])
    records.append(record)
assert {"chief:0", "ps:0", "worker:0", "launcher"} <= tasks, tasks
exec(sys.argv[2])
print(f"{len(lines)} JSON lines from {sorted(tasks)}")
PY
}
check "every line is a JSON log line" json_lines "$work/json.log" '
messages = {(r["task"], r["message"]) for r in records}
assert any(t == "ps:0" and re.fullmatch(r"pscoro: ps:0 listening on 127\.0\.0\.1:\d+", m) for t, m in messages), messages
assert any(t == "launcher" and re.fullmatch(r"started chief \(pid \d+\)", m) for t, m in messages), messages
assert any(t == "chief:0" and m.startswith("chief: total on ps:0 is ") for t, m in messages), messages'
[ "$failed" -eq 0 ] || cat "$work/json.log"

echo "--- fashion_mnist under PSCORO_LOG_FORMAT=json: its progress and its results are JSON lines too"
PSCORO_LOG_FORMAT=json "$launch" --ps 2 --workers 2 -- "$fashion" --steps 300 --min-accuracy 0.5 > "$work/fashion-json.log" 2>&1
code=$?
check "the training exits 0 (got $code)" test "$code" -eq 0
check "every line is a JSON log line" json_lines "$work/fashion-json.log" '
chief = [r["message"] for r in records if r["task"] == "chief:0"]
assert any(re.fullmatch(r"chief: step 300/300 loss [0-9.]+ [0-9.]+ steps/s done in [0-9:]+s?", m) for m in chief), chief
assert any(re.fullmatch(r"chief: test accuracy 0\.[0-9]+ on 10000 images", m) for m in chief), chief
assert any(r["task"] == "launcher" and r["message"] == "worker-1 exited with 0" for r in records), records'
[ "$failed" -eq 0 ] || cat "$work/fashion-json.log"

echo "--- on a terminal the chief's progress line is redrawn in place, below the other tasks' lines"
# script(1) gives the launcher a terminal; the chief's stdout stays the launcher's pipe.
script -qec "'$launch' --ps 1 --workers 1 -- '$fashion' --steps 300 --log-every 100 --min-accuracy 0.5" /dev/null \
  > "$work/tty.log" 2>&1
code=$?
check "the training exits 0 (got $code)" test "$code" -eq 0
check "the chief's bar is redrawn, and its last state stays on a line of its own" /usr/bin/python3 - "$work/tty.log" <<'PY'
import re, sys
text = open(sys.argv[1], newline="").read()  # with its \r
assert re.search(r"\r\[chief\] chief: \[=*>?\.*\] step \d+/300 loss [0-9.]+ [0-9.]+ steps/s ETA", text), "no redrawn bar"
assert re.search(r"\r\[chief\] chief: \[={30}\] step 300/300 loss [0-9.]+ [0-9.]+ steps/s done in [0-9:]+s? *\r*\n", text), \
    "no last bar"
line_of_chief = r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z INFO \[chief:0\] "
assert not re.search(line_of_chief + r"chief: step ", text, re.M), "plain progress lines on a terminal"
assert re.search(line_of_chief + r"chief: test accuracy 0\.\d+ on 10000 images\r*$", text, re.M), "no result line"
PY
[ "$failed" -eq 0 ] || cat -A "$work/tty.log"

echo "--- a bad PSCORO_LOG_LEVEL is warned about, and the default kept"
PSCORO_LOG_LEVEL=verbose "$launch" --ps 1 --workers 1 -- "$hello" 3 > "$work/bad.log" 2>&1
code=$?
check "the job still exits 0 (got $code)" test "$code" -eq 0
check "the job still runs" grep -q 'chief: total on ps:0' "$work/bad.log"
for task in chief:0 ps:0 worker:0; do
  check "$task says what is wrong" grep -qE "$iso WARNING \[$task\] PSCORO_LOG_LEVEL is 'verbose': use one of debug, info, warning, error; logging at info$" "$work/bad.log"
done
check "info lines still come" grep -qE "INFO \[chief:0\] connected to" "$work/bad.log"

echo "--- an event file read back by an independent reader holds exactly what was written"
"$write_summaries" "$work/logs/unit" > "$work/expected.txt"
code=$?
check "write_summaries exits 0 (got $code)" test "$code" -eq 0
check "write_summaries wrote what it wrote" test -s "$work/expected.txt"
file=$(sed -n 's/^file //p' "$work/expected.txt")
check "TF 2's file name: events.out.tfevents.<seconds>.<host>.<pid>.<n>.v2 ($(basename "$file"))" \
  grep -qE "^events\.out\.tfevents\.[0-9]{10}\.$(hostname)\.[0-9]+\.[0-9]+\.v2$" <<< "$(basename "$file")"
check "the reader finds every scalar and histogram" \
  /usr/bin/python3 "$here/read_tfevents.py" "$proto_dir" "$work" "$file" "$work/expected.txt"

echo "--- fashion_mnist --logdir: loss, accuracy, learning rate and steps/s curves; progress lines"
"$launch" --ps 1 --workers 2 -- "$fashion" --steps 300 --log-every 100 --min-accuracy 0.5 \
  --logdir "$work/logs/fashion" > "$work/fashion.log" 2>&1
code=$?
check "the training exits 0 (got $code)" test "$code" -eq 0
check "it trains" grep -qE "$(line_of chief:0)"'chief: test accuracy' "$work/fashion.log"
for step in 100 200; do
  check "a progress line at step $step" \
    grep -qE "$(line_of chief:0)chief: step $step/300 loss [0-9]+\.[0-9]{4} [0-9]+\.[0-9] steps/s ETA [0-9:]+s?$" "$work/fashion.log"
done
check "the last one says how long it took" \
  grep -qE "$(line_of chief:0)chief: step 300/300 loss [0-9]+\.[0-9]{4} [0-9]+\.[0-9] steps/s done in [0-9:]+s?$" "$work/fashion.log"
events=$(ls "$work"/logs/fashion/events.out.tfevents.*.v2 2>/dev/null | head -n 1)
check "one event file in the log directory" test "$(ls "$work/logs/fashion" | wc -l)" -eq 1 -a -n "$events"
/usr/bin/python3 "$here/read_tfevents.py" "$proto_dir" "$work" "$events" > "$work/fashion.events"
code=$?
check "the reader decodes it (exit $code)" test "$code" -eq 0 -a -s "$work/fashion.events"
for tag in train/loss train/accuracy train/learning_rate; do
  check "$tag at every step 1-300" \
    test "$(sed -nE "s|^scalar $tag ([0-9]+) .*|\1|p" "$work/fashion.events" | tr '\n' ' ')" = "$(seq -s ' ' 1 300) "
done
check "steps/s every 100 steps" \
  test "$(sed -nE 's|^scalar train/steps_per_second ([0-9]+) .*|\1|p' "$work/fashion.events" | tr '\n' ' ')" = "100 200 300 "
check "the learning rate decays linearly from 0.3" \
  /usr/bin/python3 -c '
import struct, sys
for line in open(sys.argv[1]):
    kind, tag, step, value = line.split()
    if tag == "train/learning_rate":
        want = struct.unpack("f", struct.pack("f", 0.3 * (300 - (int(step) - 1)) / 300))[0]
        assert float(value) == float(f"{want:.9g}"), (step, value, want)
' "$work/fashion.events"
printed=$(sed -nE "s/$(line_of chief:0)"'chief: test accuracy (0\.[0-9]+) on 10000 images$/\1/p' "$work/fashion.log")
written=$(sed -nE 's|^scalar test/accuracy 300 (.*)$|\1|p' "$work/fashion.events")
check "the test accuracy written is the one printed ($written, $printed)" \
  /usr/bin/python3 -c 'import sys; assert abs(float(sys.argv[1]) - float(sys.argv[2])) <= 5e-5' "${written:-0}" "${printed:-1}"
[ "$failed" -eq 0 ] || { cat "$work/fashion.log"; head -n 20 "$work/fashion.events"; }

finish
