# What every process test sources: a scratch directory removed at exit (and background jobs
# killed), and `check DESCRIPTION COMMAND...` counting results for the closing
# "N passed, N failed" line that scripts/count_tests.py reads.
work=$(mktemp -d)
trap 'kill -9 $(jobs -p) 2>/dev/null; rm -rf "$work"' EXIT

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
