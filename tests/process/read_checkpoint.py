"""An independent checkpoint reader: parses a pscoro checkpoint of the Fashion-MNIST example from
the safetensors specification alone (8-byte little-endian header size, JSON header, tensor bytes
covered exactly by the data_offsets), checks pscoro's metadata, the header's CRC-32C and every
tensor's, then computes the test accuracy of the saved weights with numpy and compares it with the
one pscoro printed for that checkpoint.

usage: /usr/bin/python3 read_checkpoint.py CHECKPOINT FASHION_MNIST_DIR EXPECTED_ACCURACY STEP
"""
import gzip
import json
import struct
import sys

import crc32c
import numpy as np

path, data_dir, expected, step = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])

with open(path, "rb") as f:
    raw = f.read()
(n,) = struct.unpack_from("<Q", raw, 0)
header = json.loads(raw[8:8 + n])
data = raw[8 + n:]
meta = header.pop("__metadata__")
assert meta["format"] == "pscoro.checkpoint", meta
assert meta["format_version"] == "2", meta
# The header's own CRC-32C: of the size and the JSON as stored, its 8 digits read as zeros.
key = b'"header_crc32c":"'
at = raw.index(key, 8) + len(key)
assert raw.count(key, 8, 8 + n) == 1, "header_crc32c is not written once"
unsigned = raw[:at] + b"00000000" + raw[at + 8:8 + n]
assert crc32c.crc32c(unsigned) == int(meta["header_crc32c"], 16), "header CRC-32C mismatch"
assert meta["pscoro_version"], meta
assert int(meta["step"]) == step, (meta["step"], step)
crcs = json.loads(meta["crc32c"])
assert json.loads(meta["slots"]) == {}, meta["slots"]  # plain SGD through assign_sub: no slots

dtypes = {"F32": "<f4", "F64": "<f8", "I32": "<i4", "I64": "<i8"}
tensors = {}
covered = 0
for name, info in sorted(header.items(), key=lambda item: item[1]["data_offsets"]):
    begin, end = info["data_offsets"]
    assert begin == covered, f"{name} starts at {begin}, expected {covered}"
    covered = end
    array = np.frombuffer(data[begin:end], dtype=dtypes[info["dtype"]]).reshape(info["shape"])
    assert crc32c.crc32c(data[begin:end]) == int(crcs[name], 16), f"{name}: CRC-32C mismatch"
    tensors[name] = array
assert covered == len(data), f"tensors cover {covered} bytes of {len(data)}"
assert set(tensors) == {"softmax/weights", "softmax/bias"}, set(tensors)
weights, bias = tensors["softmax/weights"], tensors["softmax/bias"]
assert weights.shape == (784, 10) and bias.shape == (10,), (weights.shape, bias.shape)


def idx(name):
    with gzip.open(f"{data_dir}/{name}", "rb") as f:
        content = f.read()
    magic, = struct.unpack_from(">I", content, 0)
    dims = struct.unpack_from(">" + "I" * (magic & 0xff), content, 4)
    return np.frombuffer(content, dtype=np.uint8, offset=4 + 4 * len(dims)).reshape(dims)


images = idx("t10k-images-idx3-ubyte.gz").reshape(-1, 784).astype(np.float32) / np.float32(255)
labels = idx("t10k-labels-idx1-ubyte.gz")
accuracy = float(np.mean(np.argmax(images @ weights + bias, axis=1) == labels))
# Summation order differs from pscoro's: allow a near-tie or two to fall the other way.
assert abs(accuracy - expected) <= 2 / len(labels), f"numpy says {accuracy:.4f}, pscoro said {expected:.4f}"
print(f"{path}: step {step}, {len(tensors)} tensors, CRCs match, test accuracy {accuracy:.4f} (pscoro: {expected:.4f})")
