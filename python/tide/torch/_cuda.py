"""Collectives on CUDA tensors, staged through pinned host memory in pieces.

tide exchanges host memory. A collective on a CUDA tensor therefore copies
it to pinned host buffers and back, and overlaps the copies with the
exchange piece by piece, as Horovod's CPU-operations path does:

    start:  queue device-to-host copies of every piece on the tensor's
            current stream (after the kernels that produce it), each with
            an event; nothing waits.
    finish: for each piece in order, wait for its event and start tide's
            nonblocking collective on it (the copy of piece i + 1 runs while
            piece i is exchanged); then, as each exchange completes, queue
            its host-to-device copy on the stream (it overlaps the
            exchanges still running).

The result is stream-ordered: kernels queued on the stream after
synchronize() see it. Pinned buffers come from torch's caching host
allocator, which does not reuse a block before the copies that use it
have run. TIDE_TORCH_PIECE_BYTES sets the piece size (default 4 MiB).
"""
import ctypes
import errno
import os

import torch

from .. import _lib
from .._lib import lib

PIECE_BYTES = int(os.environ.get("TIDE_TORCH_PIECE_BYTES", 4 << 20))
if PIECE_BYTES <= 0:
    raise ValueError("TIDE_TORCH_PIECE_BYTES must be > 0, got %d" % PIECE_BYTES)


def stream_handle(device):
    """The current CUDA stream of device, as the int tide's GPU calls take."""
    return torch.cuda.current_stream(device).cuda_stream


class Staged:
    """One collective on a CUDA tensor in flight (see the module's text).
    start(piece_host, piece_dev_in) -> tide request pointer starts the
    exchange of one piece; elementwise=False sends the tensor as one piece
    (Adasum, whose tensors must not be split)."""

    def __init__(self, src, out, start, call, fail, elementwise=True):
        self.out = out
        self.call = call
        self._fail = fail
        self._start = start
        self._stream = torch.cuda.current_stream(src.device)
        flat_src = src.reshape(-1)
        n = flat_src.numel()
        self._host = torch.empty(n, dtype=src.dtype, pin_memory=True)
        step = max(1, PIECE_BYTES // src.element_size()) if elementwise else max(1, n)
        self._pieces = [(a, min(n, a + step)) for a in range(0, n, step)] or [(0, 0)]
        self._events = []
        self._keep = (src, out)
        with torch.cuda.stream(self._stream):
            for a, b in self._pieces:
                self._host[a:b].copy_(flat_src[a:b], non_blocking=True)
                ev = torch.cuda.Event()
                ev.record(self._stream)
                self._events.append(ev)
        self._reqs = [None] * len(self._pieces)
        self._started = 0
        self._copied = 0

    def _start_ready(self, block):
        while self._started < len(self._pieces):
            ev = self._events[self._started]
            if block:
                ev.synchronize()
            elif not ev.query():
                return
            a, b = self._pieces[self._started]
            self._reqs[self._started] = self._start(self._host[a:b])
            self._started += 1

    def _copy_back(self, i):
        a, b = self._pieces[i]
        with torch.cuda.stream(self._stream):
            self.out.reshape(-1)[a:b].copy_(self._host[a:b], non_blocking=True)

    def poll(self):
        self._start_ready(False)
        while self._copied < self._started:
            req = self._reqs[self._copied]
            if req is not None:
                done = ctypes.c_int()
                rc = lib.tide_test(req, ctypes.byref(done))
                if rc < 0:
                    self._reqs[self._copied] = None
                    raise self._fail(rc, self.call)
                if not done.value:
                    return False
                self._reqs[self._copied] = None
            self._copy_back(self._copied)
            self._copied += 1
        return self._copied == len(self._pieces)

    def wait(self):
        self._start_ready(True)
        while self._copied < len(self._pieces):
            req = self._reqs[self._copied]
            self._reqs[self._copied] = None
            if req is not None:
                rc = lib.tide_wait(req)
                if rc < 0:
                    for r in self._reqs[self._copied + 1:]:
                        if r is not None:
                            lib.tide_wait(r)
                    self._reqs = [None] * len(self._pieces)
                    raise self._fail(rc, self.call)
            self._copy_back(self._copied)
            self._copied += 1
        self._keep = None
        return self.out

    def abandon(self):
        """Waits for what was started (the library still holds the buffers)."""
        for i, r in enumerate(self._reqs):
            if r is not None:
                lib.tide_wait(r)
                self._reqs[i] = None


def to_host(t):
    """t's contents in a pinned host tensor, after the stream's work (waits)."""
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)
    torch.cuda.current_stream(t.device).synchronize()
    return host


def check_tensor_device(t, call, invalid):
    if t.device.type not in ("cpu", "cuda"):
        raise invalid(call, "tensor is on %s; tide.torch exchanges CPU and CUDA tensors" % t.device)


def gpu_error(call):
    why = ctypes.create_string_buffer(256)
    if not lib.tide_gpu_available(why, len(why)):
        return _lib.error(-errno.ENOSYS, "tide cannot use the GPU: %s" % why.value.decode(errors="replace"), call)
    return None
