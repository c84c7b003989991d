#!/usr/bin/env bash
# Real processes: pscoro-launch runs the Fashion-MNIST example as chief + ps + workers, and stops
# the whole group when one task fails or when it is told to stop.
# usage: launcher_test.sh PSCORO_LAUNCH FASHION_MNIST
set -uo pipefail
launch=$1
example=$2
source "$(dirname "$0")/checks.sh"

# wait_for FILE PATTERN: polls (up to 120 s) until a line of FILE matches PATTERN.
wait_for() {
  for _ in $(seq 1200); do
    grep -qE "$2" "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "timed out waiting for /$2/ in $1:"; cat "$1"
  return 1
}

# wait_exit PID: waits for a background job (killing it after 120 s) and sets `code`. Bash reaps
# finished jobs itself, so kill -0 fails once the job has ended.
wait_exit() {
  for _ in $(seq 1200); do
    kill -0 "$1" 2>/dev/null || break
    sleep 0.1
  done
  kill -9 "$1" 2>/dev/null
  wait "$1"
  code=$?
}

all_gone() {  # all_gone LOG: every pid the launcher started has exited
  for pid in $(sed -nE 's/^pscoro-launch: started [a-z0-9-]+ \(pid ([0-9]+)\)$/\1/p' "$1"); do
    if kill -0 "$pid" 2>/dev/null; then echo "pid $pid still runs"; return 1; fi
  done
}

echo "--- a short run succeeds, every line prefixed with its task"
"$launch" --ps 2 --workers 2 -- "$example" --steps 40 --log-every 20 --min-accuracy 0 > "$work/run.log" 2>&1
code=$?
check "the launcher exits 0 when the chief does (got $code)" test "$code" -eq 0
check "both ps report their port" grep -qE '^\[ps-1\] pscoro: ps:1 listening on 127\.0\.0\.1:[0-9]+$' "$work/run.log"
check "the chief trains" grep -qE '^\[chief\] chief: step 40/40 loss [0-9.]+$' "$work/run.log"
check "the chief evaluates" grep -qE '^\[chief\] chief: test accuracy 0\.[0-9]+ on 10000 images$' "$work/run.log"
check "the servers are stopped with the chief" all_gone "$work/run.log"
[ "$failed" -eq 0 ] || cat "$work/run.log"

echo "--- killing a worker stops the group with its code"
"$launch" --ps 1 --workers 2 --grace-period 2 -- "$example" --steps 100000000 --log-every 1000000 > "$work/kill.log" 2>&1 &
launcher=$!
if wait_for "$work/kill.log" 'connected to 1 ps and 2 workers'; then
  victim=$(sed -nE 's/^pscoro-launch: started worker-1 \(pid ([0-9]+)\)$/\1/p' "$work/kill.log")
  kill -9 "$victim"
  wait_exit "$launcher"
  check "the launcher exits with the killed worker's code 137 (got $code)" test "$code" = 137
  check "it says which task failed" grep -q 'worker-1 ended before the chief; stopping the cluster' "$work/kill.log"
  check "no task survives" all_gone "$work/kill.log"
else
  check "the cluster started" false
fi

echo "--- SIGTERM to the launcher stops every task"
"$launch" --ps 1 --workers 1 -- "$example" --steps 100000000 --log-every 1000000 > "$work/term.log" 2>&1 &
launcher=$!
if wait_for "$work/term.log" 'connected to 1 ps and 1 workers'; then
  kill -TERM "$launcher"
  wait_exit "$launcher"
  check "the launcher exits with 143 (got $code)" test "$code" = 143
  check "no task survives" all_gone "$work/term.log"
else
  check "the cluster started" false
fi

echo "--- a program that cannot start fails the launch"
"$launch" --ps 1 --workers 1 -- "$work/no-such-program" > "$work/missing.log" 2>&1
code=$?
check "the launcher fails with the exec failure code 127 (got $code)" test "$code" -eq 127
check "it says why" grep -q 'cannot run' "$work/missing.log"

echo "--- servers that never report their ports time out the launch"
"$launch" --ps 1 --workers 1 --startup-timeout 1 --grace-period 1 -- sleep 60 > "$work/silent.log" 2>&1
code=$?
check "the launcher fails with 1 (got $code)" test "$code" -eq 1
check "it says why" grep -q 'servers did not report their ports within 1s' "$work/silent.log"
check "no task survives" all_gone "$work/silent.log"

finish
