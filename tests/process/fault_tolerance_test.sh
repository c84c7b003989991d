#!/usr/bin/env bash
# Real processes: the Fashion-MNIST cluster keeps training while its workers are killed, stopped
# and continued; a killed ps fails the chief at once, naming it; a killed chief started again
# resumes from its newest checkpoint at its step against the same, still running, servers.
# usage: fault_tolerance_test.sh PSCORO_LAUNCH FASHION_MNIST
set -uo pipefail
launch=$1
example=$2
source "$(dirname "$0")/checks.sh"
# Steps of the kill run: 10000 by default; the sanitizer build asks for fewer (its 6 kills are over
# long before; training to 10000 steps under ASan takes minutes and tests nothing more).
steps=${PSCORO_FAULT_TOLERANCE_STEPS:-10000}
# Steps of the chief-restart run, which checkpoints every sixth of them and loses its chief after
# the second checkpoint: 3000 by default, 1500 under the sanitizers (both reach the accuracy).
resume_steps=${PSCORO_FAULT_TOLERANCE_RESUME_STEPS:-3000}
every=$((resume_steps / 6))

count() { grep -cE "$2" "$1"; }  # count LOG PATTERN

# goes_on LOG PATTERN [END]: waits (up to 120 s) for one more line matching PATTERN than now, or
# for a line matching END.
goes_on() {
  local now
  now=$(count "$1" "$2")
  for _ in $(seq 1200); do
    [ "$(count "$1" "$2")" -gt "$now" ] && return 0
    [ -n "${3:-}" ] && grep -qE "$3" "$1" && return 0
    sleep 0.1
  done
  return 1
}

# long_run LOG PS WORKERS: starts a run that lasts until it is stopped (its launcher's pid in
# `launcher`) and waits for its first progress line.
long_run() {
  "$launch" --ps "$2" --workers "$3" -- "$example" --steps 1000000 --log-every 100 > "$1" 2>&1 &
  launcher=$!
  wait_for "$1" "$(line_of chief:0)"'chief: step 100/'
}

echo "--- kill -9 a random worker 6 times in a $steps-step run: every step runs, training converges"
log=$work/kill.log
"$launch" --ps 2 --workers 3 --restart-workers -- "$example" --steps "$steps" --log-every 100 --count-runs \
  > "$log" 2>&1 &
launcher=$!
kills=0
last="$(line_of chief:0)chief: step $steps/$steps "
for round in 1 2 3 4 5 6; do
  # Kill only while the run is making progress, and only a worker that is back from the last kill.
  wait_for "$log" "$(line_of chief:0)chief: step [0-9]+/$steps " || break
  grep -qE "$last" "$log" && break
  victim=$((RANDOM % 3))
  pid=$(pid_of "$log" "worker-$victim")
  backs=$(count "$log" "INFO \\[chief:0\\] worker:$victim is back")
  kill -9 "$pid" || break
  kills=$((kills + 1))
  echo "killed worker-$victim (pid $pid)"
  # It is back once the chief has rebuilt its iterator (or the run ended meanwhile).
  for _ in $(seq 3000); do
    [ "$(count "$log" "INFO \\[chief:0\\] worker:$victim is back")" -gt "$backs" ] && break
    grep -qE "$last" "$log" && break
    sleep 0.1
  done
  # Let it take some steps before the next kill.
  goes_on "$log" "$(line_of chief:0)"'chief: step ' "$last" && goes_on "$log" "$(line_of chief:0)"'chief: step ' "$last"
done
wait_exit "$launcher"
check "the run exits 0 (got $code)" test "$code" -eq 0
check "a worker was killed at least 5 times while the run went on ($kills)" test "$kills" -ge 5
check "the chief saw each loss" test "$(count "$log" 'WARNING \[chief:0\] lost worker:[0-2]: ')" -ge "$kills"
check "a killed worker comes back with a fresh iterator" \
  grep -qE 'INFO \[chief:0\] worker:[0-2] is back; 1 iterator\(s\) rebuilt before it takes closures' "$log"
check "every result resolves in order, up to the last step" grep -qE "$(line_of chief:0)chief: step $steps/$steps loss " "$log"
check "every step ran at least once" \
  grep -qE "$(line_of chief:0)chief: steps 1-$steps ran: [0-9]+ once, [0-9]+ again after a worker was lost, 0 never\$" "$log"
check "the model converges (accuracy >= 0.80)" grep -qE "$(line_of chief:0)"'chief: test accuracy 0\.(8|9)[0-9]+ on 10000 images$' "$log"
grep -E 'chief: steps|chief: test accuracy|lost worker|is back' "$log"
[ "$failed" -eq 0 ] || cat "$log"

echo "--- SIGSTOP a worker: the heartbeat timeout finds it and its steps run elsewhere; SIGCONT: it rejoins"
log=$work/stop.log
before=$failed
# PSCORO_FAULT_TOLERANCE_STOP=0 (the sanitizer build) skips this part: it is mostly the heartbeat
# timeout's 10 s and a rejoin, code the sanitizers run in the integration tests (a worker that
# hangs past the heartbeat timeout: coordinator_test, per_worker_test).
if [ "${PSCORO_FAULT_TOLERANCE_STOP:-1}" = 0 ]; then
  echo "skipped (PSCORO_FAULT_TOLERANCE_STOP=0)"
elif long_run "$log" 1 2; then
  pid=$(pid_of "$log" worker-1)
  stop_process "$pid"
  check "the hung worker is noticed" wait_for "$log" 'WARNING \[chief:0\] lost worker:1: .*heartbeat timeout' 120
  check "training goes on without it" goes_on "$log" "$(line_of chief:0)"'chief: step '
  continue_process "$pid"
  check "after SIGCONT it rejoins" wait_for "$log" 'INFO \[chief:0\] worker:1 is back; 1 iterator\(s\) rebuilt' 120
  check "training goes on" goes_on "$log" "$(line_of chief:0)"'chief: step '
else
  check "the run started" false
fi
if [ "${PSCORO_FAULT_TOLERANCE_STOP:-1}" != 0 ]; then
  kill -TERM "$launcher"
  wait_exit "$launcher"
fi
[ "$failed" -eq "$before" ] || cat "$log"

echo "--- kill -9 a ps: the chief fails within two heartbeat intervals (2 s), naming it"
log=$work/ps.log
before=$failed
if long_run "$log" 2 2; then
  killed_at=$(date +%s.%N)
  kill -9 "$(pid_of "$log" ps-1)"
  wait_exit "$launcher"
  check "the job fails with the chief's code 1 (got $code)" test "$code" -eq 1
  # Workers in flight at the kill may report ps:1 unreachable before the chief's own connection
  # does, past the transient_ps_failures tolerance: the chief then asks ps:1 itself, and the run
  # ends with the one error of a lost ps either way.
  check "the chief's error names ps:1 as the lost parameter server" \
    grep -qE "$(line_of chief:0)"'chief: .*parameter server ps:1 is unavailable' \
    "$log"
  noticed_iso=$(sed -nE 's/^([0-9T:.-]+Z) INFO \[chief:0\] the job ends: telling [0-9]+ task\(s\) to exit with code 1$/\1/p' \
    "$log" | head -n 1)
  noticed_at=$(date -u -d "${noticed_iso:-1970-01-01T00:00:00Z}" +%s.%N)
  latency=$(awk -v a="$killed_at" -v b="${noticed_at:-0}" 'BEGIN { printf "%.3f", b - a }')
  echo "the chief noticed the lost ps after ${latency} s"
  check "within 2 s of the kill (${latency} s)" awk -v l="$latency" 'BEGIN { exit !(l >= 0 && l <= 2) }'
else
  check "the run started" false
fi
[ "$failed" -eq "$before" ] || cat "$log"

echo "--- kill -9 the chief: started again, it resumes from its newest checkpoint against the same servers"
log=$work/chief.log
before=$failed
"$launch" --ps 2 --workers 2 --restart-chief -- "$example" --steps "$resume_steps" --log-every 100 --count-runs \
  --checkpoint-dir "$work/ckpt" --checkpoint-every "$every" > "$log" 2>&1 &
launcher=$!
if wait_for "$log" "$(line_of chief:0)chief: saved $work/ckpt/ckpt-$((2 * every)).safetensors$"; then
  first_chief=$(pid_of "$log" chief)
  kill -9 "$first_chief"
  newest=$(ls "$work/ckpt" | sed -nE 's/^ckpt-([0-9]+)\.safetensors$/\1/p' | sort -n | tail -n 1)
  wait_exit "$launcher"
  check "the job exits 0 (got $code)" test "$code" -eq 0
  check "the launcher started the chief again" grep -qE "$(line_of launcher)"'restarting chief in' "$log"
  check "it resumed at step $newest, the newest checkpoint's" \
    grep -qE "$(line_of chief:0)chief: resumed from $work/ckpt/ckpt-$newest.safetensors at step $newest$" "$log"
  check "the servers ended the old coordinator session" \
    test "$(count "$log" 'INFO \[(ps|worker):[01]\] new coordinator session [0-9a-f]{16} .*ending session')" -eq 4
  check "every later step ran" grep -qE "$(line_of chief:0)chief: steps $((newest + 1))-$resume_steps ran: [0-9]+ once, [0-9]+ again after a worker was lost, 0 never$" "$log"
  check "the model converges" grep -qE "$(line_of chief:0)"'chief: test accuracy 0\.(8|9)[0-9]+ on 10000 images$' "$log"
  check "it saved the last step" test -f "$work/ckpt/ckpt-$resume_steps.safetensors"
  grep -E 'restarting chief|chief: resumed|new coordinator session|chief: steps|test accuracy' "$log"
else
  check "the run saved a checkpoint" false
  kill -TERM "$launcher"
  wait_exit "$launcher"
fi
[ "$failed" -eq "$before" ] || cat "$log"

echo "--- a worker restarted at another port announces itself to the chief, which takes it back"
# Processes started by hand: the launcher restarts a worker where it was. The chief needs a port
# known before it starts (free_port).
log=$work/moved
mkdir -p "$log"
before=$failed
chief_port=$(free_port)
server_cluster() {  # server_cluster WORKER1_ADDRESS
  echo "{\"chief\": [\"127.0.0.1:$chief_port\"], \"ps\": [\"127.0.0.1:0\"], \"worker\": [\"127.0.0.1:0\", \"$1\"]}"
}
serve() {  # serve JOB INDEX WORKER1_ADDRESS LOG
  TF_CONFIG="{\"cluster\": $(server_cluster "$3"), \"task\": {\"type\": \"$1\", \"index\": $2}}" "$example" > "$4" 2>&1 &
}
address_in() { sed -nE "s/$(line_of '[a-z]+:[0-9]+')"'pscoro: [a-z]+:[0-9]+ listening on (\S+)$/\1/p' "$1"; }
serve ps 0 127.0.0.1:0 "$log/ps0.log"
serve worker 0 127.0.0.1:0 "$log/worker0.log"
serve worker 1 127.0.0.1:0 "$log/worker1.log"
worker1_pid=$!
for f in ps0 worker0 worker1; do wait_for "$log/$f.log" 'listening on' 60 > /dev/null; done
ps0=$(address_in "$log/ps0.log")
worker0=$(address_in "$log/worker0.log")
worker1=$(address_in "$log/worker1.log")
cluster="{\"chief\": [\"127.0.0.1:$chief_port\"], \"ps\": [\"$ps0\"], \"worker\": [\"$worker0\", \"$worker1\"]}"
TF_CONFIG="{\"cluster\": $cluster, \"task\": {\"type\": \"chief\", \"index\": 0}}" "$example" --steps 100000 \
  --log-every 100 > "$log/chief.log" 2>&1 &
chief_pid=$!
if wait_for "$log/chief.log" "$(line_of chief:0)"'chief: step 100/'; then
  kill -9 "$worker1_pid"
  serve worker 1 127.0.0.1:0 "$log/worker1-moved.log"  # a new port, and the chief's address to announce to
  wait_for "$log/worker1-moved.log" 'listening on' 60 > /dev/null
  moved=$(address_in "$log/worker1-moved.log")
  check "it came back at another address ($worker1 -> $moved)" test -n "$moved" -a "$moved" != "$worker1"
  check "the chief hears where it is" wait_for "$log/chief.log" "INFO \\[chief:0\\] worker:1 announced itself at $moved \\(was $worker1\\)" 60
  check "the chief takes it back, iterators first" wait_for "$log/chief.log" 'INFO \[chief:0\] worker:1 is back; 1 iterator\(s\) rebuilt' 60
  check "the worker said it announced itself" grep -q "announced worker:1 at $moved to the chief at 127.0.0.1:$chief_port" \
    "$log/worker1-moved.log"
  check "training goes on" goes_on "$log/chief.log" "$(line_of chief:0)"'chief: step '
else
  check "the run started" false
fi
kill -TERM "$chief_pid" 2> /dev/null
[ "$failed" -eq "$before" ] || tail -n 20 "$log"/*.log

finish
