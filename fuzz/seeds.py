#!/usr/bin/env python3
"""Writes the seed corpus of the fuzz harnesses (fuzz/corpus/<name>/).

Run from anywhere: python3 fuzz/seeds.py. The seeds are valid or nearly
valid inputs, so that libFuzzer starts from the parsers' deep paths."""
import os
import struct
import zlib

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


write("index_parse", [
    b"tide-imagefolder 1\nclass 0 cat\nclass 1 dog\nfile 0 120 cat/0001.png\nfile 1 98 dog/0002.png\n",
    b"tide-imagefolder 1\n# a comment\n\nclass 0 a\nfile 0 0 a/x.jpg\n",
    b"tide-imagefolder 2\nshape 28 28 1\nclass 0 t-shirt\nclass 1 trouser\nshard 0 300 shards/00000.bin\n"
    b"shard 1 100 shards/00001.bin\nsample 0 0 0 100 0.png\nsample 1 0 100 200 1.png\nsample 1 1 0 100 2.png\n",
    b"tide-imagefolder 2\nclass 0 a\nshard 0 10 s.bin\nsample 0 0 5 10 x.png\n",
    b"tide-imagefolder 1\nclass 0 a\nfile 0 10 ../../etc/passwd\n",
])


def png(height, width, color_type, bit_depth=8, interlace=0, header_only=False):
    """A valid PNG (gray or RGB) of a gradient, or its signature and IHDR alone."""
    channels = {0: 1, 2: 3}[color_type]
    raw = b"" if header_only else b"".join(b"\0" + bytes((x * 37 + y * 11) & 255 for x in range(width * channels)) for y in range(height))
    def chunk(kind, body):
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    ihdr = struct.pack(">IIBBBBB", width, height, bit_depth, color_type, 0, 0, interlace)
    if header_only:
        return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


# JPEGs that libjpeg wrote: 8 x 8 gray, 4 x 6 RGB progressive.
jpegs = [
    bytes.fromhex("ffd8ffe000104a46494600010100000100010000ffdb004300100b0c0e0c0a100e0d0e1211101318281a181616183123251d283a333d3c3933383740485c4e404457453738506d51575f626768673e4d71797064785c656763ffc0000b080008000801011100ffc4001f0000010501010101010100000000000000000102030405060708090a0bffc400b5100002010303020403050504040000017d01020300041105122131410613516107227114328191a1082342b1c11552d1f02433627282090a161718191a25262728292a3435363738393a434445464748494a535455565758595a636465666768696a737475767778797a838485868788898a92939495969798999aa2a3a4a5a6a7a8a9aab2b3b4b5b6b7b8b9bac2c3c4c5c6c7c8c9cad2d3d4d5d6d7d8d9dae1e2e3e4e5e6e7e8e9eaf1f2f3f4f5f6f7f8f9faffda0008010100003f00e7743fe1afffd9"),
    bytes.fromhex("ffd8ffe000104a46494600010100000100010000ffdb004300100b0c0e0c0a100e0d0e1211101318281a181616183123251d283a333d3c3933383740485c4e404457453738506d51575f626768673e4d71797064785c656763ffdb0043011112121815182f1a1a2f634238426363636363636363636363636363636363636363636363636363636363636363636363636363636363636363636363636363ffc20011080004000603012200021101031101ffc4001500010100000000000000000000000000000003ffc4001501010100000000000000000000000000000305ffda000c03010002100310000001882a5fffc4001510010100000000000000000000000000000234ffda000801010001050232ff00ffc400161100030000000000000000000000000000000433ffda0008010301013f015667ffc400161100030000000000000000000000000000000231ffda0008010201013f017a7fffc400161000030000000000000000000000000000000171ffda0008010100063f0254ffc4001710000301000000000000000000000000000001a1b1ffda0008010100013f21918cffda000c03010002000300000010ff00ffc40017110003010000000000000000000000000000013171ffda0008010301013f1096b3ffc40014110100000000000000000000000000000000ffda0008010201013f107fffc40014100100000000000000000000000000000000ffda0008010100013f1058ffd9"),
]
write("image_probe", [png(8, 8, 0), png(5, 7, 2), png(3, 4, 0, interlace=0)[:40]] + jpegs + [
    jpegs[0][:100],
    png(20000, 20000, 0, header_only=True),  # a header that claims 400 M pixels
])
