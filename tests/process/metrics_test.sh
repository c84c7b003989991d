#!/usr/bin/env bash
# Real processes: every task of a live cluster serves its metrics when PSCORO_METRICS_PORT is set.
# Each logs its URL; each page is scraped while the cluster runs and checked by two
# independent readers: Debian's promtool (`promtool check metrics`, installed here with apt when it
# can be) and a strict Python parser of the 0.0.4 format (parse_metrics.py), which also checks the
# values: closures run, ps operations, per-peer traffic, dataset input, process memory and CPU.
# While a worker is stopped, the chief's page shows it silent for longer and longer while the other
# worker's age stays low.
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
  check "$task answers 404 for another path" \
    test "$(curl -s --max-time 30 -o /dev/null -w '%{http_code}' "$base/nothing")" = 404
  check "$task serves its page at /" \
    test "$(curl -s --max-time 30 -o /dev/null -w '%{http_code} %{content_type}' "$base/")" = "200 text/html; charset=utf-8"
  check "$task serves its page's document at /api/cluster" /usr/bin/python3 -c '
import json, sys
d = json.load(sys.stdin)
assert d["task"] == sys.argv[1] and d["view"] == ("chief" if sys.argv[1] == "chief:0" else "task"), d
' "$task" < <(curl -sS --max-time 30 "$base/api/cluster")
  check "$task answers 405 for POST" \
    test "$(curl -s --max-time 30 -o /dev/null -w '%{http_code}' -X POST "${url[$task]}")" = 405
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

echo "--- every task's page links to the chief's page at its real, free port; the chief's shows what the ps served"
chief_page=${url[chief:0]%metrics}
for task in ps:0 worker:0 worker:1; do
  base=${url[$task]%/metrics}
  check "$task's /api/cluster names the chief's page, $chief_page" /usr/bin/python3 -c '
import json, sys
d = json.load(sys.stdin)
assert d["chief_page"] == sys.argv[1], (d["chief_page"], sys.argv[1])
' "$chief_page" < <(curl -sS --max-time 30 "$base/api/cluster")
done
check "the chief's page answers at that URL with the cluster's view" /usr/bin/python3 -c '
import json, sys
d = json.load(sys.stdin)
assert d["view"] == "chief" and d["task"] == "chief:0", (d["view"], d["task"])
' < <(curl -sS --max-time 30 "${chief_page}api/cluster")
# The workers sent the ps $steps updates; the chief, one create. The ps says so in its answers to
# the chief's heartbeats (every second): the chief's view shows it once the next answer is in.
ps_reported() {
  curl -sS --fail --max-time 10 "${chief_page}api/cluster" 2> /dev/null | /usr/bin/python3 -c '
import json, sys
ps = json.load(sys.stdin)["ps"][0]
ok = (ps["task"] == "ps:0" and ps["requests_total"] == int(sys.argv[1]) and ps["held_variables"] == 1
      and (ps["held_bytes"] or 0) >= 8 and (ps["resident_memory_bytes"] or 0) > 0)
if not ok:
    print(ps)
sys.exit(0 if ok else 1)' "$1"
}
ps_reported_within() {  # ps_reported_within REQUESTS: polls the chief's view for up to 60 s
  local deadline=$((SECONDS + 60))
  until ps_reported "$1" > /dev/null; do
    [ "$SECONDS" -lt "$deadline" ] || { ps_reported "$1"; return 1; }
    sleep 0.5
  done
}
check "the chief's view of ps:0 counts the workers' $steps updates and the chief's create, as the ps reports them" \
  ps_reported_within $((steps + 1))

echo "--- a stopped worker: the chief's pscoro_peer_heartbeat_age_seconds for it grows, a live one's stays low"
# The closures are done and the chief holds the cluster up, sending Heartbeats to every task (1 s
# apart by default), so a live worker's age stays within about two intervals. A stopped one's
# climbs, and goes on climbing once its heartbeat timeout (10 s) has closed its connection: no check
# here races that timeout. Only the chief is scraped: a stopped task's listener would take a scrape
# and never answer it.
age() { echo "v('pscoro_peer_heartbeat_age_seconds', peer='$1')"; }  # age PEER: for a check
# chief_ages_until CHECK...: scrapes the chief until its page passes every CHECK (parse_metrics.py),
# for up to 60 s, and prints its heartbeat ages; when time is up, also the check that failed.
chief_ages_until() {
  local page=$work/chief-ages.prom deadline=$((SECONDS + 60)) passed=1
  while [ "$SECONDS" -lt "$deadline" ]; do
    if curl -sS --fail --max-time 10 -o "$page" "${url[chief:0]}" 2> /dev/null &&
      "${parse[@]}" "$page" "$@" > /dev/null; then
      passed=0
      break
    fi
    sleep 0.5
  done
  grep '^pscoro_peer_heartbeat_age_seconds{' "$page" 2> /dev/null
  [ "$passed" -eq 0 ] || "${parse[@]}" "$page" "$@"
  return "$passed"
}
stopped_worker=$(pid_of "$work/run.log" worker-1)
check "both workers have been heard from" chief_ages_until "$(age worker:0) < 10" "$(age worker:1) < 10"
stop_process "$stopped_worker"
check "the chief sees worker:1, stopped, silent for 3 s and more, and worker:0 heard since less than half that" \
  chief_ages_until "$(age worker:1) >= 3" "$(age worker:0) < $(age worker:1) / 2"
continue_process "$stopped_worker"
check "continued, worker:1 is heard again: its age is back under 3 s" chief_ages_until "$(age worker:1) < 3"

echo "--- a scrape that never finishes its request does not hold the task up"
port=$(sed -E 's#^http://[0-9.]+:([0-9]+)/metrics$#\1#' <<< "${url[ps:0]}")
exec 3<>"/dev/tcp/127.0.0.1/$port" 2>/dev/null || true
printf 'GET /metrics HTTP/1.1\r\n' >&3 2>/dev/null || true
check "another scrape is answered meanwhile" curl -sS --fail --max-time 30 -o /dev/null "${url[ps:0]}"
exec 3>&- 2>/dev/null || true

touch "$work/release"
wait_exit "$job" 120
check "the job exits 0 once released (got $code)" test "$code" -eq 0

echo "--- off by default: without PSCORO_METRICS_PORT no task serves or says so"
env -u PSCORO_METRICS_PORT "$launch" --ps 1 --workers 1 -- "$program" 10 "$work/data.txt" "$work/release" \
  > "$work/off.log" 2>&1 &
wait_exit $! 120
check "the job exits 0 (got $code)" test "$code" -eq 0
check "it ran" grep -q "chief: ran 10 closures" "$work/off.log"
check "no task serves metrics" bash -c '! grep -q "metrics at" "$0"' "$work/off.log"

echo "--- pscoro-launch --prometheus-file-sd: a real Prometheus finds every task from that file alone"
rm -f "$work/release"
env -u PSCORO_METRICS_PORT "$launch" --ps 1 --workers 2 --prometheus-file-sd "$work/targets.json" -- \
  "$program" 10 "$work/data.txt" "$work/release" > "$work/sd.log" 2>&1 &
job=$!
check "the chief ran its closures" wait_for "$work/sd.log" "chief: ran 10 closures"
check "the launcher says where the cluster page is" \
  grep -qE "$(line_of launcher)"'cluster page at http://127\.0\.0\.1:[0-9]+/$' "$work/sd.log"
check "the file names the 4 tasks, each with its job" /usr/bin/python3 -c '
import json, sys
groups = json.load(open(sys.argv[1]))
tasks = sorted((g["labels"]["task"], g["labels"]["job"]) for g in groups for _ in g["targets"])
assert tasks == [("chief:0", "chief"), ("ps:0", "ps"), ("worker:0", "worker"), ("worker:1", "worker")], tasks
' "$work/targets.json"
if command -v prometheus > /dev/null; then
  prom_port=$(/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  cat > "$work/prometheus.yml" <<YAML
scrape_configs:
  - job_name: pscoro
    scrape_interval: 1s
    file_sd_configs:
      - files: ["$work/targets.json"]
        refresh_interval: 1s
YAML
  prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/prometheus" \
    --web.listen-address="127.0.0.1:$prom_port" > "$work/prometheus.log" 2>&1 &
  prometheus=$!
  # up{task=...} == 1 for every task: scraped, from the file's targets and labels alone.
  up_everywhere() {
    curl -sS --fail --max-time 5 "http://127.0.0.1:$prom_port/api/v1/query?query=up" 2> /dev/null |
      /usr/bin/python3 -c '
import json, sys
result = json.load(sys.stdin)["data"]["result"]
up = sorted(r["metric"]["task"] for r in result if r["value"][1] == "1")
sys.exit(up != ["chief:0", "ps:0", "worker:0", "worker:1"])'
  }
  deadline=$((SECONDS + 90))
  until up_everywhere || [ "$SECONDS" -ge "$deadline" ]; do sleep 0.5; done
  check "Prometheus scrapes all 4 tasks (up == 1, labelled by task)" up_everywhere
  kill "$prometheus" 2> /dev/null
  wait "$prometheus" 2> /dev/null
else
  echo "(no prometheus binary: the file's contents are checked, not a scrape)"
fi
touch "$work/release"
wait_exit "$job" 120
check "the job exits 0 once released (got $code)" test "$code" -eq 0
finish
