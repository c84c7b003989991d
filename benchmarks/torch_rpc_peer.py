#!/usr/bin/python3
"""The peer of pscoro's cluster and variable benchmarks: PyTorch's RPC parameter server.

A client and 2 servers, each a process of its own, in one torch.distributed.rpc world on 127.0.0.1
(TensorPipe backend). The servers hold the state in RRefs; the client calls them with rpc_sync, or
rpc_async and futures where calls overlap, tensors as payload. The operations are the ones
pscoro's benchmarks measure with chief, ps and workers as processes:

  noop_round_trip       rpc_sync of a no-op on ps0: p50 latency (cluster_bench: no-op closure, p50)
  noop_throughput       no-op rpc_async calls to ps0, a window of --window in flight: time per call
                        (cluster_bench: no-op closures/s, 1 worker, --in-flight the same)
  read_4KiB, assign_4KiB, read_64MiB, assign_64MiB
                        a float32 tensor held by ps0: rref.to_here() into a fresh tensor, and an
                        rpc_sync that copies the tensor sent into it (variable_bench dense, 1 ps:
                        read into a fresh array, assign)
  embedding_lookup      100,000 uniform ids of a 1M x 16 float32 table split in 2 (rows [0, 500k) on
                        ps0, the rest on ps1): the client splits the ids, asks both at once, and
                        places the rows in input order (variable_bench sparse, 100k x 16, 2 ps)
  scatter_add           the same ids with their rows, added at their ids (index_add_) on each server

Prints one JSON line per operation with the median time (us) of its rounds. By default the
processes are pinned as pscoro's benchmarks pin theirs (--placement split: the client on the first
CPU, the servers on the second) and TensorPipe is held to TCP (--transport uv, --channel), the
path pscoro and the raw limits take; --transport shm lets it use shared memory, which only works on
one host.
"""
import argparse
import collections
import json
import os
import socket
import statistics
import subprocess
import sys
import time

os.environ.setdefault("GLOG_minloglevel", "1")  # before torch loads glog: no info line per agent shutdown
import torch  # noqa: E402 (after the line above)
import torch.distributed.rpc as rpc  # noqa: E402
from torch import Tensor  # noqa: E402
from torch.distributed.rpc import RRef  # noqa: E402

ROWS, WIDTH, IDS = 1_000_000, 16, 100_000
SERVERS = ("ps0", "ps1")


# ---- run on the servers ----------------------------------------------------------------------
# TorchScript functions: the server runs them without Python's interpreter or pickler, which took
# a no-op call from ~260 to ~150 us here, and the scripted assign, gather and add ran 1.1-1.6x
# faster than the same Python functions. An RRef they take must hold a value a scripted function
# made (one made by a Python function holds a Python object, which they cannot return).

@torch.jit.script
def noop() -> None:
    pass


@torch.jit.script
def filled(elements: int) -> Tensor:
    return torch.ones(elements, dtype=torch.float32)


@torch.jit.script
def random_table(rows: int, width: int) -> Tensor:
    return torch.rand(rows, width, dtype=torch.float32)


@torch.jit.script
def assign(held: RRef[Tensor], value: Tensor) -> None:
    held.local_value().copy_(value)


@torch.jit.script
def gather_rows(table: RRef[Tensor], ids: Tensor) -> Tensor:
    # table[ids], not index_select: 0.5 against 1.8 ms for 50k rows of 16 on this host
    return table.local_value()[ids]


@torch.jit.script
def add_rows(table: RRef[Tensor], ids: Tensor, rows: Tensor) -> None:
    # index_put_ with accumulate, not index_add_: 2.2 against 13.7 ms for 50k rows of 16 here
    table.local_value().index_put_((ids,), rows, accumulate=True)


# ---- the client ------------------------------------------------------------------------------

def median_us(n, call, rounds):
    """The median over `rounds` of the median time of `n` calls (after a tenth as many), in us."""
    medians = []
    for _ in range(rounds):
        for _ in range(max(1, n // 10)):
            call()
        samples = []
        for _ in range(n):
            start = time.perf_counter()
            call()
            samples.append(time.perf_counter() - start)
        medians.append(statistics.median(samples) * 1e6)
    return statistics.median(medians)


def windowed_us_per_call(total, window, issue, rounds):
    """Time per call (us, median of rounds) of `total` calls with `window` of them in flight."""
    per_call = []
    for _ in range(rounds):
        in_flight = collections.deque()
        start = time.perf_counter()
        for _ in range(total):
            if len(in_flight) == window:
                in_flight.popleft().wait()
            in_flight.append(issue())
        for future in in_flight:
            future.wait()
        per_call.append((time.perf_counter() - start) / total * 1e6)
    return statistics.median(per_call)


def run_client(args):
    def report(operation, us, **detail):
        channel = args.channel if args.transport == "uv" else "default"
        print(json.dumps({"operation": operation, "us": round(us, 2), "rounds": args.rounds, "transport": args.transport,
                          "channel": channel, **detail}), flush=True)

    scale = args.scale
    report("noop_round_trip", median_us(2000 * scale, lambda: rpc.rpc_sync("ps0", noop), args.rounds))
    report("noop_throughput",
           windowed_us_per_call(5000 * scale, args.window, lambda: rpc.rpc_async("ps0", noop), args.rounds),
           window=args.window)

    for name, size, n in (("4KiB", 4 << 10, 500 * scale), ("64MiB", 64 << 20, 3 * scale)):
        held = rpc.remote("ps0", filled, args=(size // 4,))
        value = torch.ones(size // 4, dtype=torch.float32)
        # to_here, not a scripted read: 150 against 290 us at 4 KiB, alike at 64 MiB
        report(f"read_{name}", median_us(n, held.to_here, args.rounds))
        report(f"assign_{name}", median_us(n, lambda: rpc.rpc_sync("ps0", assign, args=(held, value)), args.rounds))

    half = ROWS // 2  # the row split of pscoro's fixed_shards_partitioner{2}
    tables = [rpc.remote(server, random_table, args=(half, WIDTH)) for server in SERVERS]
    ids = torch.randint(0, ROWS, (IDS,), dtype=torch.int64, generator=torch.Generator().manual_seed(7))
    updates = torch.ones(IDS, WIDTH, dtype=torch.float32)

    def positions_per_server():
        # positions, not masks: indexing by them split and placed 100k rows in half the time
        low = ids < half
        return low.nonzero().squeeze(1), (~low).nonzero().squeeze(1)

    def embedding_lookup():
        first, second = positions_per_server()
        asked = [rpc.rpc_async("ps0", gather_rows, args=(tables[0], ids[first])),
                 rpc.rpc_async("ps1", gather_rows, args=(tables[1], ids[second] - half))]
        out = torch.empty(IDS, WIDTH, dtype=torch.float32)
        out[first] = asked[0].wait()
        out[second] = asked[1].wait()
        return out

    def scatter_add():
        first, second = positions_per_server()
        sent = [rpc.rpc_async("ps0", add_rows, args=(tables[0], ids[first], updates[first])),
                rpc.rpc_async("ps1", add_rows, args=(tables[1], ids[second] - half, updates[second]))]
        torch.futures.wait_all(sent)

    # Once, untimed: both give what the whole table would.
    whole = torch.cat([table.to_here() for table in tables])
    assert torch.equal(embedding_lookup(), whole[ids]), "embedding_lookup placed rows wrongly"
    scatter_add()
    added = torch.cat([table.to_here() for table in tables])
    assert torch.allclose(added, whole.index_put_((ids,), updates, accumulate=True)), "scatter_add added wrongly"
    del whole, added

    report("embedding_lookup", median_us(10 * scale, embedding_lookup, args.rounds), ids=IDS, width=WIDTH)
    report("scatter_add", median_us(10 * scale, scatter_add, args.rounds), ids=IDS, width=WIDTH)


# ---- processes -------------------------------------------------------------------------------

def pin_process(placement, role):
    """Pins every thread of this process (those torch started on import too; TensorPipe's later
    threads inherit it) as pscoro's benchmarks place theirs (process_cluster.hpp, placement)."""
    if placement == "any":
        return
    cpus = sorted(os.sched_getaffinity(0))
    if placement == "split" and len(cpus) < 2:
        sys.exit("torch_rpc_peer: placement split needs two CPUs")
    cpu = cpus[1] if placement == "split" and role != "client" else cpus[0]
    for thread in os.listdir("/proc/self/task"):
        os.sched_setaffinity(int(thread), {cpu})


def backend_options(args):
    # uv: TensorPipe's TCP transport, with one channel for tensors: basic (on the pipe's own
    # connection) or mpt_uv (over several TCP connections of its own). TensorPipe picks one channel
    # per pipe, and neither is fastest for all sizes here (mpt_uv: 64 MiB in ~0.7x basic's time,
    # 4 KiB in ~5x), so the caller runs both (torch_rpc_bench.py). The default set adds shared
    # memory and cross-memory-attach paths, which only exist between processes of one host.
    transports, channels = (["uv"], [args.channel]) if args.transport == "uv" else (None, None)
    return rpc.TensorPipeRpcBackendOptions(num_worker_threads=args.rpc_threads,
                                           init_method=f"tcp://127.0.0.1:{args.port}", rpc_timeout=120,
                                           _transports=transports, _channels=channels)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="rounds per operation (the median is printed)")
    parser.add_argument("--scale", type=int, default=1, help="multiplies the calls per round")
    parser.add_argument("--window", type=int, default=8, help="no-op calls in flight for noop_throughput")
    parser.add_argument("--placement", choices=("split", "one", "any"), default="split",
                        help="client on the first CPU and servers on the second (split), all on one, or any")
    parser.add_argument("--transport", choices=("uv", "shm"), default="uv",
                        help="TensorPipe over TCP only (uv), or with its shared-memory paths too (shm)")
    parser.add_argument("--channel", choices=("basic", "mpt_uv"), default="basic",
                        help="--transport uv: TensorPipe's channel for tensors")
    parser.add_argument("--rpc-threads", type=int, default=4, help="TensorPipe's RPC thread pool per process")
    parser.add_argument("--serve", type=int, default=0, help=argparse.SUPPRESS)  # rank of a server process
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(1)

    if args.serve:
        pin_process(args.placement, "server")
        rpc.init_rpc(SERVERS[args.serve - 1], rank=args.serve, world_size=3, rpc_backend_options=backend_options(args))
        rpc.shutdown()  # serves until the client shuts down too
        return

    with socket.socket() as probe:  # a free port for the rendezvous store the client holds
        probe.bind(("127.0.0.1", 0))
        args.port = probe.getsockname()[1]
    forwarded = [f"--{name.replace('_', '-')}={value}" for name, value in vars(args).items() if name != "serve"]
    servers = [subprocess.Popen([sys.executable, __file__, f"--serve={rank}", *forwarded]) for rank in (1, 2)]
    try:
        pin_process(args.placement, "client")
        rpc.init_rpc("client", rank=0, world_size=3, rpc_backend_options=backend_options(args))
        run_client(args)
        rpc.shutdown()
        for server in servers:
            server.wait(timeout=30)
    finally:
        for server in servers:  # the client failed (the servers would wait for it), or they hung
            if server.poll() is None:
                server.kill()


if __name__ == "__main__":
    main()
