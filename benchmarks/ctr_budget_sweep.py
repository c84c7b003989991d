#!/usr/bin/python3
"""The CTR example on raw ids at several memory budgets: hash tables against a fixed table of the same bytes.

For each hash-table configuration (a budget: with --ttl T the rows held follow the ids named within
T steps; --capacity caps them; --buckets lowers the floor the tables' maps cost) and each seed it
runs, back to back on 2 ps and 2 workers (pscoro-launch):
  1. `ctr --ids raw --embedding hash <configuration>`, reading each ps's report of what its part of
     the tables holds (rows, bytes) over the run; the budget is the peak of their sum;
  2. `ctr --ids raw --embedding fixed --rows R`, R = that peak / 136 bytes (a row of 17 floats and
     its Adagrad slot), the same bytes on the ps.
Same data, steps and seed for both, and the configuration's arguments other than the hash tables'
own (--ttl, --capacity, --buckets, --admission-min-count, each with a value). It prints a line per
pair (test AUCs, their difference, memory, the steps/s ratio within the pair) and per configuration
the medians over the seeds; --trace FILE also writes the hash runs' rows held over time (seconds, the
chief's last step, rows, MiB, summed over the ps) with every pair, --logs DIR every job's output.

  benchmarks/ctr_budget_sweep.py --seeds 2026,2027              # --ttl 200, 100, 50, 25, 12
  benchmarks/ctr_budget_sweep.py --hash "--ttl 12 --buckets 64" --hash "--capacity 1500 --buckets 64"

Needs a release build of pscoro-launch and the ctr example (--build). Steps/s depend on what else runs
on the host, so only their ratio within a pair (run back to back) is printed; the AUCs depend on
timing only through the order of the asynchronous steps (and, at TTLs near the chief's window of
scheduled steps, through which rows are evicted: benchmarks/RESULTS.md, 2026-11-29 14:00). The
training data is written once per seed into --data-dir (~435 MB per seed at 1M lines).
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

FIXED_ROW_BYTES = (1 + 16) * 4 * 2  # wide weight + 16 factors, float32, and Adagrad's accumulator
HASH_ONLY = {"--ttl", "--capacity", "--buckets", "--admission-min-count"}  # each takes a value


def split_config(config):
    """A configuration's arguments: (the hash tables' own, those both runs of the pair get)."""
    words, own, shared = config.split(), [], []
    for i in range(0, len(words), 2):
        (own if words[i] in HASH_ONLY else shared).extend(words[i:i + 2])
    return own, shared

AUC = re.compile(r"test AUC ([0-9.]+), ground truth ([0-9.]+)")
RATE = re.compile(r"trained (\d+) steps in ([0-9.]+) s: ([0-9.]+) steps/s")
STEP = re.compile(r"chief: step (\d+)/")
# The ps's message, whatever the launcher's prefix ("[ps-0] ps:0: ..." or "<time> INFO [ps:0] ps:0: ...").
HELD = re.compile(r"ps:(\d+): its part of the hash tables holds (\d+) rows in ([0-9.]+) MiB")


def run(args, ctr_args, label):
    """Runs one job; returns its test AUC, the truth's, steps/s and the hash tables' reports over time."""
    command = [f"{args.build}/tools/pscoro-launch", "--ps", str(args.ps), "--workers", str(args.workers), "--",
               f"{args.build}/examples/ctr", "--ids", "raw", "--data-dir", args.data_dir,
               "--train-examples", str(args.train_examples), "--log-every", str(args.log_every),
               "--report-seconds", str(args.report_seconds)] + ctr_args
    if args.nice:
        command = ["nice", "-n", str(args.nice)] + command
    print(f"# {label}: {' '.join(command)}", file=sys.stderr, flush=True)
    started = time.monotonic()
    out = {"auc": None, "truth": None, "steps_per_s": None, "trace": [], "log": []}
    latest = {}  # ps -> (rows, MiB)
    step = 0
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as job:
        for line in job.stdout:
            line = line.rstrip("\n")
            out["log"].append(line)
            if m := STEP.search(line):
                step = int(m.group(1))
            elif m := HELD.search(line):
                latest[int(m.group(1))] = (int(m.group(2)), float(m.group(3)))
                if len(latest) == args.ps:
                    rows = sum(r for r, _ in latest.values())
                    mib = round(sum(b for _, b in latest.values()), 2)
                    out["trace"].append((round(time.monotonic() - started, 1), step, rows, mib))
            elif m := RATE.search(line):
                out["steps_per_s"] = float(m.group(3))
            elif m := AUC.search(line):
                out["auc"], out["truth"] = float(m.group(1)), float(m.group(2))
        code = job.wait()
    if args.logs:
        os.makedirs(args.logs, exist_ok=True)
        with open(os.path.join(args.logs, re.sub(r"[^A-Za-z0-9]+", "_", label).strip("_") + ".log"), "w") as file:
            file.write("\n".join(out["log"]) + "\n")
    if out["auc"] is None:
        sys.stderr.write("\n".join(out["log"][-30:]) + "\n")
        raise SystemExit(f"{label}: no test AUC (exit {code})")
    print(f"# {label}: AUC {out['auc']:.4f} (truth {out['truth']:.4f}), {out['steps_per_s']} steps/s, "
          f"{time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", default="build")
    parser.add_argument("--data-dir", default="build/ctr-data")
    parser.add_argument("--hash", action="append", metavar="ARGS",
                        help="ctr arguments of one hash-table configuration (repeat; default: "
                             "--ttl 200, 100, 50, 25, 12)")
    parser.add_argument("--seeds", default="2026,2027")
    parser.add_argument("--train-examples", type=int, default=1000000)
    parser.add_argument("--ps", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--log-every", type=int, default=100)
    parser.add_argument("--report-seconds", type=float, default=1)
    parser.add_argument("--nice", type=int, default=19, help="run the jobs under nice -n N (0: not)")
    parser.add_argument("--logs", help="write each job's output into this directory")
    parser.add_argument("--trace", help="write the hash runs' rows held over time here (JSON)")
    args = parser.parse_args()

    configs = args.hash or [f"--ttl {t}" for t in (200, 100, 50, 25, 12)]
    seeds = [int(s) for s in args.seeds.split(",")]
    pairs = []
    traces = {}
    width = max(len(c) for c in configs)
    header = (f"{'hash tables':<{width}} {'seed':>5} {'hash MiB':>9} {'rows held':>10} {'B/row':>6} "
              f"{'fixed rows':>10} {'fixed MiB':>9} {'AUC hash':>8} {'AUC fixed':>9} {'hash-fixed':>10} {'truth':>6} "
              f"{'steps/s h/f':>11}")
    for seed in seeds:
        for config in configs:
            own, shared = split_config(config)
            common = ["--seed", str(seed)] + shared
            h = run(args, common + ["--embedding", "hash"] + own, f"hash {config} seed {seed}")
            if not h["trace"]:
                raise SystemExit(f"hash {config} seed {seed}: no report of rows held from the ps")
            peak = max(h["trace"], key=lambda t: t[3])
            mib, rows = peak[3], peak[2]
            fixed_rows = int(mib * (1 << 20) / FIXED_ROW_BYTES)
            f = run(args, common + ["--embedding", "fixed", "--rows", str(fixed_rows)],
                    f"fixed {fixed_rows} {' '.join(shared)} seed {seed}")
            pair = {"config": config, "seed": seed, "hash_mib": mib, "rows_held": rows,
                    "bytes_per_row": mib * (1 << 20) / rows,
                    "fixed_rows": fixed_rows, "fixed_mib": fixed_rows * FIXED_ROW_BYTES / (1 << 20),
                    "auc_hash": h["auc"], "auc_fixed": f["auc"], "truth": h["truth"],
                    "rate_ratio": h["steps_per_s"] / f["steps_per_s"]}
            pairs.append(pair)
            traces[f"{config} seed {seed}"] = h["trace"]
            if args.trace:
                with open(args.trace, "w") as file:
                    json.dump({"pairs": pairs, "traces": traces}, file, indent=1)

    print(header)
    for p in pairs:
        print(f"{p['config']:<{width}} {p['seed']:>5} {p['hash_mib']:>9.1f} {p['rows_held']:>10} "
              f"{p['bytes_per_row']:>6.0f} "
              f"{p['fixed_rows']:>10} {p['fixed_mib']:>9.1f} {p['auc_hash']:>8.4f} {p['auc_fixed']:>9.4f} "
              f"{p['auc_hash'] - p['auc_fixed']:>+10.4f} {p['truth']:>6.4f} {p['rate_ratio']:>11.2f}")
    print()
    # Medians over the seeds of what compares across seeds (each seed has its own truth, so not the AUCs).
    print(f"{'hash tables':<{width}} {'hash MiB':>9} {'hash-fixed (median; range)':>28} {'steps/s h/f':>11}"
          f"  (medians over {len(seeds)} seeds)")
    for config in configs:
        ps = [p for p in pairs if p["config"] == config]
        d = [p["auc_hash"] - p["auc_fixed"] for p in ps]
        print(f"{config:<{width}} {statistics.median(p['hash_mib'] for p in ps):>9.1f} "
              f"{statistics.median(d):>+10.4f} ({min(d):+.4f} to {max(d):+.4f}) "
              f"{statistics.median(p['rate_ratio'] for p in ps):>11.2f}")


if __name__ == "__main__":
    main()
