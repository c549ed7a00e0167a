"""horovod.torch's collectives on tide.torch, with Horovod's signatures
and semantics: calls matched by name across ranks (negotiated, _controller.py),
process sets, join, the async and grouped forms, uint8/int8/int16/bool as
well as tide's dtypes, Product, differentiable allreduce, allgather,
broadcast, alltoall and reducescatter with Horovod's gradients, and the
*_built queries. docs/torch.md has the migration table.

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
from . import _comm, _controller
from ._comm import Average, Sum, Adasum, _invalid, synchronize
from ._controller import ProcessSet, global_process_set, add_process_set, remove_process_set  # noqa: F401
from ._optimizer import Compression

# The libtide calls only this module makes.
lib.tide_reduce_scatter.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                    ctypes.c_int]
lib.tide_reduce_scatter.restype = ctypes.c_int
lib.tide_mpi_built.argtypes = []
lib.tide_mpi_built.restype = ctypes.c_int
lib.tide_comm_split.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_void_p)]
lib.tide_comm_split.restype = ctypes.c_int

# Horovod's Product: libtide has no product reduction, so it is an
# allgather and a local product (size times the traffic of a reduction).
Product = 101
_OP_NAMES = dict(_comm._OP_NAMES)
_OP_NAMES[Product] = "Product"
_OPS_BY_NAME = {v: k for k, v in _OP_NAMES.items()}

# Dtypes libtide lacks travel as int32 (exact both ways).
_NARROW = (torch.uint8, torch.int8, torch.int16, torch.bool)
_ALL_DTYPES = tuple(_comm._DTYPES) + _NARROW

HorovodInternalError = _lib.PeerError  # what Horovod raises when a peer is lost


def init(comm=None, process_sets=None):
    """Joins the job (tiderun, mpirun, srun, or alone). comm: None, or the
    list of all the job's ranks (tide has no MPI communicator argument);
    process_sets: ProcessSets to register now (collective, as
    add_process_set)."""
    if comm is not None and not (isinstance(comm, (list, tuple)) and not process_sets):
        raise _invalid("init", "comm must be None (tide joins the job its launcher describes); got %r" % (comm,))
    _comm.init()
    if comm is not None and sorted(comm) != list(range(_comm.size())):
        raise _invalid("init", "comm=%r: tide.torch runs on all %d ranks of the job; use add_process_set for a "
                       "subset" % (comm, _comm.size()))
    for ps in process_sets or []:
        if isinstance(ps, ProcessSet) and ps.ranks is None:
            continue
        add_process_set(ps)


def _resolve_op(average, op, call):
    """Horovod's rule: op wins; average=False means Sum; neither: Average."""
    if op is not None and average is not None:
        raise _invalid(call, "pass op or average (deprecated), not both (got average=%r, op=%r)" % (average, op))
    if average is not None and not isinstance(average, bool):
        raise _invalid(call, "average must be True or False, got %r (pass a reduction as op=..., e.g. "
                       "op=tide.torch.Sum)" % (average,))
    if op is None:
        op = Sum if average is False else Average
    if op not in _OP_NAMES:
        raise _invalid(call, "op must be tide.torch.Average, Sum, Min, Max, Product or Adasum, got %r" % (op,))
    return op


def _check_factor(name, f, call):
    if isinstance(f, bool) or not isinstance(f, (int, float)):
        raise _invalid(call, "%s must be a number, got %r" % (name, f))
    return float(f)


def _check(tensor, call):
    _comm._check_tensor(tensor, call, _ALL_DTYPES)


def _wire(t):
    """t as a tensor libtide exchanges (narrow dtypes as int32)."""
    return t.to(torch.int32) if t.dtype in _NARROW else t


def _call(base, name):
    return "%s(%s)" % (base, name) if name else base


def _check_compression(compression, call):
    if not isinstance(compression, Compression._Kind) or not compression.dense:
        raise _invalid(call, "compression must be Compression.none or Compression.fp16, got %r" % (compression,))


def _scale(t, factor):
    """Horovod's scaling: integers in float64, float16 in float32 on the
    CPU, other floats (and float16 on a GPU) in their own dtype."""
    if factor == 1.0:
        return t
    if not t.is_floating_point():
        return (t.double() * factor).to(t.dtype)
    if t.dtype in (torch.float16, torch.bfloat16):
        if not t.is_cuda:
            return (t.float() * factor).to(t.dtype)
        # On a GPU Horovod scales in the tensor's own type, the factor too.
        return t * torch.tensor(factor, dtype=t.dtype, device=t.device)
    return t * factor


def _submit(ps, kind, name, desc, run, call, finish=None):
    return _controller.Handle(_controller.submit(ps, kind, name, desc, run, call), finish)


# ---- allreduce ------------------------------------------------------------------------


def _reduce(w, op, call):
    """The ordered allreduce of w (tide's dtypes) in the active communicator,
    into a new tensor."""
    if op == Product:
        n = _comm.size()
        if n == 1:
            return w.clone()
        g = _comm.allgather(w.reshape(1, -1).contiguous(), call).view(n, -1)
        if g.dtype in (torch.float16, torch.bfloat16) and not g.is_cuda:
            g = g.float()
        return g.prod(0).to(w.dtype).reshape(w.shape)
    recv = torch.empty_like(w)
    return _comm._start_allreduce(w, recv, op, call).wait()


def _joined_allreduce(dtype, shape, device, op):
    z = torch.zeros(shape, dtype=dtype, device="cuda" if device == "cuda" else "cpu")
    _reduce(z, _OPS_BY_NAME[op], "allreduce (joined rank's zeros)")


_controller._JOINED_ALLREDUCE[0] = _joined_allreduce


_WIRE_DTYPE_NAMES = {}  # (compression name, dtype) -> the name of the dtype the allreduce sends


def _wire_dtype_name(compression, dtype):
    """What an allreduce's description says it sends: the dtype after
    compression, narrow ones as int32 (computed once per pair: this runs for
    every request)."""
    key = (compression.name, dtype)
    name = _WIRE_DTYPE_NAMES.get(key)
    if name is None:
        wire = compression.compress(torch.empty(0, dtype=dtype))[0].dtype
        name = _WIRE_DTYPE_NAMES[key] = str(torch.int32 if wire in _NARROW else wire)
    return name


def _allreduce_submit(tensor, output, average, name, op, prescale_factor, postscale_factor, process_set, compression,
                      call):
    """Registers tensor's allreduce (into output; None: a new tensor) after
    checking everything a rank can check alone."""
    ps = _controller.resolve(process_set, call)
    op = _resolve_op(average, op, call)
    pre = _check_factor("prescale_factor", prescale_factor, call)
    post = _check_factor("postscale_factor", postscale_factor, call)
    _check_compression(compression, call)
    _check(tensor, call)
    if op == Adasum and tensor.dtype not in (torch.float32, torch.float64):
        raise _invalid(call, "Adasum needs float32 or float64 tensors, got %s" % tensor.dtype)
    if (pre != 1.0 or post != 1.0) and op == Adasum:
        raise _invalid(call, "prescale_factor and postscale_factor do not combine with Adasum")
    desc = (_wire_dtype_name(compression, tensor.dtype), tuple(tensor.shape), _OP_NAMES[op], tensor.device.type)

    def prepare():
        send, ctx = compression.compress(_scale(tensor, pre))
        return _wire(send), (send.dtype, ctx)

    def finish(result, state):
        dtype, ctx = state
        if result.dtype != dtype:
            result = result.to(dtype)
        result = _scale(compression.decompress(result, ctx), post)
        if output is not None:
            output.copy_(result)
            return output
        return result

    def run():
        w, state = prepare()
        return finish(_reduce(w, op, call), state)
    h = _submit(ps, "allreduce", name, desc, run, call)
    if _controller.fusible(h._req.desc):  # decided from the description alone: the same on every rank
        h._req.fuse = (prepare, finish, lambda flat: _reduce(flat, op, call))
    return h


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                    process_set=global_process_set, compression=Compression.none):
    """Starts an allreduce of tensor into a new tensor; synchronize(handle)
    returns it. tensor must not change until then."""
    return _allreduce_submit(tensor, None, average, name, op, prescale_factor, postscale_factor, process_set,
                             compression, _call("allreduce_async", name))


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                     process_set=global_process_set, compression=Compression.none):
    """In-place form of allreduce_async: synchronize(handle) returns tensor."""
    return _allreduce_submit(tensor, tensor, average, name, op, prescale_factor, postscale_factor, process_set,
                             compression, _call("allreduce_async_", name))


class _AllreduceFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, op, name, compression, pre, post, ps):
        ctx.args = (op, compression, pre, post, ps)
        return synchronize(_allreduce_submit(tensor, None, None, name, op, pre, post, ps, compression,
                                             _call("allreduce", name)))

    @staticmethod
    def backward(ctx, grad):
        op, compression, pre, post, ps = ctx.args
        return (allreduce(grad.contiguous(), op=op, compression=compression, prescale_factor=pre,
                          postscale_factor=post, process_set=ps), None, None, None, None, None, None)


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None, prescale_factor=1.0,
              postscale_factor=1.0, process_set=global_process_set):
    """The Average (default), Sum, Min, Max, Product or Adasum of tensor over
    the process set's ranks, as a new tensor (tensor * prescale_factor is
    reduced, the result multiplied by postscale_factor). Differentiable:
    the gradient is the same allreduce of the incoming gradient."""
    op = _resolve_op(average, op, _call("allreduce", name))
    return _AllreduceFn.apply(tensor, op, name, compression, prescale_factor, postscale_factor, process_set)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
               process_set=global_process_set, compression=Compression.none):
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
    devices = sorted({str(t.device) for t in tensors})
    if len(devices) > 1:  # as Horovod: a group is one device's
        raise _invalid(call, "the tensors of a group must be on one device, got tensors on %s" % " and ".join(devices))
    return list(tensors)


def _member_name(name, i):
    return None if name is None else "%s.%d" % (name, i)


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=global_process_set, compression=Compression.none):
    tensors = _grouped(tensors, _call("grouped_allreduce_async", name))
    return _Group([allreduce_async(t, average, _member_name(name, i), op, prescale_factor, postscale_factor,
                                   process_set, compression) for i, t in enumerate(tensors)])


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=global_process_set, compression=Compression.none):
    tensors = _grouped(tensors, _call("grouped_allreduce_async_", name))
    return _Group([allreduce_async_(t, average, _member_name(name, i), op, prescale_factor, postscale_factor,
                                    process_set, compression) for i, t in enumerate(tensors)])


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """allreduce of each tensor of the list, as a list (differentiable)."""
    tensors = _grouped(tensors, _call("grouped_allreduce", name))
    if any(t.requires_grad for t in tensors) and torch.is_grad_enabled():
        return [allreduce(t, average, _member_name(name, i), compression, op, prescale_factor, postscale_factor,
                          process_set) for i, t in enumerate(tensors)]
    return synchronize(grouped_allreduce_async(tensors, average, name, op, prescale_factor, postscale_factor,
                                               process_set, compression))


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                       process_set=global_process_set, compression=Compression.none):
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor, postscale_factor,
                                                process_set, compression))


# ---- allgather ------------------------------------------------------------------------


def _allgather_submit(tensor, name, process_set, call):
    ps = _controller.resolve(process_set, call)
    _check(tensor, call)
    shape = tuple(tensor.shape)
    desc = (str(tensor.dtype), "rows x %s" % (shape[1:],), tensor.device.type)

    def run():
        out = _comm.allgather(_wire(tensor), call)
        return out.to(tensor.dtype) if out.dtype != tensor.dtype else out
    return _submit(ps, "allgather", name, desc, run, call)


def allgather_async(tensor, name=None, process_set=global_process_set):
    """Starts an allgather; synchronize(handle) returns the concatenation."""
    return _allgather_submit(tensor, name, process_set, _call("allgather_async", name))


class _AllgatherFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, ps):
        ctx.rows = tensor.shape[0] if tensor.dim() > 0 else 1
        ctx.ps = ps
        return synchronize(_allgather_submit(tensor, name, ps, _call("allgather", name)))

    @staticmethod
    def backward(ctx, grad):
        ps = ctx.ps
        reduced = allreduce(grad.contiguous(), op=Average, process_set=ps)
        rows = allgather(torch.tensor([ctx.rows], dtype=torch.int64), process_set=ps)
        offset = int(rows[:_controller.resolve(ps, "allgather gradient").rank()].sum().item())
        return reduced.narrow(0, offset, ctx.rows), None, None


def allgather(tensor, name=None, process_set=global_process_set):
    """Every rank's tensor concatenated along dimension 0, in rank order
    (first dimensions may differ). Differentiable."""
    return _AllgatherFn.apply(tensor, name, process_set)


def grouped_allgather_async(tensors, name=None, process_set=global_process_set):
    tensors = _grouped(tensors, _call("grouped_allgather_async", name))
    return _Group([allgather_async(t, _member_name(name, i), process_set) for i, t in enumerate(tensors)])


def grouped_allgather(tensors, name=None, process_set=global_process_set):
    """allgather of each tensor of the list, as a list (differentiable)."""
    tensors = _grouped(tensors, _call("grouped_allgather", name))
    if any(t.requires_grad for t in tensors) and torch.is_grad_enabled():
        return [allgather(t, _member_name(name, i), process_set) for i, t in enumerate(tensors)]
    return synchronize(grouped_allgather_async(tensors, name, process_set))


# ---- broadcast ------------------------------------------------------------------------


def _broadcast_submit(tensor, output, root_rank, name, process_set, call):
    ps = _controller.resolve(process_set, call)
    _check(tensor, call)
    members = ps._members()
    if isinstance(root_rank, bool) or not isinstance(root_rank, int) or root_rank not in members:
        raise _invalid(call, "root_rank=%r is not a rank of the process set (ranks %s)" % (root_rank, members))
    root = members.index(root_rank)
    desc = (str(tensor.dtype), tuple(tensor.shape), "root_rank=%d" % root_rank, tensor.device.type)

    def run():
        w = _wire(tensor)
        if output is None or w is not tensor:
            w = w.clone()
        _comm.broadcast_(w, root, call)
        if output is None:
            return w.to(tensor.dtype) if w.dtype != tensor.dtype else w
        if w is not output:
            output.copy_(w)
        return output
    return _submit(ps, "broadcast", name, desc, run, call)


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set):
    """Starts a broadcast into a new tensor; synchronize(handle) returns it."""
    return _broadcast_submit(tensor, None, root_rank, name, process_set, _call("broadcast_async", name))


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set):
    """Starts a broadcast into tensor itself; synchronize(handle) returns it."""
    return _broadcast_submit(tensor, tensor, root_rank, name, process_set, _call("broadcast_async_", name))


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    """Overwrites tensor with root_rank's, in place; returns tensor."""
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


class _BroadcastFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name, ps):
        ctx.root_rank, ctx.ps = root_rank, ps
        return synchronize(_broadcast_submit(tensor, None, root_rank, name, ps, _call("broadcast", name)))

    @staticmethod
    def backward(ctx, grad):
        reduced = allreduce(grad.contiguous(), op=Average, process_set=ctx.ps)
        if _comm.rank() != ctx.root_rank:
            reduced = reduced * 0
        return reduced, None, None, None


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """root_rank's tensor, as a new tensor. Differentiable: the gradient is
    the average of the ranks' gradients on root_rank, zero elsewhere."""
    return _BroadcastFn.apply(tensor, root_rank, name, process_set)


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """root_rank's obj (anything torch.save takes), on every rank of the set."""
    ps = _controller.resolve(process_set, _call("broadcast_object", name))
    name = name or "broadcast_object.%s" % type(obj).__name__
    return _comm.broadcast_object_with(obj, _comm.rank() == root_rank,
                                       lambda t, part: broadcast_(t, root_rank, "%s.%s" % (name, part), ps))


def allgather_object(obj, name=None, process_set=global_process_set):
    """Every rank's obj (anything torch.save takes), as a list in rank order."""
    ps = _controller.resolve(process_set, _call("allgather_object", name))
    name = name or "allgather_object.%s" % type(obj).__name__
    words, nbytes = _comm.pack_object(obj)
    h_len = allgather_async(torch.tensor([nbytes], dtype=torch.int64), name + ".sz", ps)
    h_words = allgather_async(words, name + ".t", ps)
    lengths, gathered = synchronize(h_len).tolist(), synchronize(h_words)
    out, at = [], 0
    for n in lengths:
        out.append(_comm.unpack_object(gathered, n, at))
        at += (n + 3) // 4
    return out


# ---- barrier and join -----------------------------------------------------------------


def barrier(process_set=global_process_set):
    """Returns once every rank of the set has called it (negotiated with the
    other named calls in flight, as Horovod's barrier)."""
    call = "barrier"
    ps = _controller.resolve(process_set, call)
    synchronize(_submit(ps, "barrier", None, (), lambda: _comm.barrier(), call))


def join(device=-1):
    """Horovod's join: this rank has no more data; it takes part in the
    other ranks' allreduces with zeros until every rank has joined. Returns
    the rank that joined last, the same on every rank. Any other collective
    started while ranks have joined fails on the ranks that made it."""
    return _controller.join("join")


# ---- reducescatter --------------------------------------------------------------------


def _row_block(rows, n, r):
    """Horovod's split of rows over n ranks: the first rows % n get one more."""
    base, rem = divmod(rows, n)
    return r * base + min(r, rem), base + (1 if r < rem else 0)


def _reducescatter_ordered(tensor, op, pre, post, call):
    dtype = _comm._check_tensor(tensor, call)
    device, x = tensor.device, _scale(tensor, pre).cpu()
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
        rc = lib.tide_reduce_scatter(_comm._c(call), _comm._ptr(padded), _comm._ptr(out), padded.numel(), dtype, op)
    if rc < 0:
        raise _comm._fail(rc, call)
    # On the tensor's device before the postscale: on a GPU it is in float16 (Horovod's).
    return _scale(out[:_row_block(rows, n, me)[1]].to(device, copy=True), post)


def _reducescatter_submit(tensor, name, compression, op, process_set, prescale_factor, postscale_factor, call):
    ps = _controller.resolve(process_set, call)
    if op not in _OP_NAMES:
        raise _invalid(call, "op must be tide.torch.Sum or Average, got %r" % (op,))
    if op not in (Sum, Average):
        raise _invalid(call, "reducescatter supports op=Sum and op=Average, got %s" % _OP_NAMES[op])
    pre = _check_factor("prescale_factor", prescale_factor, call)
    post = _check_factor("postscale_factor", postscale_factor, call)
    _check_compression(compression, call)
    _comm._check_tensor(tensor, call)
    if tensor.dim() == 0:
        raise _invalid(call, "reducescatter needs a tensor of at least one dimension (its rows are split)")
    desc = (str(tensor.dtype), tuple(tensor.shape), _OP_NAMES[op], tensor.device.type)

    def run():
        send, ctx = compression.compress(tensor)
        return compression.decompress(_reducescatter_ordered(send, op, pre, post, call), ctx)
    return _submit(ps, "reducescatter", name, desc, run, call)


def reducescatter_async(tensor, name=None, compression=Compression.none, op=Average, process_set=global_process_set,
                        prescale_factor=1.0, postscale_factor=1.0):
    return _reducescatter_submit(tensor, name, compression, op, process_set, prescale_factor, postscale_factor,
                                 _call("reducescatter_async", name))


class _ReducescatterFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, compression, op, ps, pre, post):
        ctx.args = (op, pre, post, ps)
        return synchronize(_reducescatter_submit(tensor, name, compression, op, ps, pre, post,
                                                 _call("reducescatter", name)))

    @staticmethod
    def backward(ctx, grad):
        op, pre, post, ps = ctx.args
        n = _controller.resolve(ps, "reducescatter gradient").size()
        g = grad * (n if op == Sum else 1) * pre * post  # Horovod's gradient
        return allgather(g.contiguous(), process_set=ps), None, None, None, None, None, None


def reducescatter(tensor, name=None, compression=Compression.none, op=Average, process_set=global_process_set,
                  prescale_factor=1.0, postscale_factor=1.0):
    """The Sum or Average (default) of tensor over the set's ranks, split by
    rows: rank r gets its block of dimension 0 (the first rows % size ranks
    one row more), as Horovod does. Differentiable with Horovod's gradient
    (allgather of the incoming gradient, times size for Sum)."""
    return _ReducescatterFn.apply(tensor, name, compression, op, process_set, prescale_factor, postscale_factor)


def grouped_reducescatter_async(tensors, name=None, compression=Compression.none, op=Average,
                                process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    tensors = _grouped(tensors, _call("grouped_reducescatter_async", name))
    return _Group([reducescatter_async(t, _member_name(name, i), compression, op, process_set, prescale_factor,
                                       postscale_factor) for i, t in enumerate(tensors)])


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=Average,
                          process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    """reducescatter of each tensor of the list, as a list (differentiable)."""
    tensors = _grouped(tensors, _call("grouped_reducescatter", name))
    if any(t.requires_grad for t in tensors) and torch.is_grad_enabled():
        return [reducescatter(t, _member_name(name, i), compression, op, process_set, prescale_factor,
                              postscale_factor) for i, t in enumerate(tensors)]
    return synchronize(grouped_reducescatter_async(tensors, name, compression, op, process_set, prescale_factor,
                                                   postscale_factor))


# ---- alltoall -------------------------------------------------------------------------


def _alltoall_splits(tensor, splits, n, call):
    rows = tensor.shape[0]
    if splits is None:
        if rows % n:
            raise _invalid(call, "dimension 0 (%d rows) does not divide by the %d ranks; pass splits" % (rows, n))
        return [rows // n] * n
    if isinstance(splits, torch.Tensor) and (splits.is_floating_point() or splits.dim() != 1):
        raise _invalid(call, "splits must be a 1-D integer tensor or a list of ints, got %s %s"
                       % (splits.dtype, tuple(splits.shape)))
    mine = [int(v) for v in (splits.tolist() if isinstance(splits, torch.Tensor) else splits)]
    if len(mine) != n or any(v < 0 for v in mine) or sum(mine) != rows:
        raise _invalid(call, "splits must be %d counts >= 0 that add up to the %d rows, got %r" % (n, rows, mine))
    return mine


def _alltoall_ordered(tensor, mine, splits_device, call):
    """(output, received splits as int32). Built on two allgathers: every
    rank receives every rank's whole tensor and keeps its slices, so it
    moves size times the data of a real alltoall (libtide has none public
    yet); correct, for the small exchanges Horovod scripts use it for."""
    n, me = _comm.size(), _comm.rank()
    table = _comm.allgather(torch.tensor(mine, dtype=torch.int64), call).view(n, n)  # row p: what p sends to each
    gathered = _comm.allgather(_wire(tensor).cpu().contiguous(), call)
    parts, start = [], 0
    for p in range(n):
        off = start + int(table[p, :me].sum())
        parts.append(gathered[off:off + int(table[p, me])])
        start += int(table[p].sum())
    return torch.cat(parts).to(tensor.dtype).to(tensor.device), table[:, me].to(torch.int32).to(splits_device)


def _alltoall_submit(tensor, splits, name, process_set, call):
    ps = _controller.resolve(process_set, call)
    _check(tensor, call)
    if tensor.dim() == 0:
        raise _invalid(call, "alltoall needs a tensor of at least one dimension (its rows are sent)")
    mine = _alltoall_splits(tensor, splits, ps.size(), call)
    desc = (str(tensor.dtype), "rows x %s" % (tuple(tensor.shape[1:]),), tensor.device.type)
    # The received splits on the device of the splits given (Horovod's), else the CPU.
    where = splits.device if isinstance(splits, torch.Tensor) else torch.device("cpu")
    return _submit(ps, "alltoall", name, desc, lambda: _alltoall_ordered(tensor, mine, where, call), call)


def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set):
    """Starts an alltoall; synchronize(handle) returns (output, received
    splits)."""
    return _alltoall_submit(tensor, splits, name, process_set, _call("alltoall_async", name))


class _AlltoallFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, name, ps):
        out, received = synchronize(_alltoall_submit(tensor, splits, name, ps, _call("alltoall", name)))
        ctx.received, ctx.ps = received, ps
        ctx.mark_non_differentiable(received)
        return out, received

    @staticmethod
    def backward(ctx, grad, unused):
        back, _ = synchronize(_alltoall_submit(grad.contiguous(), ctx.received, None, ctx.ps, "alltoall gradient"))
        return back, None, None, None


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Sends rows of tensor to every rank: splits[p] rows (in order) to rank
    p (None: equal shares). Returns the rows received, in rank order, and,
    when splits is given, how many came from each rank (Horovod's form).
    Differentiable: the gradient goes back by the reverse alltoall."""
    out, received = _AlltoallFn.apply(tensor, splits, name, process_set)
    return out if splits is None else (out, received)


# ---- sparse ---------------------------------------------------------------------------


def sparse_allreduce_async(tensor, name=None, op=Average, process_set=global_process_set):
    """Horovod's sparse allreduce: the ranks' sparse COO tensors summed (or
    averaged) by allgathering their indices and values. Returns a function
    that waits and returns the (coalesced) sparse result."""
    call = _call("sparse_allreduce_async", name)
    ps = _controller.resolve(process_set, call)
    if not isinstance(tensor, torch.Tensor) or not tensor.is_sparse:
        raise _invalid(call, "expected a sparse COO tensor (torch.sparse_coo_tensor or .to_sparse())")
    if op not in (Sum, Average):
        raise _invalid(call, "sparse_allreduce_async supports op=Sum and op=Average, got %r" % (op,))
    t = tensor.coalesce()
    values = t.values().contiguous()
    indices = t.indices().t().contiguous()
    h_values = allgather_async(values, _member_name(name, 0) if name else None, ps)
    h_indices = allgather_async(indices, _member_name(name, 1) if name else None, ps)

    def finish():
        v, i = synchronize(h_values), synchronize(h_indices)
        if op == Average:
            v = v / ps.size()
        return torch.sparse_coo_tensor(i.t(), v, tensor.shape).coalesce()
    return finish


# ---- what this tide has ---------------------------------------------------------------
# Answered truthfully: tide has its own transports (shared memory, TCP) and
# optionally MPI; it has no NCCL, Gloo, oneCCL, DDL or ROCm backend, and
# stages CUDA tensors through host memory (cuda_built: False, as Horovod
# answers for a build without GPU operations).
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
