#!/usr/bin/env bash
# Elastic admission with real processes: a job of 1 ps and 2 workers whose chief admits one worker
# beyond its cluster spec. A third worker, listed nowhere, started while closures run, is admitted
# as worker:2 and takes closures once its iterator is made; a fourth (past the cap) and one without
# the job's secret are refused: each says why and exits non-zero. Then the job ends cleanly.
# usage: elastic_test.sh ELASTIC_CLUSTER
set -uo pipefail
example=$1
source "$(dirname "$0")/checks.sh"

export PSCORO_AUTH_SECRET_FILE="$work/job-secret"
(umask 077; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$PSCORO_AUTH_SECRET_FILE")
release=$work/release
# Workers announce themselves at the chief's address: a port known before the chief starts.
chief_port=$(free_port)
chief="\"chief\": [\"127.0.0.1:$chief_port\"]"
serve() {  # serve JOB INDEX LOG: a task of the spec, on a port of its own choosing
  TF_CONFIG="{\"cluster\": {$chief, \"ps\": [\"127.0.0.1:0\"], \"worker\": [\"127.0.0.1:0\", \"127.0.0.1:0\"]}, \
\"task\": {\"type\": \"$1\", \"index\": $2}}" "$example" "$release" > "$3" 2>&1 &
}
address_in() { sed -nE "s/$(line_of '[a-z]+:[0-9]+')"'pscoro: [a-z]+:[0-9]+ listening on (\S+)$/\1/p' "$1"; }
serve ps 0 "$work/ps0.log"
serve worker 0 "$work/worker0.log"
serve worker 1 "$work/worker1.log"
for f in ps0 worker0 worker1; do wait_for "$work/$f.log" 'listening on' 60 > /dev/null; done
cluster="{$chief, \"ps\": [\"$(address_in "$work/ps0.log")\"], \"worker\": [\"$(address_in "$work/worker0.log")\", \
\"$(address_in "$work/worker1.log")\"]}"
TF_CONFIG="{\"cluster\": $cluster, \"task\": {\"type\": \"chief\", \"index\": 0}}" "$example" "$release" \
  > "$work/chief.log" 2>&1 &
chief_pid=$!
# An unlisted worker knows only the chief and the ps (the task has no index) and where to listen.
unlisted() {  # unlisted LOG [env args...]
  local log=$1
  shift
  env "$@" PSCORO_LISTEN_ADDRESS=127.0.0.1:0 TF_CONFIG="{\"cluster\": {$chief, \"ps\": [\"$(address_in "$work/ps0.log")\"]}, \
\"task\": {\"type\": \"worker\"}}" "$example" "$release" > "$log" 2>&1 &
}

if check "the spec's workers run closures" wait_for "$work/chief.log" "$(line_of chief:0)chief: first closure on worker:1$" 120 &&
  wait_for "$work/chief.log" "$(line_of chief:0)chief: first closure on worker:0$" 120; then
  echo "--- an unlisted worker joins while closures run"
  unlisted "$work/worker2.log"
  worker2_pid=$!
  check "the chief admits it as worker:2" wait_for "$work/chief.log" 'INFO \[chief:0\] admitted worker:2 at 127\.0\.0\.1:[0-9]+' 60
  check "it builds its iterator before it takes closures" \
    wait_for "$work/chief.log" 'INFO \[chief:0\] worker:2 takes closures now; 1 iterator\(s\)' 60
  check "it runs closures" wait_for "$work/chief.log" "$(line_of chief:0)chief: first closure on worker:2$" 60
  made=$(grep -n 'worker:2 takes closures now' "$work/chief.log" | head -n 1 | cut -d: -f1)
  ran=$(grep -nE "$(line_of chief:0)chief: first closure on worker:2$" "$work/chief.log" | head -n 1 | cut -d: -f1)
  check "its iterator was made (line ${made:-none}) before its first closure ran (line ${ran:-none})" \
    test -n "$made" -a -n "$ran" -a "${made:-0}" -lt "${ran:-0}"
  check "the worker says which index it was given" \
    grep -q 'the chief admitted this worker as worker:2 (it announced itself as worker:unlisted)' "$work/worker2.log"

  echo "--- one past the cap is refused"
  unlisted "$work/worker3.log"
  wait_exit $! 60
  check "it exits non-zero (got $code)" test "$code" -ne 0
  check "it says why" grep -q 'the chief at 127.0.0.1:'"$chief_port"' did not admit this worker: .*the job admits at most 1 worker(s) beyond its cluster spec (coordinator_options::max_elastic_workers) and has 1' \
    "$work/worker3.log"

  echo "--- one without the job's secret is refused"
  unlisted "$work/stranger.log" -u PSCORO_AUTH_SECRET_FILE
  wait_exit $! 60
  check "it exits non-zero (got $code)" test "$code" -ne 0
  check "it says why" grep -q 'did not admit this worker: .*sent no proof of the cluster secret' "$work/stranger.log"
  check "the chief admitted neither" test "$(grep -c 'admitted worker:' "$work/chief.log")" -eq 1

  touch "$release"
  wait_exit "$chief_pid" 120
  check "the chief ends the job with 0 (got $code)" test "$code" -eq 0
  check "the closures ran on every worker, the admitted one too" \
    grep -qE "$(line_of chief:0)"'chief: closures per worker: worker:0=[0-9]+ worker:1=[0-9]+ worker:2=[0-9]+$' "$work/chief.log"
  wait_exit "$worker2_pid" 60
  check "the admitted worker exits with the job's code (got $code)" test "$code" -eq 0
fi
[ "$failed" -eq 0 ] || tail -n 30 "$work"/*.log
finish
