"""Datasets on disk, as `tide data` does them (docs/data.md), through
libtide's tide_data_* calls. No torch needed.

    tide.data.export("fashion-mnist", "fmnist", limit=1000)         # ImageFolder + index.txt
    tide.data.export("fashion-mnist", "fmnist-sh", shard_bytes=1 << 18)
    tide.data.index("my-images", shard_bytes=1 << 18, out="packed")  # pack a folder into shards
    tide.data.cache_stats()                                           # the loader's disk cache
"""
import ctypes
import os

from . import _lib


def _summary(s):
    return {"images": s.images, "classes": s.classes, "shards": s.shards, "bytes": s.bytes}


def _path(p):
    return os.fsencode(p) if p is not None else None


def export(name, dir, split="train", source=None, limit=0, shard_bytes=0):
    """Exports dataset `name` ("fashion-mnist", read from the idx directory
    `source`, default Debian's) into dir as an ImageFolder with index.txt, or
    packed into shards of about shard_bytes bytes. Returns what was written:
    {"images", "classes", "shards", "bytes"}."""
    out = _lib.DataSummary()
    _lib.check(_lib.lib.tide_data_export(name.encode(), _path(dir), split.encode(), _path(source), int(limit),
                                         int(shard_bytes), ctypes.byref(out)), "tide.data.export")
    return _summary(out)


def index(dir, shard_bytes=0, out=None):
    """Writes dir/index.txt for an ImageFolder directory, or with shard_bytes
    packs it into out/shards (out: dir by default). Returns what was written."""
    s = _lib.DataSummary()
    _lib.check(_lib.lib.tide_data_index(_path(dir), int(shard_bytes), _path(out), ctypes.byref(s)), "tide.data.index")
    return _summary(s)


def cache_dir():
    """The data cache directory (TIDE_DATA_CACHE, else the default)."""
    buf = ctypes.create_string_buffer(4096)
    _lib.check(_lib.lib.tide_data_cache_dir(buf, len(buf)), "tide.data.cache_dir")
    return os.fsdecode(buf.value)


def cache_stats(dir=None):
    """A data cache's entries, bytes, bound and counters (hits, misses,
    refetched, evicted, bytes_served, bytes_fetched) as a dict."""
    d = cache_dir() if dir is None else dir
    s = _lib.DataCacheStats()
    _lib.check(_lib.lib.tide_data_cache_stats(_path(d), ctypes.byref(s)), "tide.data.cache_stats")
    return {"dir": d, **{name: getattr(s, name) for name, _ in s._fields_}}
