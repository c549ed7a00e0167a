"""horovod.torch's collective signatures on tide.torch: allreduce with
average/name/compression/op/prescale_factor/postscale_factor and its
_/_async/_async_ forms, grouped_allreduce, differentiable allreduce,
allgather and broadcast with Horovod's gradients, and the *_built queries.
docs/torch.md has the migration table (what is the same, what differs).

Gradients, as Horovod defines them (each rank's backward passes its own
grad_output g_r):
  allreduce(x, op)          -> allreduce(g, op), the same pre/postscale
  allgather(x)              -> this rank's rows of allreduce(g, Average)
  broadcast(x, root)        -> allreduce(g, Average) on root, 0 elsewhere
  reducescatter(x, op)      -> allgather(g), times size for Sum, and the
                               same pre/postscale
  alltoall(x, splits)       -> alltoall(g, the splits received)
"""
import ctypes

import torch

from .. import _lib
from .._lib import lib
from . import _comm
from ._comm import Average, Sum, Adasum, _invalid, synchronize
from ._optimizer import Compression

# The two libtide calls only this module makes.
lib.tide_reduce_scatter.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                    ctypes.c_int]
lib.tide_reduce_scatter.restype = ctypes.c_int
lib.tide_mpi_built.argtypes = []
lib.tide_mpi_built.restype = ctypes.c_int


def _resolve_op(average, op, call):
    """Horovod's rule: op wins; average=False means Sum; neither: Average."""
    if op is not None and average is not None:
        raise _invalid(call, "pass op or average (deprecated), not both (got average=%r, op=%r)" % (average, op))
    if average is not None and not isinstance(average, bool):
        raise _invalid(call, "average must be True or False, got %r (pass a reduction as op=..., e.g. "
                       "op=tide.torch.Sum)" % (average,))
    if op is None:
        op = Sum if average is False else Average
    _comm._check_op(op, call)
    return op


def _check_factor(name, f, call):
    if isinstance(f, bool) or not isinstance(f, (int, float)):
        raise _invalid(call, "%s must be a number, got %r" % (name, f))
    return float(f)


class _Scaled:
    """A handle whose output is postscaled and decompressed when it
    completes; synchronize() and poll() treat it like any Handle."""

    def __init__(self, inner, postscale, compression, ctx, out):
        self._inner, self._post, self._compression, self._ctx, self._out = inner, postscale, compression, ctx, out
        self.output = out

    def poll(self):
        return self._inner is None or self._inner.poll()

    def wait(self):
        if self._inner is None:
            return self.output
        inner, self._inner = self._inner, None
        result = inner.wait()
        if self._post != 1.0:
            result.mul_(self._post)
        result = self._compression.decompress(result, self._ctx)
        if self._out is not None and result is not self._out:
            self._out.copy_(result)
            result = self._out
        self.output = result
        return result


def _allreduce_start(tensor, output, op, name, compression, prescale_factor, postscale_factor, call):
    """Starts tensor's allreduce into output (tensor itself: in place)."""
    pre = _check_factor("prescale_factor", prescale_factor, call)
    post = _check_factor("postscale_factor", postscale_factor, call)
    if not isinstance(compression, Compression._Kind) or not compression.dense:
        raise _invalid(call, "compression must be Compression.none or Compression.fp16 for allreduce, got %r"
                       % (compression,))
    if (pre != 1.0 or post != 1.0) and not tensor.is_floating_point():
        raise _invalid(call, "prescale_factor and postscale_factor need a floating-point tensor, got %s"
                       % tensor.dtype)
    if (pre != 1.0 or post != 1.0) and op == Adasum:
        raise _invalid(call, "prescale_factor and postscale_factor do not combine with Adasum")
    _comm._check_tensor(tensor, call)
    send, ctx = compression.compress(tensor)
    if pre != 1.0:
        send = send * pre
    in_place = output is tensor
    if send is tensor:
        recv = tensor if in_place else torch.empty_like(tensor)
    else:  # a fresh tensor (scaled or compressed): reduce into it
        recv = send
    handle = _comm._start_allreduce(send, recv, op, call)
    if send is tensor and post == 1.0:
        return handle  # nothing to do after it: the plain Handle
    return _Scaled(handle, post, compression, ctx, tensor if in_place else None)


def _call(base, name):
    return "%s(%s)" % (base, name) if name else base


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                    process_set=None, compression=Compression.none):
    """Starts an allreduce of tensor into a new tensor; synchronize(handle)
    returns it. tensor must not change until then."""
    call = _call("allreduce_async", name)
    _no_process_set(process_set, call)
    op = _resolve_op(average, op, call)
    return _allreduce_start(tensor, None, op, name, compression, prescale_factor, postscale_factor, call)


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                     process_set=None, compression=Compression.none):
    """In-place form of allreduce_async: synchronize(handle) returns tensor."""
    call = _call("allreduce_async_", name)
    _no_process_set(process_set, call)
    op = _resolve_op(average, op, call)
    return _allreduce_start(tensor, tensor, op, name, compression, prescale_factor, postscale_factor, call)


class _AllreduceFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, op, name, compression, pre, post):
        ctx.args = (op, compression, pre, post)
        h = _allreduce_start(tensor, None, op, name, compression, pre, post, _call("allreduce", name))
        return synchronize(h)

    @staticmethod
    def backward(ctx, grad):
        op, compression, pre, post = ctx.args
        return allreduce(grad.contiguous(), op=op, compression=compression, prescale_factor=pre,
                         postscale_factor=post), None, None, None, None, None


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None, prescale_factor=1.0,
              postscale_factor=1.0, process_set=None):
    """The Average (default), Sum, Min, Max or Adasum of tensor over all
    ranks, as a new tensor (tensor * prescale_factor is reduced, the result
    multiplied by postscale_factor). Differentiable: the gradient is the
    same allreduce of the incoming gradient."""
    call = _call("allreduce", name)
    _no_process_set(process_set, call)
    op = _resolve_op(average, op, call)
    return _AllreduceFn.apply(tensor, op, name, compression, prescale_factor, postscale_factor)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
               process_set=None, compression=Compression.none):
    """In place: tensor becomes the allreduce's result; returns tensor."""
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor, postscale_factor, process_set,
                                        compression))


class _Group:
    """The handle of a grouped call: synchronize() returns the list."""

    def __init__(self, handles):
        self._handles = handles
        self.output = None

    def poll(self):
        return all(h.poll() for h in self._handles)

    def wait(self):
        if self.output is None:
            self.output = [h.wait() for h in self._handles]
        return self.output


def _grouped(tensors, call):
    if not isinstance(tensors, (list, tuple)) or not all(isinstance(t, torch.Tensor) for t in tensors):
        raise _invalid(call, "expected a list of tensors")
    return list(tensors)


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=None, compression=Compression.none):
    call = _call("grouped_allreduce_async", name)
    tensors = _grouped(tensors, call)
    return _Group([allreduce_async(t, average, None, op, prescale_factor, postscale_factor, process_set,
                                   compression) for t in tensors])


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=None, compression=Compression.none):
    call = _call("grouped_allreduce_async_", name)
    tensors = _grouped(tensors, call)
    return _Group([allreduce_async_(t, average, None, op, prescale_factor, postscale_factor, process_set,
                                    compression) for t in tensors])


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=None):
    """allreduce of each tensor of the list, as a list (differentiable)."""
    call = _call("grouped_allreduce", name)
    tensors = _grouped(tensors, call)
    if any(t.requires_grad for t in tensors) and torch.is_grad_enabled():
        return [allreduce(t, average, None, compression, op, prescale_factor, postscale_factor, process_set)
                for t in tensors]
    return synchronize(grouped_allreduce_async(tensors, average, name, op, prescale_factor, postscale_factor,
                                               process_set, compression))


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                       process_set=None, compression=Compression.none):
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor, postscale_factor,
                                                process_set, compression))


class _AllgatherFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name):
        ctx.rows = tensor.shape[0] if tensor.dim() > 0 else 1
        return _comm.allgather(tensor, name)

    @staticmethod
    def backward(ctx, grad):
        reduced = allreduce(grad.contiguous(), op=Average)
        rows = _comm.allgather(torch.tensor([ctx.rows], dtype=torch.int64))
        offset = int(rows[:_comm.rank()].sum().item())
        return reduced.narrow(0, offset, ctx.rows), None


def allgather(tensor, name=None, process_set=None):
    """Every rank's tensor concatenated along dimension 0, in rank order
    (first dimensions may differ). Differentiable."""
    _no_process_set(process_set, _call("allgather", name))
    return _AllgatherFn.apply(tensor, name)


class _BroadcastFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name):
        ctx.root_rank = root_rank
        return _comm.broadcast(tensor, root_rank, name)

    @staticmethod
    def backward(ctx, grad):
        reduced = allreduce(grad.contiguous(), op=Average)
        if _comm.rank() != ctx.root_rank:
            reduced = reduced * 0
        return reduced, None, None


def broadcast(tensor, root_rank, name=None, process_set=None):
    """root_rank's tensor, as a new tensor. Differentiable: the gradient is
    the average of the ranks' gradients on root_rank, zero elsewhere."""
    _no_process_set(process_set, _call("broadcast", name))
    return _BroadcastFn.apply(tensor, root_rank, name)


def broadcast_async(tensor, root_rank, name=None, process_set=None):
    """Starts a broadcast into a new tensor; synchronize(handle) returns it."""
    _no_process_set(process_set, _call("broadcast_async", name))
    return _comm.broadcast_async_(tensor.clone(), root_rank, name)


def _row_block(rows, n, r):
    """Horovod's split of rows over n ranks: the first rows % n get one more."""
    base, rem = divmod(rows, n)
    return r * base + min(r, rem), base + (1 if r < rem else 0)


class _ReducescatterFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, pre, post):
        ctx.args = (op, pre, post)
        call = _call("reducescatter", name)
        dtype = _comm._check_tensor(tensor, call)
        if tensor.dim() == 0:
            raise _invalid(call, "reducescatter needs a tensor of at least one dimension (its rows are split)")
        device, x = tensor.device, tensor.cpu()
        if pre != 1.0:
            x = x * pre
        n, me, rows = _comm.size(), _comm.rank(), x.shape[0]
        # Every rank's block padded to the largest, so that libtide's equal
        # element blocks are Horovod's row blocks.
        most = -(-rows // n)
        padded = torch.zeros((n * most,) + tuple(x.shape[1:]), dtype=x.dtype)
        for r in range(n):
            lo, count = _row_block(rows, n, r)
            padded[r * most:r * most + count] = x[lo:lo + count]
        out = torch.empty((most,) + tuple(x.shape[1:]), dtype=x.dtype)
        with _comm.one_thread(call):
            rc = lib.tide_reduce_scatter(_comm._c(call), _comm._ptr(padded), _comm._ptr(out), padded.numel(),
                                         dtype, op)
        if rc < 0:
            raise _comm._fail(rc, call)
        mine = out[:_row_block(rows, n, me)[1]].clone()
        if post != 1.0:
            mine.mul_(post)
        return mine.to(device)

    @staticmethod
    def backward(ctx, grad):
        op, pre, post = ctx.args
        g = grad * (_comm.size() if op == Sum else 1) * pre * post  # Horovod's gradient
        return _comm.allgather(g.contiguous()), None, None, None, None


def reducescatter(tensor, name=None, compression=Compression.none, op=Average, process_set=None,
                  prescale_factor=1.0, postscale_factor=1.0):
    """The Sum or Average (default) of tensor over all ranks, split by rows:
    rank r gets its block of dimension 0 (the first rows % size ranks one
    row more), as Horovod does. Differentiable with Horovod's gradient
    (allgather of the incoming gradient, times size for Sum)."""
    call = _call("reducescatter", name)
    _no_process_set(process_set, call)
    _comm._check_op(op, call)
    if op not in (Sum, Average):
        raise _invalid(call, "reducescatter supports op=Sum and op=Average, got %s" % _comm._OP_NAMES[op])
    pre = _check_factor("prescale_factor", prescale_factor, call)
    post = _check_factor("postscale_factor", postscale_factor, call)
    if not isinstance(compression, Compression._Kind) or not compression.dense:
        raise _invalid(call, "compression must be Compression.none or Compression.fp16, got %r" % (compression,))
    send, ctx = compression.compress(tensor)
    return compression.decompress(_ReducescatterFn.apply(send, name, op, pre, post), ctx)


def _alltoall(tensor, splits, call):
    """(output, received splits as int32). Built on two allgathers: every
    rank receives every rank's whole tensor and keeps its slices, so it
    moves size times the data of a real alltoall (libtide has none public
    yet); correct, for the small exchanges Horovod scripts use it for."""
    _comm._check_tensor(tensor, call)
    if tensor.dim() == 0:
        raise _invalid(call, "alltoall needs a tensor of at least one dimension (its rows are sent)")
    n, me, rows = _comm.size(), _comm.rank(), tensor.shape[0]
    if splits is None:
        if rows % n:
            raise _invalid(call, "dimension 0 (%d rows) does not divide by the %d ranks; pass splits" % (rows, n))
        mine = [rows // n] * n
    else:
        mine = [int(v) for v in (splits.tolist() if isinstance(splits, torch.Tensor) else splits)]
        if len(mine) != n or any(v < 0 for v in mine) or sum(mine) != rows:
            raise _invalid(call, "splits must be %d counts >= 0 that add up to the %d rows, got %r" % (n, rows, mine))
    table = _comm.allgather(torch.tensor(mine, dtype=torch.int64)).view(n, n)  # row p: what p sends to each
    gathered = _comm.allgather(tensor.cpu().contiguous())
    parts, start = [], 0
    for p in range(n):
        off = start + int(table[p, :me].sum())
        parts.append(gathered[off:off + int(table[p, me])])
        start += int(table[p].sum())
    return torch.cat(parts).to(tensor.device), table[:, me].to(torch.int32)


class _AlltoallFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, name):
        out, received = _alltoall(tensor, splits, _call("alltoall", name))
        ctx.received = received
        ctx.mark_non_differentiable(received)
        return out, received

    @staticmethod
    def backward(ctx, grad, unused):
        back, _ = _alltoall(grad.contiguous(), ctx.received, "alltoall gradient")
        return back, None, None


def alltoall(tensor, splits=None, name=None, process_set=None):
    """Sends rows of tensor to every rank: splits[p] rows (in order) to rank
    p (None: equal shares). Returns the rows received, in rank order, and,
    when splits is given, how many came from each rank (Horovod's form).
    Differentiable: the gradient goes back by the reverse alltoall."""
    _no_process_set(process_set, _call("alltoall", name))
    out, received = _AlltoallFn.apply(tensor, splits, name)
    return out if splits is None else (out, received)


def allgather_object(obj, name=None, process_set=None):
    """Every rank's obj (anything torch.save takes), as a list in rank order."""
    import io
    call = _call("allgather_object", name)
    _no_process_set(process_set, call)
    buf = io.BytesIO()
    torch.save(obj, buf)
    data = buf.getvalue()
    words = torch.zeros((len(data) + 3) // 4, dtype=torch.int32)
    ctypes.memmove(words.data_ptr(), data, len(data))
    lengths = _comm.allgather(torch.tensor([len(data)], dtype=torch.int64), name).tolist()
    gathered = _comm.allgather(words, name)
    out, at = [], 0
    for nbytes in lengths:
        raw = ctypes.string_at(gathered.data_ptr() + at * 4, nbytes)
        out.append(torch.load(io.BytesIO(raw)))
        at += (nbytes + 3) // 4
    return out


def _no_process_set(process_set, call):
    if process_set is not None:
        raise _invalid(call, "process sets are not implemented in tide.torch yet; use the global set "
                       "(process_set=None) (docs/torch.md, Horovod migration)")


# What this tide was built with, answered truthfully: tide has its own
# transports (shared memory, TCP) and optionally MPI; it has no NCCL, Gloo,
# oneCCL, DDL or ROCm backend, and stages CUDA tensors through host memory
# (cuda_built: False, as Horovod answers for a build without GPU operations).
def mpi_built(verbose=False):
    return bool(lib.tide_mpi_built())


def mpi_enabled():
    return mpi_built() and _lib._mpi_backend()


def gloo_built(verbose=False):
    return False


def gloo_enabled():
    return False


def nccl_built(verbose=False):
    return 0


def ddl_built(verbose=False):
    return False


def ccl_built(verbose=False):
    return False


def cuda_built(verbose=False):
    return False


def rocm_built(verbose=False):
    return False


def mpi_threads_supported():
    return mpi_built()
