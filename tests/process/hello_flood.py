"""Strangers that flood a task with large Hellos: COUNT connections from SOURCE_HOST, each sending
one Hello frame whose header is HELLO_BYTES long (a cluster-spec-sized address field) and asking
to prove the cluster secret, held open without reading until the process is killed. Touches READY_FILE once every connection has been
made and its Hello handed to the kernel (what the server does not read stays in the socket).

    hello_flood.py HOST:PORT COUNT HELLO_BYTES SOURCE_HOST READY_FILE
"""
import socket
import struct
import sys
import time

FRAME_MAGIC = 0x52435350  # "PSCR", docs/protocol.md
PROTOCOL_VERSION = 3
HELLO_KIND = 1


def varint(n):
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def field(number, wire_type, payload):
    return varint(number << 3 | wire_type) + payload


def hello_frame(header_bytes):
    # FrameHeader{hello (field 2): Hello{protocol_version 3, job "chief", session, a 32-byte nonce
    # (so the server answers with a Challenge and waits for a Proof that never comes, holding the
    # Hello), dialled task ps:0, and an address field of n bytes}}, n chosen so the whole protobuf
    # part is header_bytes long.
    head = (field(1, 0, varint(PROTOCOL_VERSION)) + field(2, 2, varint(5) + b"chief") +
            field(6, 1, struct.pack("<Q", 0x5EED)) + field(8, 2, varint(32) + b"\x01" * 32) +
            field(9, 2, varint(2) + b"ps") + field(10, 0, varint(0)))
    for n in range(header_bytes, 0, -1):
        hello = head + field(7, 2, varint(n) + b"x" * n)
        message = field(2, 2, varint(len(hello)) + hello)
        if len(message) <= header_bytes:
            break
    fixed = struct.pack("<IHHQIIQ", FRAME_MAGIC, PROTOCOL_VERSION, HELLO_KIND, 0, len(message), 0, 0)
    return fixed + message


def main():
    address, count, hello_bytes, source, ready = sys.argv[1:6]
    host, port = address.rsplit(":", 1)
    frame = hello_frame(int(hello_bytes))
    held = []
    for _ in range(int(count)):
        s = socket.socket()
        s.bind((source, 0))
        s.connect((host, int(port)))
        s.setblocking(False)
        try:
            s.send(frame)  # as much as the kernel takes; the rest is never needed
        except (BlockingIOError, ConnectionError):
            pass
        held.append(s)
    open(ready, "w").close()
    time.sleep(600)


if __name__ == "__main__":
    main()
