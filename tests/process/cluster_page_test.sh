#!/usr/bin/env bash
# Real processes and a real browser: the chief's page of a live cluster (fashion_mnist, 1 ps, 2
# workers, PSCORO_METRICS_PORT=0) in Debian's headless Chromium, driven by Debian's chromedriver and
# python3-selenium (cluster_page.py says what it checks, up to the page saying the chief is
# unreachable once the job has ended). The run is long enough never to end by itself before the
# browser has seen it; the test ends it. A screenshot goes to SCREENSHOT.
# usage: cluster_page_test.sh PSCORO_LAUNCH FASHION_MNIST SCREENSHOT
set -uo pipefail
launch=$1
fashion=$2
screenshot=$3
here=$(dirname "$0")
source "$here/checks.sh"

for needed in /usr/bin/chromium /usr/bin/chromedriver; do
  if [ ! -x "$needed" ]; then
    echo "$needed is missing: apt-get install chromium chromium-driver python3-selenium (scripts/run.sh test does)"
    exit 77
  fi
done
if ! /usr/bin/python3 -c 'import selenium' 2> /dev/null; then
  echo "python3-selenium is missing: apt-get install python3-selenium (scripts/run.sh test does)"
  exit 77
fi

echo "--- a live cluster serving its pages"
PSCORO_METRICS_PORT=0 "$launch" --ps 1 --workers 2 -- "$fashion" --steps 10000000 --log-every 100000 \
  --logdir "$work/logs" --checkpoint-dir "$work/checkpoints" --checkpoint-every 200 > "$work/run.log" 2>&1 &
job=$!
declare -A url
for task in chief:0 ps:0; do
  check "$task logs its metrics URL" wait_for "$work/run.log" "INFO \[$task\] $task metrics at http://" 60
  line=$(grep -E "INFO \[$task\] $task metrics at http://[0-9.]+:[0-9]+/metrics$" "$work/run.log" | head -n 1)
  url[$task]=${line##* }
  url[$task]=${url[$task]%metrics}
done
[ "$failed" -eq 0 ] || finish

echo "--- the pages in the browser: $(/usr/bin/chromium --version 2> /dev/null)"
rm -f "$screenshot"
check "the browser sees the cluster, then the chief unreachable" \
  /usr/bin/python3 "$here/cluster_page.py" "${url[chief:0]}" "${url[ps:0]}" "$job" "$screenshot"
check "a screenshot was saved" test -s "$screenshot"
wait_exit "$job" 60
check "the job has ended" bash -c '! kill -0 "$0" 2> /dev/null' "$job"
[ "$failed" -eq 0 ] || tail -n 40 "$work/run.log"

finish
