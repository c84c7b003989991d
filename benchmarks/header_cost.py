#!/usr/bin/python3
"""What including each public header costs a program: preprocessed lines and the compiler's CPU
time for `-fsyntax-only` (user + system, median of --repeat runs; CPU time, not wall time, so that
a loaded machine distorts it less). Prints one Markdown table row per header, heaviest first.

  benchmarks/header_cost.py [--compiler g++] [--repeat 3] [--include DIR]... HEADER_DIR

HEADER_DIR is a tree of public headers (`include/` of a checkout); every `pscoro/*.hpp` directly in
it is measured (not `detail/` or `impl/`: users do not include those). --include adds a directory
to search (a build's `include/`, which holds the generated <pscoro/config.hpp>). A header that needs
a library not found there (<pscoro/torch.hpp> without libtorch's API include directory,
/usr/include/torch/csrc/api/include) is listed as not measured. To compare with an older commit,
check it out with `git worktree add` and measure its `include/` the same way.
"""
import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile

FLAGS = ["-std=c++20", "-DASIO_NO_DEPRECATED", "-DASIO_DISABLE_STD_ALIGNED_ALLOC", "-pthread"]


def children_cpu_seconds():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def compile_once(command):
    """CPU seconds of one compiler run; raises with the compiler's message if it fails."""
    before = children_cpu_seconds()
    run = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{run.stderr[:2000]}")
    return children_cpu_seconds() - before, run.stdout


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("header_dir")
    parser.add_argument("--compiler", default="g++")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--include", action="append", default=[])
    args = parser.parse_args()

    public = os.path.join(args.header_dir, "pscoro")
    headers = sorted(name for name in os.listdir(public) if name.endswith(".hpp"))
    includes = [f"-I{d}" for d in args.include + [args.header_dir]]
    rows = []
    skipped = []
    with tempfile.TemporaryDirectory() as scratch:
        for name in headers:
            source = os.path.join(scratch, "include_" + name.replace(".", "_") + ".cpp")
            with open(source, "w") as out:
                out.write(f"#include <pscoro/{name}>\n")
            base = [args.compiler] + FLAGS + includes
            try:
                _, preprocessed = compile_once(base + ["-E", "-P", source])
            except RuntimeError as failure:
                missing = re.search(r"fatal error: (\S+): No such file or directory", str(failure))
                if not missing or missing.group(1).startswith("pscoro/"):
                    raise
                skipped.append((name, missing.group(1)))  # <pscoro/torch.hpp> without libtorch
                continue
            lines = preprocessed.count("\n")
            times = [compile_once(base + ["-fsyntax-only", source])[0] for _ in range(args.repeat)]
            rows.append((statistics.median(times), lines, name))
    rows.sort(reverse=True)
    print(f"| header | preprocessed lines | `-fsyntax-only` CPU s (median of {args.repeat}) |")
    print("|---|---:|---:|")
    for seconds, lines, name in rows:
        print(f"| `<pscoro/{name}>` | {lines:,} | {seconds:.2f} |")
    for name, missing in skipped:
        print(f"| `<pscoro/{name}>` | not measured: needs `<{missing}>` | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
