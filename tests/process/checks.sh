# What every process test sources: a scratch directory removed at exit (and background jobs
# killed, and any process it still holds stopped), `check DESCRIPTION COMMAND...` counting results
# for the closing "N passed, N failed" line that scripts/count_tests.py reads, and waiting for
# processes and their logs.
work=$(mktemp -d)
stopped=()  # pids stop_process holds stopped
trap 'kill -9 "${stopped[@]}" $(jobs -p) 2>/dev/null; rm -rf "$work"' EXIT

passed=0
failed=0
check() {  # check DESCRIPTION COMMAND...
  if "${@:2}"; then passed=$((passed + 1)); else echo "FAILED: $1"; failed=$((failed + 1)); fi
}

# finish: prints the tally and exits with its verdict.
finish() {
  echo "$passed passed, $failed failed"
  [ "$failed" -eq 0 ]
  exit
}

# wait_for FILE PATTERN [SECONDS]: polls until a line of FILE matches PATTERN (default 300 s).
wait_for() {
  for _ in $(seq $((${3:-300} * 10))); do
    grep -qE "$2" "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "timed out waiting for /$2/ in $1; its end:"
  tail -n 40 "$1"
  return 1
}

# wait_for_file FILE [SECONDS]: polls until FILE exists (default 60 s).
wait_for_file() {
  for _ in $(seq $((${2:-60} * 10))); do
    [ -e "$1" ] && return 0
    sleep 0.1
  done
  echo "timed out waiting for $1"
  return 1
}

# wait_exit PID [SECONDS]: waits for a background job (killing it after 600 s) and sets `code`.
# Bash reaps finished jobs itself, so kill -0 fails once the job has ended.
wait_exit() {
  for _ in $(seq $((${2:-600} * 10))); do
    kill -0 "$1" 2>/dev/null || break
    sleep 0.1
  done
  kill -9 "$1" 2>/dev/null
  wait "$1"
  code=$?
}

# line_of TASK [LEVEL]: the start of a grep -E or sed -E pattern for a line that TASK (itself a
# pattern: chief:0, 'worker:[01]', launcher) wrote, at LEVEL (default any), up to its message: every
# line of a run has the log format, "2026-11-29T13:30:40.123Z INFO [chief:0] chief: test accuracy
# 0.8231 on 10000 images". It holds no group, so a sed's \1 is still the caller's first.
line_of() {
  printf '^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{3}Z %s \\[%s\\] ' "${2:-[A-Z]+}" "$1"
}

# free_port: a loopback port free now, below the ephemeral range (so no connection of anyone else
# takes it meanwhile): for a task whose address must be known before it starts (the chief, where
# workers announce themselves).
free_port() {
  /usr/bin/python3 -c '
import random, socket
for _ in range(100):
    port = random.randint(20000, 29999)
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            continue
        print(port)
        break'
}

pid_of() {  # pid_of LOG LABEL: the pid pscoro-launch started LABEL with last
  sed -nE "s/$(line_of launcher)started $2 \(pid ([0-9]+)\)$/\1/p" "$1" | tail -n 1
}

# stop_process PID / continue_process PID: SIGSTOP and SIGCONT a task. Whatever ends the test, the
# exit trap SIGKILLs a process still stopped: a stopped process acts on no other signal (the
# SIGTERM its launcher sends, or its parent's death, waits in it until a SIGCONT).
stop_process() {
  kill -STOP "$1" && stopped+=("$1")
}
continue_process() {
  local pid kept=()
  for pid in "${stopped[@]}"; do [ "$pid" = "$1" ] || kept+=("$pid"); done
  stopped=("${kept[@]}")
  kill -CONT "$1"
}
