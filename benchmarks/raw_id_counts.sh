#!/usr/bin/env bash
# How often the raw ids of a training-data directory are seen (ctr --ids raw --prepare-only writes
# one): distinct ids over the 26 categorical fields, those seen at least 5 / 20 / 50 / 100 times,
# and the share of the occurrences the ids seen 50 times or more carry. The mid-frequency ids are
# what a collisionless table could gain on over a hashed fixed one (benchmarks/RESULTS.md).
# usage: benchmarks/raw_id_counts.sh DATA_DIR
set -euo pipefail
cat "$1"/*.tsv | cut -f15-40 | awk -F'\t' '
  { for (f = 1; f <= NF; ++f) if ($f != "") { n[f ":" $f]++; total++ } }
  END {
    for (id in n) { c = n[id]; d++; if (c >= 5) a++; if (c >= 20) b++; if (c >= 50) { e++; e_occ += c }; if (c >= 100) g++ }
    printf "occurrences %d, distinct ids %d, seen >= 5: %d, >= 20: %d, >= 50: %d, >= 100: %d; ids seen >= 50 carry %.1f%%\n",
           total, d, a, b, e, g, 100 * e_occ / total
  }'
