"""An independent TFRecord reader: checks a TFRecord file of tf.train.Example written by pscoro
against the Criteo TSV file written from the same data.

It parses the TFRecord framing from its specification (little-endian length, masked CRC-32C of the
length, data, masked CRC-32C of the data) with Debian's python3-crc32c, and the Example with
python3-protobuf from src/proto/example.proto compiled by protoc here.

usage: /usr/bin/python3 read_tfrecord.py EXAMPLE_PROTO_DIR GENERATED_DIR RECORDS TSV
"""
import gzip
import importlib
import struct
import subprocess
import sys

import crc32c

proto_dir, generated, records_path, tsv_path = sys.argv[1:5]
subprocess.run(["protoc", f"--proto_path={proto_dir}", f"--python_out={generated}", "example.proto"], check=True)
sys.path.insert(0, generated)
example_pb2 = importlib.import_module("example_pb2")


def masked(data):
    crc = crc32c.crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


with open(records_path, "rb") as f:
    raw = f.read()
if raw[:2] == b"\x1f\x8b":
    raw = gzip.decompress(raw)

records = []
offset = 0
while offset < len(raw):
    (length,) = struct.unpack_from("<Q", raw, offset)
    (length_crc,) = struct.unpack_from("<I", raw, offset + 8)
    assert masked(raw[offset:offset + 8]) == length_crc, f"length CRC at byte {offset}"
    data = raw[offset + 12:offset + 12 + length]
    (data_crc,) = struct.unpack_from("<I", raw, offset + 12 + length)
    assert masked(data) == data_crc, f"data CRC at byte {offset}"
    records.append(data)
    offset += 12 + length + 4

with open(tsv_path) as f:
    lines = f.read().splitlines()
assert len(records) == len(lines), f"{len(records)} records but {len(lines)} lines"

for i, (record, line) in enumerate(zip(records, lines)):
    example = example_pb2.Example()
    example.ParseFromString(record)
    feature = example.features.feature
    fields = [str(feature["label"].int64_list.value[0])]
    fields += [",".join(str(v) for v in feature[f"I{j}"].int64_list.value) for j in range(1, 14)]
    fields += [",".join(v.decode() for v in feature[f"C{j}"].bytes_list.value) for j in range(1, 27)]
    rebuilt = "\t".join(fields)
    assert rebuilt == line, f"record {i}: {rebuilt!r} != {line!r}"

print(f"{len(records)} records match the TSV")
