"""tide.data (python/tide/data.py): dataset export, packing into shards,
indexing and cache statistics through libtide's public calls, against the
`tide data` command (the same library calls): the same files, the same
index. No torch needed; skipped (77) without Debian's Fashion-MNIST."""
import filecmp
import os
import subprocess
import sys
import tempfile

import tide


def listing(root):
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)


def main():
    if not os.path.exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"):
        print("skipped: no Fashion-MNIST in /usr/share/datasets/fashion-mnist")
        return 77
    tool = os.path.join(os.environ.get("TIDE_TOOLS_DIR", "build/tools"), "tide")
    with tempfile.TemporaryDirectory() as tmp:
        py, cli = os.path.join(tmp, "py"), os.path.join(tmp, "cli")
        s = tide.data.export("fashion-mnist", py, limit=60)
        assert s == {"images": 60, "classes": 10, "shards": 0, "bytes": s["bytes"]} and s["bytes"] > 0, s
        subprocess.run([tool, "data", "export", "fashion-mnist", cli, "--limit", "60"], check=True)
        files = listing(py)
        assert files == listing(cli) and len(files) == 61 and "index.txt" in files, files[:5]
        for f in files:
            assert filecmp.cmp(os.path.join(py, f), os.path.join(cli, f), shallow=False), f
        # pack the folder into shards, and export straight into shards
        packed = os.path.join(tmp, "packed")
        p = tide.data.index(py, shard_bytes=4096, out=packed)
        assert p["images"] == 60 and p["classes"] == 10 and p["shards"] > 1 and p["bytes"] > 0, p
        assert os.path.exists(os.path.join(packed, "index.txt")) and os.path.isdir(os.path.join(packed, "shards"))
        sh = tide.data.export("fashion-mnist", os.path.join(tmp, "sh"), split="test", limit=30, shard_bytes=4096)
        assert sh["images"] == 30 and sh["shards"] > 1, sh
        # re-index the folder: the same index.txt
        with open(os.path.join(py, "index.txt"), "rb") as f:
            before = f.read()
        assert tide.data.index(py) == {"images": 60, "classes": 10, "shards": 0, "bytes": 0}
        with open(os.path.join(py, "index.txt"), "rb") as f:
            assert f.read() == before
        # cache statistics: an empty cache, the default directory, a missing one
        cache = os.path.join(tmp, "cache")
        os.mkdir(cache)
        st = tide.data.cache_stats(cache)
        assert st["entries"] == 0 and st["hits"] == 0 and st["dir"] == cache, st
        assert tide.data.cache_dir()  # the default, or TIDE_DATA_CACHE (read once, when libtide loads)
        env = dict(os.environ, TIDE_DATA_CACHE=cache)
        said = subprocess.run([sys.executable, "-c", "import tide; print(tide.data.cache_dir())"], env=env,
                              stdout=subprocess.PIPE, text=True, check=True).stdout.strip()
        assert said == cache, (said, cache)
        for bad, call in ((lambda: tide.data.cache_stats(os.path.join(tmp, "none"))), "cache_stats"), \
                         ((lambda: tide.data.export("cifar10", py)), "export"), \
                         ((lambda: tide.data.export("fashion-mnist", py, limit=-1)), "export"), \
                         ((lambda: tide.data.index(os.path.join(tmp, "none"))), "index"):
            try:
                bad()
            except tide.TideError as e:
                assert call in str(e), str(e)
            else:
                raise AssertionError("%s accepted a bad argument" % call)
    print("data OK: export (60 images, the same files as tide data export), shards, index, cache stats")
    return 0


if __name__ == "__main__":
    sys.exit(main())
