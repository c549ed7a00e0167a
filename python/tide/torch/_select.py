"""tide's top-k selectors on a torch tensor: on the GPU for CUDA tensors
(tide_gpu_topk_select), on the CPU otherwise (tide_topk_select_opts)."""
import ctypes
import errno

import torch

from .. import _lib
from .._lib import lib
from . import _comm, _cuda

_SELECT_DTYPES = {torch.float32: _lib.F32, torch.float16: _lib.F16, torch.bfloat16: _lib.BF16}


def topk(tensor, k, selector="sampled", seed=0, rounds=0, name=None, stats=False):
    """The k elements of largest magnitude of tensor (flattened, contiguous):
    (values, indices), indices int64 into the flat tensor. selector: "exact"
    or "sampled" (both the exact top k, ties to the lower index) or "mstopk"
    (rounds bisection probes, 0 = 20; seed draws its padding). CUDA tensors
    (float32, float16, bfloat16) select on their GPU, queued on the current
    stream, pairs in no particular order; CPU tensors (float32) select on
    the CPU, indices ascending. stats=True also returns tide's
    tide_topk_stats_t as a dict. A NaN or Inf is an InvalidArgumentError."""
    call = "topk(%s)" % name if name else "topk"
    if not isinstance(tensor, torch.Tensor) or not tensor.is_contiguous():
        raise _comm._invalid(call, "expected a contiguous torch.Tensor")
    kind = ctypes.c_int()
    _lib.check(lib.tide_topk_parse(str(selector).encode(), ctypes.byref(kind)), call)
    d = tensor.numel()
    if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= d:
        raise _comm._invalid(call, "k must be an integer in [0, %d], got %r" % (d, k))
    opts = _lib.TopkOpts(seed=seed, mstopk_rounds=rounds, num_threads=0)
    st = _lib.TopkStats()
    label = (name or "tensor").encode()
    if tensor.is_cuda:
        if tensor.dtype not in _SELECT_DTYPES:
            raise _comm._invalid(call, "dtype %s: the GPU selects float32, float16 or bfloat16" % tensor.dtype)
        values = torch.empty(k, dtype=tensor.dtype, device=tensor.device)
        indices = torch.empty(k, dtype=torch.int64, device=tensor.device)
        rc = lib.tide_gpu_topk_select(kind.value, ctypes.byref(opts), ctypes.c_void_p(tensor.data_ptr()),
                                      _SELECT_DTYPES[tensor.dtype], d, k, label,
                                      ctypes.c_void_p(values.data_ptr()), ctypes.c_void_p(indices.data_ptr()),
                                      _lib.I64, ctypes.c_void_p(_cuda.stream_handle(tensor.device)),
                                      ctypes.byref(st))
        if rc == -errno.EINVAL:
            raise _lib.error(rc, "tide_gpu_topk_select refused it: the tensor holds a NaN or Inf, or an argument is "
                             "out of range (tide's log line names the element or the argument)", call)
        if rc < 0:
            raise (_cuda.gpu_error(call) if rc == -errno.ENOSYS else None) or _lib.error(rc, None, call)
    else:
        if tensor.dtype != torch.float32:
            raise _comm._invalid(call, "dtype %s: the CPU selects float32" % tensor.dtype)
        values = torch.empty(k, dtype=torch.float32)
        idx32 = torch.empty(k, dtype=torch.int32)
        rc = lib.tide_topk_select_opts(kind.value, ctypes.byref(opts), ctypes.c_void_p(tensor.data_ptr()), d, k,
                                       label, ctypes.c_void_p(values.data_ptr()),
                                       ctypes.c_void_p(idx32.data_ptr()), ctypes.byref(st))
        if rc == -errno.EINVAL:
            raise _lib.error(rc, "tide_topk_select refused it: the tensor holds a NaN or Inf (tide's log line names "
                             "the element)", call)
        if rc < 0:
            raise _lib.error(rc, None, call)
        indices = idx32.to(torch.int64) & 0xffffffff
    if stats:
        return values, indices, {f: getattr(st, f) for f, _ in _lib.TopkStats._fields_}
    return values, indices


def gpu_available():
    """(True, "") when tide can select on a GPU here, else (False, why)."""
    why = ctypes.create_string_buffer(256)
    ok = bool(lib.tide_gpu_available(why, len(why)))
    return ok, why.value.decode(errors="replace")
