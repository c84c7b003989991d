#!/usr/bin/env bash
# Strangers on the host of a live Fashion-MNIST job (real processes): without the job's secret, with
# a wrong one, or with the right one but a role that may not open a session (an evaluator, a worker
# of another session), they are refused by every ps and worker and change nothing; the job ends
# with its usual accuracy and its servers never switch sessions. The same program started as the
# job's `evaluator` task evaluates the job's checkpoints instead of becoming a second chief.
#   security_test.sh PSCORO_LAUNCH FASHION_MNIST STRANGER
set -uo pipefail
launch=$1
example=$2
stranger=$3
source "$(dirname "$0")/checks.sh"
# Steps of each training job: 3000 by default; the sanitizer build asks for 1000 (they reach 0.82,
# and each of its steps is many times slower, so the job outlives the strangers all the same).
steps=${PSCORO_SECURITY_STEPS:-3000}

export PSCORO_AUTH_SECRET_FILE="$work/job-secret"  # pscoro-launch uses it as it is
(umask 077; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$PSCORO_AUTH_SECRET_FILE")
(umask 077; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$work/wrong-secret")

"$launch" --ps 1 --workers 2 -- "$example" --steps "$steps" --log-every 100 --min-accuracy 0.80 \
  --checkpoint-dir "$work/ckpt" --checkpoint-every $((steps / 3)) > "$work/job.log" 2>&1 &
job=$!
check "the job trains" wait_for "$work/job.log" 'chief: step 200/' 300
address_of() { sed -nE "s/$(line_of "$1")pscoro: $1 listening on (\S+)$/\1/p" "$work/job.log" | head -n 1; }

# stranger_refused TASK CODE [ARGS...]: the stranger gets CODE from TASK and nothing more.
stranger_refused() {
  local out
  out=$(env -u PSCORO_AUTH_SECRET_FILE "$stranger" "$(address_of "$1")" "$1" "${@:3}" 2>&1)
  local code=$?
  echo "stranger at $1 (${*:3}): $out" | head -n 3
  [ "$code" -eq 0 ] && grep -q "^refused: $2: " <<< "$out"
}
for task in ps:0 worker:0 worker:1; do
  check "$task refuses a stranger without the secret" stranger_refused "$task" unauthenticated
  check "$task refuses a stranger with a wrong secret" \
    stranger_refused "$task" unauthenticated --secret-file "$work/wrong-secret"
  check "$task refuses an evaluator that holds the secret" \
    stranger_refused "$task" "permission denied" --job evaluator --secret-file "$PSCORO_AUTH_SECRET_FILE"
done
check "ps:0 refuses a worker of a session it does not know" \
  stranger_refused ps:0 aborted --job worker --secret-file "$PSCORO_AUTH_SECRET_FILE"

# A chief holding the job's secret whose spec names the live ps's address for its worker too: it
# finds out before it opens its session anywhere, and the live job goes on (below: no server ever
# switched sessions).
wrong_cluster="{\"chief\": [\"127.0.0.1:0\"], \"ps\": [\"$(address_of ps:0)\"], \"worker\": [\"$(address_of ps:0)\"]}"
TF_CONFIG="{\"cluster\": $wrong_cluster, \"task\": {\"type\": \"chief\", \"index\": 0}}" \
  "$example" --steps 10 > "$work/wrong-chief.log" 2>&1
code=$?
grep -m1 'reached ps:0' "$work/wrong-chief.log"
check "a chief whose spec names a wrong address fails (exit $code)" test "$code" -ne 0
check "naming the task it reached instead" grep -q 'dialled worker:0 but reached ps:0' "$work/wrong-chief.log"

# The program run as the job's evaluator task: a sidecar evaluator of the job's checkpoints.
cluster="{\"chief\": [\"127.0.0.1:0\"], \"ps\": [\"$(address_of ps:0)\"], \"worker\": [\"$(address_of worker:0)\", \"$(address_of worker:1)\"]}"
TF_CONFIG="{\"cluster\": $cluster, \"task\": {\"type\": \"evaluator\", \"index\": 0}}" \
  "$example" --checkpoint-dir "$work/ckpt" --steps "$steps" > "$work/evaluator.log" 2>&1 &
evaluator=$!

wait_exit "$job" 600
check "the job ends well despite the strangers (exit $code)" test "$code" -eq 0
check "the job reaches its accuracy" grep -qE 'chief: test accuracy 0\.(8|9)' "$work/job.log"
check "no server ever switched sessions" bash -c "! grep -q 'new coordinator session' '$work/job.log'"
# (A stranger with a wrong secret gives up on the server's proof before the server refuses it.)
check "every refusal was logged by the server" test "$(grep -c 'refused connection from' "$work/job.log")" -ge 7
wait_exit "$evaluator" 120
check "the evaluator task evaluated the final checkpoint (exit $code)" test "$code" -eq 0
check "the evaluator task reported the accuracy" grep -qE "evaluator: ckpt-$steps.safetensors step $steps test accuracy" \
  "$work/evaluator.log"
TF_CONFIG="{\"cluster\": $cluster, \"task\": {\"type\": \"evaluator\", \"index\": 0}}" "$example" \
  > "$work/evaluator2.log" 2>&1
code=$?
check "an evaluator task without a checkpoint directory says what it needs (exit $code)" \
  grep -q 'the evaluator task evaluates checkpoints: give it --checkpoint-dir' "$work/evaluator2.log"

# The same job with mutual TLS (certificates of a cluster CA made here) and no secret: strangers
# without a certificate, or with one of another CA, are refused and the job trains.
tls="$work/tls"
mkdir -p "$tls"
(
  cd "$tls" || exit 1
  for ca in cluster-ca stranger-ca; do
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout $ca.key -out $ca.crt \
      -subj /CN=$ca -days 2
  done
  for pair in node:cluster-ca stranger:stranger-ca; do
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "${pair%:*}.key" \
      -out "${pair%:*}.csr" -subj "/CN=${pair%:*}"
    openssl x509 -req -in "${pair%:*}.csr" -CA "${pair#*:}.crt" -CAkey "${pair#*:}.key" -CAcreateserial \
      -out "${pair%:*}.crt" -days 2
  done
) > "$work/openssl.log" 2>&1
check "the test certificates are made" test -s "$tls/stranger.crt"
PSCORO_TLS_CERT_FILE="$tls/node.crt" PSCORO_TLS_KEY_FILE="$tls/node.key" PSCORO_TLS_CA_FILE="$tls/cluster-ca.crt" \
  "$launch" --ps 1 --workers 1 -- "$example" --steps "$steps" --log-every 100 --min-accuracy 0.80 \
  > "$work/tls-job.log" 2>&1 &
tls_job=$!
check "the TLS job trains" wait_for "$work/tls-job.log" 'chief: step 100/' 300
tls_address=$(sed -nE "s/$(line_of ps:0)pscoro: ps:0 listening on (\S+)$/\1/p" "$work/tls-job.log" | head -n 1)
tls_refused() {  # tls_refused DESCRIPTION EXPECTED-TEXT [STRANGER ARGS...]
  local out
  out=$(env -u PSCORO_AUTH_SECRET_FILE "$stranger" "$tls_address" ps:0 "${@:3}" 2>&1)
  local code=$?
  echo "TLS stranger ($1): $out" | head -n 2
  [ "$code" -eq 0 ] && grep -q "^refused: unauthenticated: .*$2" <<< "$out"
}
check "a TLS ps refuses a stranger without TLS" tls_refused "no TLS" "requires TLS with a certificate of the cluster CA"
check "a TLS ps refuses a certificate of another CA" tls_refused "foreign certificate" "TLS handshake with ps:0" \
  --tls "$tls/stranger.crt,$tls/stranger.key,$tls/cluster-ca.crt"
wait_exit "$tls_job" 300
check "the TLS job ends well (exit $code)" test "$code" -eq 0
check "the TLS job reaches its accuracy" grep -qE "chief: test accuracy 0\.(8|9)" "$work/tls-job.log"

# What strangers cost a ps, in the release suite only (PSCORO_SECURITY_RESOURCES=0 under the
# sanitizers, whose runtime needs descriptors of its own and whose memory is not the program's:
# tests/meson.build).
#
# A ps out of file descriptors backs off instead of spinning, says so at most every 10 s, and
# accepts again once descriptors are free. (Its backlog keeps the connections it cannot accept.)
if [ "${PSCORO_SECURITY_RESOURCES:-1}" = 1 ]; then
  ps_config='{"cluster": {"ps": ["127.0.0.1:0"], "worker": ["127.0.0.1:1"]}, "task": {"type": "ps", "index": 0}}'
  (ulimit -n 24 && exec env -u PSCORO_AUTH_SECRET_FILE TF_CONFIG="$ps_config" "$example") > "$work/ps.log" 2>&1 &
  ps_pid=$!
  check "the small ps starts" wait_for "$work/ps.log" 'listening on' 60
  ps_address=$(sed -nE "s/$(line_of ps:0)"'pscoro: ps:0 listening on (\S+)$/\1/p' "$work/ps.log")
  /usr/bin/python3 - "$ps_address" "$work/held" <<'PY' &
import socket, sys, time
host, port = sys.argv[1].rsplit(":", 1)
held = [socket.create_connection((host, int(port))) for _ in range(64)]
open(sys.argv[2], "w").close()
time.sleep(600)
PY
  holder=$!
  check "64 connections are held" wait_for_file "$work/held"
  sleep 1  # the ps runs out of descriptors now
  cpu_ticks() { awk '{print $14 + $15}' "/proc/$ps_pid/stat"; }
  before=$(cpu_ticks)
  sleep 3
  used=$(( $(cpu_ticks) - before ))
  echo "ps CPU time in 3 s without descriptors: $used ticks of $(getconf CLK_TCK)/s"
  check "the ps does not spin without descriptors ($used ticks in 3 s)" test "$used" -lt "$(getconf CLK_TCK)"
  failures=$(grep -c 'cannot accept connections' "$work/ps.log")
  check "it says so, once ($failures lines)" test "$failures" -ge 1 -a "$failures" -le 2
  grep -m1 'cannot accept connections' "$work/ps.log"
  kill "$holder"
  out=$("$stranger" "$ps_address" ps:0 2>&1)  # waits in the backlog, then gets in (this ps has no secret)
  echo "$out" | head -n 2
  check "the ps accepts again once descriptors are free" grep -q 'got into ps:0' <<< "$out"
  kill "$ps_pid"

  # A thousand strangers' Hellos of 253 KiB each (from 127.0.0.2), held open, cost the ps a small
  # fixed total (at most 256 handshakes at once, and 16 MiB for their frames: docs/design.md,
  # Security), and a task of the job (from 127.0.0.1) gets in meanwhile.
  ps_config='{"cluster": {"ps": ["127.0.0.1:0"], "worker": ["127.0.0.1:1"]}, "task": {"type": "ps", "index": 0}}'
  TF_CONFIG="$ps_config" "$example" > "$work/flooded-ps.log" 2>&1 &
  ps_pid=$!
  check "the ps to flood starts" wait_for "$work/flooded-ps.log" 'listening on' 60
  ps_address=$(sed -nE "s/$(line_of ps:0)"'pscoro: ps:0 listening on (\S+)$/\1/p' "$work/flooded-ps.log")
  peak_kib() { awk '/^VmHWM:/ {print $2}' "/proc/$ps_pid/status"; }
  before=$(peak_kib)
  /usr/bin/python3 "$(dirname "$0")/hello_flood.py" "$ps_address" 1000 $((253 << 10)) 127.0.0.2 "$work/flooded" &
  flood=$!
  check "1000 strangers sent their Hellos" wait_for_file "$work/flooded"
  # The Hellos that do not fit in what strangers may hold are refused (and those past the places).
  check "it refuses the strangers' Hellos past its handshake budget" \
    wait_for "$work/flooded-ps.log" \
    'refused connection from 127\.0\.0\.2:[0-9]+: .*\(transport_options::max_handshake_bytes_total\)' 60
  out=$("$stranger" "$ps_address" ps:0 --secret-file "$PSCORO_AUTH_SECRET_FILE" 2>&1)
  echo "$out" | head -n 1
  check "a task holding the secret gets in while the strangers wait" grep -q 'got into ps:0' <<< "$out"
  grown=$(( $(peak_kib) - before ))
  echo "the ps's peak memory grew by $((grown >> 10)) MiB for 1000 strangers' Hellos"
  check "by at most 64 MiB ($((grown >> 10)) MiB)" test "$grown" -le $((64 << 10))
  kill "$flood" "$ps_pid"
else
  echo "skipped under the sanitizers: a ps out of file descriptors, strangers' memory"
fi

finish
