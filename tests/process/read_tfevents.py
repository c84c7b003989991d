"""An independent reader of TensorBoard event files written by pscoro.

It parses the TFRecord framing from its specification (little-endian length, masked CRC-32C of the
length, data, masked CRC-32C of the data) with Debian's python3-crc32c, and each Event with
python3-protobuf from src/proto/summary.proto (TF's field numbers) compiled by protoc here. It
checks that the first record is TF's file version, then prints every summary value:
  scalar TAG STEP VALUE                  (%.9g of the float32)
  histogram TAG STEP NUM MIN MAX BUCKETS (BUCKETS: the non-empty "limit:count" pairs)
With EXPECTED (write_summaries's output) it checks the file holds exactly those values, the
histograms' statistics and buckets computed here with TF's default buckets.

usage: /usr/bin/python3 read_tfevents.py PROTO_DIR GENERATED_DIR EVENTS_FILE [EXPECTED]
"""
import importlib
import struct
import subprocess
import sys

import crc32c

proto_dir, generated, events_path = sys.argv[1:4]
expected_path = sys.argv[4] if len(sys.argv) > 4 else None
subprocess.run(["protoc", f"--proto_path={proto_dir}", f"--python_out={generated}", "summary.proto"], check=True)
sys.path.insert(0, generated)
summary_pb2 = importlib.import_module("summary_pb2")

DBL_MAX = sys.float_info.max


def masked(data):
    crc = crc32c.crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def records(raw):
    offset = 0
    while offset < len(raw):
        assert offset + 12 <= len(raw), f"truncated header at byte {offset}"
        (length,) = struct.unpack_from("<Q", raw, offset)
        (length_crc,) = struct.unpack_from("<I", raw, offset + 8)
        assert masked(raw[offset:offset + 8]) == length_crc, f"length CRC at byte {offset}"
        assert offset + 12 + length + 4 <= len(raw), f"truncated record at byte {offset}"
        data = raw[offset + 12:offset + 12 + length]
        (data_crc,) = struct.unpack_from("<I", raw, offset + 12 + length)
        assert masked(data) == data_crc, f"data CRC at byte {offset}"
        yield data
        offset += 12 + length + 4


def default_limits():
    """TF's default histogram bucket limits (tsl/lib/histogram/histogram.cc), computed alike."""
    positive = []
    v = 1.0e-12
    while v < 1.0e20:
        positive.append(v)
        v *= 1.1
    positive.append(DBL_MAX)
    return [-x for x in reversed(positive)] + [0.0] + positive


def histogram_of(values):
    """(num, min, max, sum, sum_squares, limits, counts) as TF encodes it, empty runs merged."""
    import bisect
    limits = default_limits()
    counts = [0.0] * len(limits)
    lo, hi, num, total, squares = DBL_MAX, -DBL_MAX, 0.0, 0.0, 0.0
    for v in values:
        counts[min(bisect.bisect_right(limits, v), len(limits) - 1)] += 1.0
        lo, hi = min(lo, v), max(hi, v)
        num += 1.0
        total += v
        squares += v * v
    out_limits, out_counts = [], []
    i = 0
    while i < len(counts):
        end, count = limits[i], counts[i]
        i += 1
        if count <= 0.0:
            while i < len(counts) and counts[i] <= 0.0:
                end = limits[i]
                i += 1
        out_limits.append(end)
        out_counts.append(count)
    return num, lo, hi, total, squares, out_limits, out_counts


with open(events_path, "rb") as f:
    events = []
    for data in records(f.read()):
        event = summary_pb2.Event()
        event.ParseFromString(data)
        events.append(event)

assert events, "no records"
assert events[0].file_version == "brain.Event:2", f"first record: {events[0]}"
assert events[0].wall_time == int(events[0].wall_time), "the version event's time is whole seconds"

listing = []
histograms = {}
for event in events[1:]:
    assert event.HasField("summary"), f"an event without a summary: {event}"
    assert event.wall_time >= events[0].wall_time
    for value in event.summary.value:
        kind = value.WhichOneof("value")
        if kind == "simple_value":
            listing.append(f"scalar {value.tag} {event.step} {value.simple_value:.9g}")
        elif kind == "histo":
            h = value.histo
            histograms[(value.tag, event.step)] = h
            buckets = " ".join(f"{l:.17g}:{c:g}" for l, c in zip(h.bucket_limit, h.bucket) if c > 0)
            listing.append(f"histogram {value.tag} {event.step} {h.num:g} {h.min:.17g} {h.max:.17g} {buckets}")
        else:
            raise AssertionError(f"unexpected summary value {kind}")
if not expected_path:
    print("\n".join(listing))
else:
    with open(expected_path) as f:
        expected = f.read().splitlines()
    assert expected[0].startswith("file "), expected[0]
    got_scalars = [line for line in listing if line.startswith("scalar ")]
    want_scalars = [line for line in expected if line.startswith("scalar ")]
    assert got_scalars == want_scalars, "scalars differ:\n" + "\n".join(
        f"  got {g!r} want {w!r}" for g, w in zip(got_scalars, want_scalars) if g != w)
    want_histograms = [line.split() for line in expected if line.startswith("histogram ")]
    assert len(want_histograms) == len(histograms), f"{len(histograms)} histograms, {len(want_histograms)} written"
    for _, tag, step, *raw in want_histograms:
        h = histograms[(tag, int(step))]
        num, lo, hi, total, squares, limits, counts = histogram_of(float(v) for v in raw)
        got = (h.num, h.min, h.max, h.sum, h.sum_squares, list(h.bucket_limit), list(h.bucket))
        assert got == (num, lo, hi, total, squares, limits, counts), f"histogram {tag} at {step}: {got}"
    print(f"{len(got_scalars)} scalars and {len(histograms)} histograms are exactly the ones written")
