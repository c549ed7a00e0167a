"""The ctypes mirrors in python/tide/_lib.py against the C compiler's
layout of include/tide.h's structs (torch_abi prints it)."""
import ctypes
import subprocess
import sys


def main():
    try:
        from tide import _lib
    except ImportError as e:
        print("FAIL: %s" % e)
        return 1
    out = subprocess.run([sys.argv[1]], stdout=subprocess.PIPE, text=True, check=True).stdout
    bad = 0
    for line in out.splitlines():
        struct, field, value = line.split()
        cls = _lib.STRUCTS[struct]
        got = ctypes.sizeof(cls) if field == "-" else getattr(cls, field).offset
        if got != int(value):
            print("FAIL: %s %s: C says %s, _lib.py's ctypes mirror %d" % (struct, field, value, got))
            bad += 1
    print("test_abi: %d checks, %d wrong" % (len(out.splitlines()), bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
