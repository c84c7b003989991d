#!/usr/bin/env bash
# Real processes: the CTR example's chief writes its training data once as Criteo TSV or as
# TFRecord files; workers read their share through per-worker datasets. Checks the files (an
# independent reader for the TFRecords), that both formats train identically, that a corrupt record
# reaches the chief as an error naming the file, and that 2 workers with 1M-row tables sharded over
# 2 ps end within 0.02 of the ground truth's AUC (PSCORO_CTR_FULL_RUN=0: a shorter run, below).
# usage: ctr_test.sh PSCORO_LAUNCH CTR EXAMPLE_PROTO_DIR
set -uo pipefail
launch=$1
example=$2
proto_dir=$3
here=$(dirname "$0")
source "$(dirname "$0")/checks.sh"

small=(--train-examples 2000 --files 2)
prepare() {  # prepare ROOT [options...]: writes the small data set under ROOT as TSV and as TFRecord
  local root=$1; shift
  "$example" --prepare-only --data-dir "$root" "${small[@]}" "$@" > "$work/prepare.out"
}
dir_of() {  # dir_of TSV|TFRecord: the directory the last prepare named for that format
  sed -nE "s/$(line_of -)chief: training data in (.*) \(2000 lines in 2 $1 files\)$/\1/p" "$work/prepare.out"
}

echo "--- the generator writes Criteo TSV: 40 tab-separated fields, labels 0/1, 8-hex categoricals"
prepare "$work/small"
tsv_dir=$(dir_of TSV)
records_dir=$(dir_of TFRecord)
check "it names the directories it wrote" test -d "$tsv_dir" -a -d "$records_dir" -a "$tsv_dir" != "$records_dir"
check "2 TSV files, TF's names" test "$(ls "$tsv_dir" | tr '\n' ' ')" = "train-00000-of-00002.tsv train-00001-of-00002.tsv "
check "2 TFRecord files, TF's names" \
  test "$(ls "$records_dir" | tr '\n' ' ')" = "train-00000-of-00002.tfrecord train-00001-of-00002.tfrecord "
cat "$tsv_dir"/*.tsv > "$work/all.tsv"
check "the TSV files hold 2000 lines" test "$(wc -l < "$work/all.tsv")" -eq 2000
check "every line has 40 fields" test "$(awk -F'\t' 'NF != 40' "$work/all.tsv" | wc -l)" -eq 0
check "labels are 0 or 1, both present" test "$(cut -f1 "$work/all.tsv" | sort -u | tr -d '\n')" = "01"
check "categoricals are 8 hex digits or empty" \
  test "$(cut -f15-40 "$work/all.tsv" | tr '\t' '\n' | grep -cvE '^([0-9a-f]{8})?$')" -eq 0
check "some values are missing" grep -qP '\t\t' "$work/all.tsv"
inodes=$(ls -i "$tsv_dir" "$records_dir")
prepare "$work/small"
check "a second run finds the data and writes nothing" \
  test "$(dir_of TSV) $(dir_of TFRecord)" = "$tsv_dir $records_dir" -a "$(ls -i "$tsv_dir" "$records_dir")" = "$inodes"
prepare "$work/again"
check "the same seed writes the same data" diff -r -q "$work/small" "$work/again"

echo "--- the TFRecord files hold the TSV's lines as tf.train.Example (an independent reader)"
prepare "$work/small" --gzip
gzip_dir=$(dir_of TFRecord)
check "GZIP-compressed TFRecord files are written apart" test -d "$gzip_dir" -a "$gzip_dir" != "$records_dir"
mkdir -p "$work/py"
for part in 00000 00001; do
  for d in "$records_dir" "$gzip_dir"; do
    check "part $part of $(basename "$d") reads back" /usr/bin/python3 "$here/read_tfrecord.py" "$proto_dir" "$work/py" \
      "$d/train-$part-of-00002.tfrecord" "$tsv_dir/train-$part-of-00002.tsv"
  done
done

echo "--- one worker, one closure at a time: the same training from TSV, TFRecord and GZIP TFRecord"
train_small() {  # train_small ROOT LOG [options...]
  local root=$1 log=$2; shift 2
  "$launch" --ps 1 --workers 1 -- "$example" --data-dir "$root" "${small[@]}" --steps 60 --batch-size 64 \
    --rows 4096 --test-examples 2000 --log-every 20 --closures-per-worker 1 --max-auc-gap 1 "$@" > "$log" 2>&1
}
train_small "$work/small" "$work/tsv.log" --format tsv
check "it trains from TSV (exit $?)" grep -q 'chief: test AUC' "$work/tsv.log"
train_small "$work/small" "$work/tfrecord.log" --format tfrecord
check "it trains from TFRecord (exit $?)" grep -q 'chief: test AUC' "$work/tfrecord.log"
train_small "$work/small" "$work/gzip.log" --format tfrecord --gzip
check "it trains from GZIP TFRecord (exit $?)" grep -q 'chief: test AUC' "$work/gzip.log"
# The progress lines without their time, rate and time left, which vary from run to run.
results() { grep -E "$(line_of chief:0)"'chief: (step|test)' "$1" | sed -E 's/^[^]]*\] //; s| [0-9.]+ steps/s .*$||'; }
results "$work/tsv.log" > "$work/tsv.out"
check "the losses and the AUC print" test "$(wc -l < "$work/tsv.out")" -eq 4
check "progress lines say the rate and the time left" \
  grep -qE "$(line_of chief:0)"'chief: step 20/60 loss [0-9]+\.[0-9]{4} [0-9]+\.[0-9] steps/s ETA [0-9:]+s?$' "$work/tsv.log"
check "TFRecord gives the same losses and AUC as TSV" diff <(results "$work/tfrecord.log") "$work/tsv.out"
check "GZIP TFRecord too" diff <(results "$work/gzip.log") "$work/tsv.out"

echo "--- a corrupt record: the run stops with an error naming the file and the record's offset"
cp -r "$work/small" "$work/corrupt"
printf '\xff' | dd of="$work/corrupt/$(basename "$records_dir")/train-00001-of-00002.tfrecord" bs=1 seek=5000 conv=notrunc \
  status=none
train_small "$work/corrupt" "$work/corrupt.log" --format tfrecord
code=$?
check "the cluster exits 1 (got $code)" test "$code" -eq 1
check "the chief names the file, the byte offset and the cause" \
  grep -qE "$(line_of chief:0)"'chief: .*train-00001-of-00002\.tfrecord: corrupt TFRecord at byte [0-9]+: the data.s checksum' \
  "$work/corrupt.log"
[ "$failed" -eq 0 ] || cat "$work/corrupt.log"

# The full run: the example's defaults, 1M lines of training data, 3000 steps, the AUC within 0.02
# of the truth's. The sanitizer build asks for a shorter one (PSCORO_CTR_FULL_RUN=0): the same 1M-row
# tables over 2 ps and 2 workers, 300k lines and 1000 steps, which learn (the AUC within 0.1) but
# not to 0.02; the release build checks the model's quality, the sanitizers its memory.
if [ "${PSCORO_CTR_FULL_RUN:-1}" = 1 ]; then
  lines=1000000 test_examples=100000 max_gap=0.02 run=()
else
  lines=300000 test_examples=20000 max_gap=0.1
  run=(--train-examples "$lines" --steps 1000 --test-examples "$test_examples" --max-auc-gap "$max_gap")
fi
echo "--- 2 ps, 2 workers, 1M-row tables, $lines lines: the test AUC within $max_gap of the ground truth's"
"$launch" --ps 2 --workers 2 -- "$example" --data-dir "$work/data" --log-every 1000 "${run[@]}" > "$work/run.log" 2>&1
code=$?
check "the cluster exits 0 (got $code)" test "$code" -eq 0
check "the chief wrote $lines lines of training data" \
  grep -qE "$(line_of chief:0)chief: training data in .* \($lines lines in 8 TSV files\)" "$work/run.log"
check "the tables are split over both ps" \
  grep -qE "$(line_of chief:0)"'chief: factors 1048576 x 16 in 2 shards, wide in 2 shards' "$work/run.log"
check "the chief reports the AUC and the gap" \
  grep -qE "$(line_of chief:0)chief: test AUC 0\.[0-9]+, ground truth 0\.[0-9]+ \(gap -?0\.[0-9]+\) on $test_examples examples\$" \
  "$work/run.log"
[ "$failed" -eq 0 ] || cat "$work/run.log"
grep -E 'AUC' "$work/run.log"

finish
