#!/usr/bin/env python3
"""Writes the seed corpus of the fuzz harnesses (fuzz/corpus/<name>/).

Run from anywhere: python3 fuzz/seeds.py. The seeds are valid or nearly
valid inputs, so that libFuzzer starts from the parsers' deep paths."""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
SET, GET, WAIT, ADD, DELETE, WATCH, BYE = range(1, 8)


def request(op, key=b"", value=b"", arg=0):
    return struct.pack("<IIIIQq", 0x31515354, op, len(key), 0, len(value), arg) + key + value


def whole(flags, *chunks):
    """flags byte, then chunks of (connection, bytes) sent in that order."""
    out = bytes([flags])
    for conn, data in chunks:
        while data:
            piece = data[:126]
            out += bytes([(conn << 7) | len(piece)]) + piece
            data = data[126:]
    return out


def write(name, seeds):
    folder = os.path.join(HERE, "corpus", name)
    os.makedirs(folder, exist_ok=True)
    for i, data in enumerate(seeds):
        with open(os.path.join(folder, "seed-%02d" % i), "wb") as f:
            f.write(data)


ops = (request(SET, b"a", b"xyz") + request(GET, b"a", arg=0) + request(ADD, b"n", arg=5) +
       request(DELETE, b"a") + request(WAIT, value=b"n\0", arg=0) + request(GET, b"gone", arg=0))
torn = request(SET, b"key", b"value" * 10)
write("store_frame", [
    whole(0, (0, ops)),
    whole(2, (0, request(WATCH, b"job:0")), (1, request(SET, b"event/abort/job", b"1|2|x")), (0, request(BYE))),
    whole(2, (0, request(GET, b"later", arg=1000)), (1, request(SET, b"later", b"v"))),
    whole(1, (0, b"TIDEAUTH1" + bytes(32) + bytes(32))),
    bytes([0]) + b"".join(bytes([10]) + torn[i:i + 10] for i in range(0, len(torn), 10)),
    whole(0, (0, struct.pack("<IIIIQq", 0x31515354, SET, 1, 0, 1 << 40, 0) + b"k")),
])

hello = struct.pack("<QQii", 0x7469646568656C6F, 0x1234, 5, 0)
write("handshake", [
    b"TIDEAUTH1" + bytes(range(32)) + bytes(32) + hello,
    b"TIDEAUTH1" + bytes(range(32)),
    b"TIDEAUTH1",
    b"GET / HTTP/1.0\r\n\r\n",
    hello,
])


def header(magic=0x74636F6C, kind=3, seq=7, count=1000, counts_hash=0, dtype=0, op=0, root=0, algo=2):
    return struct.pack("<IIQQQiiii", magic, kind, seq, count, counts_hash, dtype, op, root, algo)


write("coll_header", [
    header(),
    header(count=1001),
    header(seq=8, kind=2, root=3),
    header(algo=1),
    header(magic=0),
    header(kind=200, dtype=99, op=-1),
    header(kind=7) + header(kind=7, counts_hash=0xDEADBEEF),
])
