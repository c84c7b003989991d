#!/usr/bin/python3
"""pscoro beside PyTorch's RPC parameter server (torch_rpc_peer.py), the same operations in one run.

Runs pscoro's own benchmarks with --json (chief, ps and workers as processes, --mode processes),
then the peer, and prints `operation | pscoro | torch rpc | pscoro / torch rpc`. Every figure is a
time in us (throughput as the time per call), so a ratio below 1 means pscoro is faster. Compared:

  noop_round_trip   cluster_bench: a no-op closure scheduled by the chief and run on 1 worker, p50 of
                    schedule -> result; torch: rpc_sync of a scripted no-op on one server, p50
  noop_throughput   cluster_bench: no-op closures through 1 worker, --window in flight; torch:
                    rpc_async no-ops to one server, --window futures in flight
  read_4KiB, read_64MiB
                    variable_bench dense, 1 ps: read() into a fresh array; torch: rref.to_here() of a
                    tensor held by one server (a fresh tensor each time)
  assign_4KiB, assign_64MiB
                    variable_bench dense, 1 ps: assign(); torch: rpc_sync of a scripted function that
                    copies the tensor sent into the RRef's tensor
  embedding_lookup  variable_bench sparse: 100k uniform ids x 16 float32 of a 1M-row table on 2 ps;
                    torch: the client splits the ids by server, asks both with rpc_async, places the
                    rows in input order
  scatter_add       the same ids and rows added at their ids; torch: index_put_(accumulate) on each

Both sides place their processes alike (--placement split: the chief or client on the first CPU,
the servers on the second) and move bytes over loopback TCP (TensorPipe held to its uv transport).
The peer runs twice, once per TensorPipe TCP channel for tensors (basic, mpt_uv: neither is the
faster at every size), and each operation keeps the faster one's figure; the table names it.
Each figure is a median of --rounds rounds; the two sides run one after the other, so quote the
ratios of one run, not the absolute times (the machine is shared and noisy).
"""
import argparse
import json
import pathlib
import subprocess
import sys

OPERATIONS = ("noop_round_trip", "noop_throughput", "read_4KiB", "assign_4KiB", "read_64MiB", "assign_64MiB",
              "embedding_lookup", "scatter_add")


def json_lines(command):
    """The JSON objects `command` prints, one a line (other lines are passed through to stderr)."""
    result = subprocess.run(command, check=True, stdout=subprocess.PIPE, text=True)
    objects = []
    for line in result.stdout.splitlines():
        if line.startswith("{"):
            objects.append(json.loads(line))
        elif line.strip():
            print(line, file=sys.stderr)
    return objects


def pscoro_figures(build, args):
    common = ["--mode", "processes", "--json", "--rounds", str(args.rounds), "--placement", args.placement]
    lines = json_lines([str(build / "cluster_bench"), *common, "--in-flight", str(args.window),
                        "--iterations", "5000", "--closures", "20000"])
    lines += json_lines([str(build / "variable_bench"), *common, "--sparse-width", "16"])
    figures = {}
    for line in lines:
        if line["layout"] != "processes" or line["operation"] not in OPERATIONS:
            continue
        # dense: the variable on 1 ps, as the peer's on one server; sparse: 100k ids x 16, 2 ps
        if line["benchmark"] == "variable_bench" and line["ps"] != (2 if "ids" in line else 1):
            continue
        if line.get("ids", 100000) == 100000:
            figures[line["operation"]] = line["us"]
    return figures


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build", default="build", help="the meson build directory with the benchmarks")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per operation on each side (medians)")
    parser.add_argument("--window", type=int, default=8, help="no-op calls in flight for noop_throughput")
    parser.add_argument("--placement", choices=("split", "one", "any"), default="split")
    parser.add_argument("--transport", choices=("uv", "shm"), default="uv",
                        help="the peer's TensorPipe transports: TCP only, or with shared memory too")
    args = parser.parse_args()

    pscoro = pscoro_figures(pathlib.Path(args.build) / "benchmarks", args)
    peer = pathlib.Path(__file__).with_name("torch_rpc_peer.py")
    torch = {}  # operation: (us, channel), the faster channel's
    for channel in ("basic", "mpt_uv") if args.transport == "uv" else ("basic",):
        for line in json_lines([sys.executable, str(peer), "--rounds", str(args.rounds), "--window", str(args.window),
                                "--placement", args.placement, "--transport", args.transport, "--channel", channel]):
            if line["operation"] not in torch or line["us"] < torch[line["operation"]][0]:
                torch[line["operation"]] = (line["us"], line["channel"])

    print(f"pscoro beside PyTorch's RPC (TensorPipe, transport {args.transport}), chief or client and 2 servers as "
          f"processes, placement {args.placement}; medians of {args.rounds} rounds, times in us "
          f"(noop_throughput: per call, {args.window} in flight)\n")
    print("| operation | pscoro | torch rpc | pscoro / torch rpc | torch's channel |")
    print("|---|---:|---:|---:|---|")
    for operation in OPERATIONS:
        ours, (theirs, channel) = pscoro.get(operation), torch.get(operation, (None, "-"))
        def shown(us):
            return f"{us:.1f}" if us is not None else "-"
        ratio = f"{ours / theirs:.2f}" if ours and theirs else "-"
        print(f"| {operation} | {shown(ours)} | {shown(theirs)} | {ratio} | {channel} |")
    print("\nBelow 1: pscoro takes less time than torch's RPC for the same operation.")


if __name__ == "__main__":
    main()
