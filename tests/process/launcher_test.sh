#!/usr/bin/env bash
# Real processes: pscoro-launch runs the Fashion-MNIST example as chief + ps + workers, and stops
# the whole group when one task fails or when it is told to stop.
# usage: launcher_test.sh PSCORO_LAUNCH FASHION_MNIST HELLO_CLUSTER
set -uo pipefail
launch=$1
example=$2
hello=$3
source "$(dirname "$0")/checks.sh"

all_gone() {  # all_gone LOG: every pid the launcher started has exited
  for pid in $(sed -nE "s/$(line_of launcher)"'started [a-z0-9-]+ \(pid ([0-9]+)\)$/\1/p' "$1"); do
    if kill -0 "$pid" 2>/dev/null; then echo "pid $pid still runs"; return 1; fi
  done
}

echo "--- a short run succeeds, every line prefixed with its task"
"$launch" --ps 2 --workers 2 -- "$example" --steps 40 --log-every 20 --min-accuracy 0 > "$work/run.log" 2>&1
code=$?
check "the launcher exits 0 when the chief does (got $code)" test "$code" -eq 0
check "both ps report their port" grep -qE "$(line_of ps:1)"'pscoro: ps:1 listening on 127\.0\.0\.1:[0-9]+$' "$work/run.log"
check "the chief trains" grep -qE "$(line_of chief:0)"'chief: step 40/40 loss [0-9.]+ [0-9.]+ steps/s done in [0-9:]+s?$' "$work/run.log"
check "the chief evaluates" grep -qE "$(line_of chief:0)"'chief: test accuracy 0\.[0-9]+ on 10000 images$' "$work/run.log"
check "the servers are stopped with the chief" all_gone "$work/run.log"
for task in ps:0 ps:1 worker:0 worker:1; do
  check "$task stops when the chief ends the job" \
    grep -qE "INFO \[$task\] the chief \(chief:0 at [0-9.:]+\) ended the job with exit code 0: $task stops$" "$work/run.log"
  # On its own: the launcher signals only a task still running a grace period after the chief.
  label=${task/:/-}
  check "$label exits with the chief's code 0, not a signal's" grep -qE "$(line_of launcher)$label exited with 0$" "$work/run.log"
done
[ "$failed" -eq 0 ] || cat "$work/run.log"

echo "--- after a job that succeeds no task is signalled: each exits on its own with the chief's 0"
# The servers exit on the chief's Shutdown as the chief exits. Signalling every task once the chief
# has exited caught some on their way out ('worker-0 exited with 143' in about 1 run of 6): the
# launcher gives them the grace period first. Several short jobs, for a race.
for run in $(seq 20); do
  "$launch" --ps 2 --workers 2 -- "$hello" 2 > "$work/quick-$run.log" 2>&1
  code=$?
  check "job $run exits 0 (got $code)" test "$code" -eq 0
  check "job $run: each of its 5 tasks exited with 0" \
    test "$(grep -cE "$(line_of launcher)"'[a-z]+(-[0-9]+)? exited with ' "$work/quick-$run.log") $(grep -cE "$(line_of launcher)"'[a-z]+(-[0-9]+)? exited with 0$' "$work/quick-$run.log")" = "5 5"
  [ "$failed" -eq 0 ] || { cat "$work/quick-$run.log"; break; }
done

echo "--- a chief that fails ends the job with its code: the servers exit with it, and are no failure of their own"
"$launch" --ps 1 --workers 1 -- "$example" --steps 5 --min-accuracy 0.99 > "$work/low.log" 2>&1
code=$?
check "the launcher exits with the chief's code 1 (got $code)" test "$code" -eq 1
check "the chief says why, as an error line" \
  grep -qE "$(line_of chief:0 ERROR)"'chief: accuracy 0\.[0-9]+ is below the required 0\.99$' "$work/low.log"
check "each task exited with 1" \
  test "$(grep -cE "$(line_of launcher)"'(chief|ps-0|worker-0) exited with 1$' "$work/low.log")" -eq 3
check "the launcher reports no failure of its own" test "$(grep -cE ' (WARNING|ERROR) \[launcher\] ' "$work/low.log")" -eq 0
[ "$failed" -eq 0 ] || cat "$work/low.log"

echo "--- --one-thread and --in-process-threads 2 train the same model in one process, no cluster (fashion_mnist_bench's references)"
"$example" --one-thread --steps 300 --log-every 300 --min-accuracy 0.6 > "$work/one.log" 2>&1
code=$?
check "it exits 0 (got $code)" test "$code" -eq 0
check "it trains" grep -qE "$(line_of -)"'one thread: step 300/300 loss [0-9.]+ [0-9.]+ steps/s done in [0-9:]+s?$' "$work/one.log"
check "it learns: test accuracy 0.6 or more" grep -qE "$(line_of -)"'one thread: test accuracy 0\.([6-9][0-9]*) on 10000 images$' "$work/one.log"
"$example" --one-thread --steps 5 --min-accuracy 0.99 > "$work/one-low.log" 2>&1
code=$?
check "below --min-accuracy it exits 1 (got $code)" test "$code" -eq 1
check "and says so" grep -qE "$(line_of -)"'one thread: accuracy 0\.[0-9]+ is below the required 0\.99$' "$work/one-low.log"
"$example" --in-process-threads 2 --steps 300 --log-every 300 --min-accuracy 0.6 > "$work/two.log" 2>&1
code=$?
check "--in-process-threads 2 exits 0 (got $code)" test "$code" -eq 0
check "and trains its 300 steps on 2 threads" grep -qE "$(line_of -)"'2 threads: step 300/300 loss [0-9.]+ [0-9.]+ steps/s done in [0-9:]+s?$' "$work/two.log"
check "and learns: test accuracy 0.6 or more" grep -qE "$(line_of -)"'2 threads: test accuracy 0\.([6-9][0-9]*) on 10000 images$' "$work/two.log"
[ "$failed" -eq 0 ] || cat "$work/one.log" "$work/one-low.log" "$work/two.log"

echo "--- killing a worker stops the group with its code"
# The kill comes once training runs: a worker lost while the chief still creates the per-worker
# datasets fails the chief today (exit 1, a known gap), which is not what this checks.
"$launch" --ps 1 --workers 2 --grace-period 2 -- "$example" --steps 100000000 --log-every 20 > "$work/kill.log" 2>&1 &
launcher=$!
if wait_for "$work/kill.log" 'chief: step 20/'; then
  victim=$(pid_of "$work/kill.log" worker-1)
  kill -9 "$victim"
  wait_exit "$launcher"
  check "the launcher exits with the killed worker's code 137 (got $code)" test "$code" = 137
  check "it says which task failed" grep -q 'worker-1 ended and the chief did not end the job within 2s; stopping the cluster' "$work/kill.log"
  check "no task survives" all_gone "$work/kill.log"
else
  check "the cluster started" false
fi

echo "--- --restart-workers restarts a dead worker where it was, up to --max-restarts"
"$launch" --ps 1 --workers 2 --grace-period 2 --restart-workers --max-restarts 1 -- "$example" --steps 100000000 \
  --log-every 20 > "$work/restart.log" 2>&1 &
launcher=$!
if wait_for "$work/restart.log" 'chief: step 20/'; then
  first=$(pid_of "$work/restart.log" worker-1)
  address=$(sed -nE "s/$(line_of worker:1)"'pscoro: worker:1 listening on (\S+)$/\1/p' "$work/restart.log" | head -n 1)
  kill -9 "$first"
  check "the first death is restarted" wait_for "$work/restart.log" "$(line_of launcher)"'restarting worker-1 in 500 ms \(restart 1\)$'
  check "at the address it had" wait_for "$work/restart.log" "$(line_of worker:1)pscoro: worker:1 listening on $address$"
  check "the chief takes it back" wait_for "$work/restart.log" 'INFO \[chief:0\] worker:1 is back'
  second=$(pid_of "$work/restart.log" worker-1)
  check "as a new process" test -n "$second" -a "$second" != "$first"
  kill -9 "$second"
  wait_exit "$launcher" 60
  check "the second death, past --max-restarts, fails the job with its code 137 (got $code)" test "$code" = 137
  check "it says so" grep -q 'worker-1 ended and the chief did not end the job within 2s; stopping the cluster' "$work/restart.log"
  check "no task survives" all_gone "$work/restart.log"
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
