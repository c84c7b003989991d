#!/usr/bin/env bash
# Real processes: every task of a live cluster serves its metrics when PSCORO_METRICS_PORT is set
# (issue 17 §1). Each logs its URL; each page is scraped while the cluster runs and checked by two
# independent readers: Debian's promtool (`promtool check metrics`, installed here with apt when it
# can be) and a strict Python parser of the 0.0.4 format (parse_metrics.py), which also checks the
# values: closures run, ps operations, per-peer traffic, dataset input, process memory and CPU.
# usage: metrics_test.sh PSCORO_LAUNCH METRICS_CLUSTER
set -uo pipefail
launch=$1
program=$2
here=$(dirname "$0")
source "$here/checks.sh"
parse=("/usr/bin/python3" "$here/parse_metrics.py")

echo "--- the strict parser refuses what the format does not allow"
bad() {  # bad DESCRIPTION PAGE
  printf '%b' "$2" > "$work/bad.txt"
  check "the parser refuses $1" bash -c '! "$0" "$1" "$2" > /dev/null' "${parse[@]}" "$work/bad.txt"
}
bad "a duplicate series" '# TYPE a counter\na 1\na 2\n'
bad "a histogram without +Inf" '# TYPE h histogram\nh_bucket{le="1"} 1\nh_sum 1\nh_count 1\n'
bad "a bad escape" '# TYPE a gauge\na{x="\\q"} 1\n'
bad "a split family" '# TYPE a gauge\na{x="1"} 1\n# TYPE b gauge\nb 1\na{x="2"} 1\n'
bad "a page without its last line feed" '# TYPE a gauge\na 1'
printf '# HELP a A \\\\ help.\n# TYPE a counter\na{x="q\\"\\n"} 1\n' > "$work/good.txt"
check "the parser takes a valid page" "${parse[@]}" "$work/good.txt" "v('a', x='q\"\n') == 1"

if ! command -v promtool > /dev/null && [ "$(id -u)" -eq 0 ]; then
  echo "--- installing Debian's prometheus package for promtool"
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus > "$work/apt.log" 2>&1 ||
    echo "(apt could not install prometheus; the Python parser checks alone)"
fi

echo "--- a live cluster with PSCORO_METRICS_PORT=0: every task serves /metrics"
seq 1 50 | sed 's/^/line /' > "$work/data.txt"
steps=200
PSCORO_METRICS_PORT=0 "$launch" --ps 1 --workers 2 -- "$program" "$steps" "$work/data.txt" "$work/release" \
  > "$work/run.log" 2>&1 &
job=$!
check "the chief ran its closures" wait_for "$work/run.log" "chief: ran $steps closures"
declare -A url
for task in chief:0 ps:0 worker:0 worker:1; do
  line=$(grep -E "INFO \[$task\] $task metrics at http://[0-9.]+:[0-9]+/metrics$" "$work/run.log" | head -n 1)
  check "$task logs its metrics URL" test -n "$line"
  url[$task]=${line##* }
done

for task in "${!url[@]}"; do
  page="$work/$task.prom"
  check "$task answers a scrape" curl -sS --fail --max-time 30 -o "$page" "${url[$task]}"
  check "$task's content type is the 0.0.4 text format" \
    grep -q 'text/plain; version=0.0.4' <(curl -sS --max-time 30 -D - -o /dev/null "${url[$task]}")
  if command -v promtool > /dev/null; then
    check "promtool finds $task's page valid" promtool check metrics < "$page"
  fi
  check "$task's page has the process's memory and CPU" "${parse[@]}" "$page" \
    "v('process_resident_memory_bytes') > 0" "v('process_cpu_seconds_total') > 0"
  base=${url[$task]%/metrics}
  check "$task answers 404 for another path" test "$(curl -s -o /dev/null -w '%{http_code}' "$base/")" = 404
  check "$task answers 405 for POST" test "$(curl -s -o /dev/null -w '%{http_code}' -X POST "${url[$task]}")" = 405
done

check "the chief's page has TF's coordinator metrics and its traffic with every task" "${parse[@]}" "$work/chief:0.prom" \
  "v('pscoro_coordinator_closure_execution_seconds_count') == $steps" \
  "v('pscoro_coordinator_remote_value_fetch_seconds_count') == $steps" \
  "v('pscoro_coordinator_queued_closures') == 0" "v('pscoro_coordinator_inflight_closures') == 0" \
  "v('pscoro_coordinator_worker_failures_total') == 0" "v('pscoro_coordinator_ps_failures_total') == 0" \
  "v('pscoro_coordinator_iterator_rebuilds_total') == 0" \
  "all(v('pscoro_peer_sent_frames_total', peer=p) > 0 and v('pscoro_peer_received_bytes_total', peer=p) > 0 for p in ('ps:0', 'worker:0', 'worker:1'))" \
  "v('pscoro_peer_sent_frames_total', peer='worker:0') + v('pscoro_peer_sent_frames_total', peer='worker:1') >= $steps"
check "the ps's page has its operations, what it holds and its traffic" "${parse[@]}" "$work/ps:0.prom" \
  "v('pscoro_ps_operation_seconds_count', operation='update') == $steps" \
  "v('pscoro_ps_operation_seconds_count', operation='create') == 1" \
  "v('pscoro_ps_operation_errors_total', operation='update') == 0" \
  "v('pscoro_ps_variables') == 1" "v('pscoro_ps_held_bytes') >= 8" \
  "v('pscoro_peer_received_frames_total', peer='worker:0') + v('pscoro_peer_received_frames_total', peer='worker:1') >= $steps"
check "the workers' pages count every element their closures took, and the bytes read" "${parse[@]}" \
  "$work/worker:0.prom" "v('pscoro_dataset_elements_total') >= 1" "v('pscoro_dataset_bytes_read_total') > 0"
elements=0
for task in worker:0 worker:1; do
  n=$(sed -n 's/^pscoro_dataset_elements_total \([0-9]*\)$/\1/p' "$work/$task.prom")
  elements=$((elements + ${n:-0}))
done
check "the two workers took $steps elements in all (got $elements)" test "$elements" -eq "$steps"

echo "--- a scrape that never finishes its request does not hold the task up"
port=$(sed -E 's#^http://[0-9.]+:([0-9]+)/metrics$#\1#' <<< "${url[ps:0]}")
exec 3<>"/dev/tcp/127.0.0.1/$port" 2>/dev/null || true
printf 'GET /metrics HTTP/1.1\r\n' >&3 2>/dev/null || true
check "another scrape is answered meanwhile" curl -sS --fail --max-time 30 -o /dev/null "${url[ps:0]}"
exec 3>&- 2>/dev/null || true

touch "$work/release"
wait "$job"
code=$?
check "the job exits 0 once released (got $code)" test "$code" -eq 0

echo "--- off by default: without PSCORO_METRICS_PORT no task serves or says so"
env -u PSCORO_METRICS_PORT "$launch" --ps 1 --workers 1 -- "$program" 10 "$work/data.txt" "$work/release" \
  > "$work/off.log" 2>&1
code=$?
check "the job exits 0 (got $code)" test "$code" -eq 0
check "it ran" grep -q "chief: ran 10 closures" "$work/off.log"
check "no task serves metrics" bash -c '! grep -q "metrics at" "$0"' "$work/off.log"
finish
