"""Counts test cases in a meson testlog.json and prints "N passed, N failed".

Each test executable reports its own cases: doctest's "[doctest] test cases: T | P passed | F failed"
line, or a plain "P passed, F failed" line (shell tests). An executable that failed without
reporting failed cases (a crash, a timeout, a failing fixture) counts as one more failure; a
should_fail test that failed as expected counts as one passed case.
Exits 1 when anything failed or nothing ran.
"""
import json
import re
import sys

DOCTEST = re.compile(r"^\[doctest\] test cases:\s*\d+ \|\s*(\d+) passed \|\s*(\d+) failed", re.M)
PLAIN = re.compile(r"^(\d+) passed, (\d+) failed$", re.M)


def main(path):
    passed = failed = 0
    with open(path) as log:
        for line in log:
            test = json.loads(line)
            output = test.get("stdout", "") + "\n" + test.get("stderr", "")
            if test["result"] == "EXPECTEDFAIL":  # a should_fail test that failed: one check passed
                passed += 1
                continue
            counts = DOCTEST.findall(output) or PLAIN.findall(output)
            p = sum(int(c[0]) for c in counts)
            f = sum(int(c[1]) for c in counts)
            if test["result"] not in ("OK", "SKIP", "EXPECTEDFAIL") and f == 0:
                f = 1
                print(f"{test['name']}: {test['result']}", file=sys.stderr)
            passed += p
            failed += f
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 and passed > 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
