#!/usr/bin/env bash
# Real processes: the CTR example trains a factorization machine with 1M-row tables sharded over
# 2 ps by 2 workers, and must end within 0.02 of the ground truth's AUC; its generator writes
# well-formed Criteo TSV.
# usage: ctr_test.sh PSCORO_LAUNCH CTR EXAMPLE_PROTO_DIR
set -uo pipefail
launch=$1
example=$2
proto_dir=$3
here=$(dirname "$0")
source "$(dirname "$0")/checks.sh"

echo "--- the generator writes Criteo TSV: 40 tab-separated fields, labels 0/1, 8-hex categoricals"
"$example" --write-tsv "$work/data.tsv" --lines 2000
check "it writes 2000 lines" test "$(wc -l < "$work/data.tsv")" -eq 2000
check "every line has 40 fields" test "$(awk -F'\t' 'NF != 40' "$work/data.tsv" | wc -l)" -eq 0
check "labels are 0 or 1, both present" test "$(cut -f1 "$work/data.tsv" | sort -u | tr -d '\n')" = "01"
check "categoricals are 8 hex digits or empty" \
  test "$(cut -f15-40 "$work/data.tsv" | tr '\t' '\n' | grep -cvE '^([0-9a-f]{8})?$')" -eq 0
check "some values are missing" grep -qP '\t\t' "$work/data.tsv"
"$example" --write-tsv "$work/again.tsv" --lines 2000
check "the same seed writes the same data" cmp -s "$work/data.tsv" "$work/again.tsv"

echo "--- the same data as TFRecord of tf.train.Example, read by an independent reader"
for gz in "" --gzip; do
  "$example" --write-tfrecord "$work/data.tfrecord" --lines 2000 $gz
  mkdir -p "$work/py"
  check "an independent reader finds the TSV's lines in the TFRecord file ${gz:-(plain)}" \
    /usr/bin/python3 "$here/read_tfrecord.py" "$proto_dir" "$work/py" "$work/data.tfrecord" "$work/data.tsv"
done

echo "--- training reaches the ground truth's AUC within 0.02"
"$launch" --ps 2 --workers 2 -- "$example" --steps 3000 --log-every 1000 > "$work/run.log" 2>&1
code=$?
check "the cluster exits 0 (got $code)" test "$code" -eq 0
check "the tables are split over both ps" \
  grep -qE '^\[chief\] chief: factors 1048576 x 16 in 2 shards, wide in 2 shards' "$work/run.log"
check "the chief reports the AUC and the gap" \
  grep -qE '^\[chief\] chief: test AUC 0\.[0-9]+, ground truth 0\.[0-9]+ \(gap -?0\.0[0-1][0-9]+\) on 100000 examples$' \
  "$work/run.log"
[ "$failed" -eq 0 ] || cat "$work/run.log"
grep -E 'AUC' "$work/run.log"

finish
