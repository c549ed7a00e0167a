"""The job's communicator and the collectives on torch tensors: CPU
tensors directly, CUDA tensors staged through pinned host memory in pieces
(_cuda.py)."""
import atexit
import contextlib
import ctypes
import errno
import io
import threading
import weakref

import torch

from .. import _lib
from .._lib import lib
from . import _cuda

# Reduction ops, as Horovod names them. Adasum is not a tide_op_t: it has its
# own call (tide_adasum_allreduce).
Sum = _lib.SUM
Average = _lib.AVG
Min = _lib.MIN
Max = _lib.MAX
Adasum = 100
_OP_NAMES = {Sum: "Sum", Average: "Average", Min: "Min", Max: "Max", Adasum: "Adasum"}

_DTYPES = {torch.float32: _lib.F32, torch.float64: _lib.F64, torch.int32: _lib.I32, torch.int64: _lib.I64,
           torch.float16: _lib.F16, torch.bfloat16: _lib.BF16}

_comm = None  # ctypes.c_void_p of the tide_comm_t, once init() ran
_on_shutdown = []  # called first by shutdown() (named requests still pending run)
_on_reset = []  # called by init() and shutdown() (the process sets and named requests go)
_active = None  # a process set's sub-communicator while its collectives run (using())
_in_flight = weakref.WeakSet()  # Handles whose request the library still holds; shutdown() waits for them

# A communicator's calls are made from one thread at a time, in the same
# order on every rank (include/tide.h). Two Python threads issuing
# collectives at once would interleave differently on each rank, so the
# second is refused with an error naming both; one thread may nest calls.
_busy = threading.RLock()
_busy_call = [None, None]  # the thread inside, and its call


def _invalid(call, message):
    return _lib.error(-errno.EINVAL, message, call)


@contextlib.contextmanager
def one_thread(call):
    """Held around every call that communicates: refuses (InvalidArgumentError)
    a second thread while another is inside one."""
    if not _busy.acquire(blocking=False):
        thread, other = _busy_call
        raise _invalid(call, "thread %r called %s while thread %r is inside %s: tide.torch's collectives "
                       "must be issued by one thread at a time, in the same order on every rank (use one "
                       "thread for them, or a lock of your own around each)"
                       % (threading.current_thread().name, call, thread, other))
    outer = _busy_call[:]
    if outer[0] is None:
        _busy_call[:] = [threading.current_thread().name, call]
    try:
        yield
    finally:
        _busy_call[:] = outer
        _busy.release()


def init():
    """Joins the job the environment describes (tiderun, mpirun, srun, or
    none: a one-rank job). Collective; a second call does nothing."""
    global _comm
    if _comm is not None:
        return
    _lib.load_global_for_mpi()
    comm = ctypes.c_void_p()
    _lib.check(lib.tide_comm_init(ctypes.byref(comm)), "tide.torch.init")
    _comm = comm
    for reset in _on_reset:
        reset()
    atexit.register(shutdown)


def shutdown():
    """Leaves the job (not collective). Waits first for the nonblocking calls
    still in flight (their handles then return their output, or raise the
    error they ended with). init() may be called again after."""
    global _comm
    if _comm is not None:
        with one_thread("shutdown"):
            for drain in _on_shutdown:
                drain()
            for h in list(_in_flight):
                h._finish_request()
            for reset in _on_reset:
                reset()
            comm, _comm = _comm, None
            lib.tide_comm_destroy(comm)


def is_initialized():
    return _comm is not None


def _c(call="tide.torch"):
    if _comm is None:
        raise _lib.error(-errno.EINVAL, "tide.torch.init() has not been called", call)
    return _active if _active is not None else _comm


@contextlib.contextmanager
def using(comm):
    """Runs the collectives (and rank()/size()) of the block on comm, a
    process set's sub-communicator, instead of the job's."""
    global _active
    outer, _active = _active, comm
    try:
        yield
    finally:
        _active = outer


def comm_handle():
    """The tide_comm_t pointer (an int), for code that calls libtide itself."""
    return _c().value


def rank():
    return lib.tide_comm_rank(_c("rank"))


def size():
    return lib.tide_comm_size(_c("size"))


def local_rank():
    return lib.tide_comm_local_rank(_c("local_rank"))


def local_size():
    return lib.tide_comm_local_size(_c("local_size"))


def cross_rank():
    """Index of this host among the job's hosts."""
    return lib.tide_comm_node(_c("cross_rank"))


def cross_size():
    return lib.tide_comm_node_count(_c("cross_size"))


def compute_threads():
    """tide's default compute threads for this rank (its CPUs when bound by
    tiderun, else shared among the local ranks): what torch.set_num_threads
    should get."""
    n = ctypes.c_int()
    _lib.check(lib.tide_compute_threads(_comm, ctypes.byref(n)), "compute_threads")
    return n.value


def _fail(rc, call):
    return _lib.comm_error(_active if _active is not None else _comm, rc, call)


def _check_tensor(t, call, dtypes=None):
    """tide's dtype of t after checking it is a contiguous CPU or CUDA tensor."""
    if not isinstance(t, torch.Tensor):
        raise _invalid(call, "expected a torch.Tensor, got %s" % type(t).__name__)
    if t.device.type not in ("cpu", "cuda"):
        raise _invalid(call, "tensor is on %s; tide.torch exchanges CPU and CUDA tensors (move it with .cpu())"
                       % t.device)
    if t.is_sparse or t.layout != torch.strided:
        raise _invalid(call, "tensor layout %s is not supported (dense tensors only)" % t.layout)
    if not t.is_contiguous():
        raise _invalid(call, "tensor of shape %s is not contiguous; call .contiguous() first" % (tuple(t.shape),))
    allowed = dtypes or _DTYPES
    if t.dtype not in allowed:
        raise _invalid(call, "dtype %s is not supported; use one of %s" %
                       (t.dtype, ", ".join(str(d) for d in allowed)))
    return _DTYPES.get(t.dtype)


def _check_op(op, call):
    if op not in _OP_NAMES:
        raise _invalid(call, "op must be tide.torch.Average, Sum, Min, Max or Adasum, got %r" % (op,))


class Handle:
    """A nonblocking collective in flight. It keeps the tensors it borrows
    alive until synchronize(); dropping an unfinished handle waits for it."""

    def __init__(self, req, keep, output, call, finish=None, staged=None):
        self._staged = staged  # a CUDA tensor's pieces (_cuda.Staged)
        self._req = req
        self._keep = keep
        self.output = output
        self.call = call
        self._finish = finish
        self._error = None  # the error of a request shutdown() waited for
        if req is not None or staged is not None:
            _in_flight.add(self)

    def _finish_request(self):
        """shutdown(): completes the request while the communicator exists,
        keeping its output or error for wait()."""
        try:
            self.wait()
        except _lib.TideError as e:
            self._error = e

    def poll(self):
        with one_thread(self.call):
            if self._staged is not None:
                return self._staged.poll()
            if self._req is None:
                return True
            done = ctypes.c_int()
            rc = lib.tide_test(self._req, ctypes.byref(done))
            if rc < 0:
                raise _fail(rc, self.call)
            return bool(done.value)

    def wait(self):
        with one_thread(self.call):
            if self._staged is not None:
                staged, self._staged = self._staged, None
                _in_flight.discard(self)
                self.output = staged.wait()
                return self.output
            if self._req is not None:
                req, self._req = self._req, None
                _in_flight.discard(self)
                rc = lib.tide_wait(req)
                self._keep = None
                if rc < 0:
                    raise _fail(rc, self.call)
                if self._finish is not None:
                    self.output = self._finish(self.output)
            if self._error is not None:
                raise self._error
            return self.output

    def __del__(self):
        # shutdown() completes every request in flight before the communicator
        # goes, so one left here belongs to a live communicator: the library
        # still holds the buffers, so wait for it.
        if getattr(self, "_staged", None) is not None:
            self._staged.abandon()
            self._staged = None
        if getattr(self, "_req", None) is not None:
            lib.tide_wait(self._req)
            self._req = None


def _ptr(t):
    return ctypes.c_void_p(t.data_ptr())


def _start_allreduce(sendbuf, recvbuf, op, call):
    with one_thread(call):
        return _start_allreduce_locked(sendbuf, recvbuf, op, call)


def _start_allreduce_locked(sendbuf, recvbuf, op, call):
    dtype = _check_tensor(sendbuf, call)
    _check_op(op, call)
    comm = _c(call)
    if op == Adasum and dtype not in (_lib.F32, _lib.F64):
        raise _invalid(call, "Adasum needs float32 or float64 tensors, got %s" % sendbuf.dtype)
    if sendbuf.is_cuda:
        def start(piece):
            req = ctypes.c_void_p()
            if op == Adasum:
                rc = lib.tide_iadasum_allreduce(comm, _ptr(piece), _ptr(piece), piece.numel(), dtype, None, 0,
                                                ctypes.byref(req))
            else:
                rc = lib.tide_iallreduce(comm, _ptr(piece), _ptr(piece), piece.numel(), dtype, op, ctypes.byref(req))
            if rc < 0:
                raise _fail(rc, call)
            return req
        staged = _cuda.Staged(sendbuf, recvbuf, start, call, _fail, elementwise=op != Adasum)
        return Handle(None, None, recvbuf, call, staged=staged)
    req = ctypes.c_void_p()
    n = sendbuf.numel()
    if op == Adasum:
        rc = lib.tide_iadasum_allreduce(comm, _ptr(sendbuf), _ptr(recvbuf), n, dtype, None, 0, ctypes.byref(req))
    else:
        rc = lib.tide_iallreduce(comm, _ptr(sendbuf), _ptr(recvbuf), n, dtype, op, ctypes.byref(req))
    if rc < 0:
        raise _fail(rc, call)
    return Handle(req, (sendbuf, recvbuf), recvbuf, call)


def allreduce_async(tensor, op=Average, name=None):
    """Starts an allreduce of tensor into a new tensor; synchronize(handle)
    returns it. tensor must not change until then."""
    call = "allreduce(%s)" % name if name else "allreduce"
    return _start_allreduce(tensor, torch.empty_like(tensor), op, call)


def allreduce_async_(tensor, op=Average, name=None):
    """In-place form of allreduce_async."""
    call = "allreduce_(%s)" % name if name else "allreduce_"
    return _start_allreduce(tensor, tensor, op, call)


def allreduce(tensor, op=Average, name=None):
    """The sum, mean (Average, the default), min, max or Adasum of tensor over
    all ranks, as a new tensor."""
    return synchronize(allreduce_async(tensor, op, name))


def allreduce_(tensor, op=Average, name=None):
    return synchronize(allreduce_async_(tensor, op, name))


def synchronize(handle):
    """Waits for a nonblocking call; returns its output tensor."""
    return handle.wait()


def poll(handle):
    """True when the nonblocking call has completed."""
    return handle.poll()


def allgather(tensor, name=None):
    """Every rank's tensor concatenated along dimension 0, in rank order.
    Ranks may differ in their first dimension; the others must agree."""
    call = "allgather(%s)" % name if name else "allgather"
    with one_thread(call):
        return _allgather_locked(tensor, name, call)


def _allgather_locked(tensor, name, call):
    dtype = _check_tensor(tensor, call)
    if tensor.is_cuda:  # staged as a whole: the ranks' sizes differ
        return allgather(_cuda.to_host(tensor), name).to(tensor.device)
    comm = _c(call)
    t = tensor.reshape(1) if tensor.dim() == 0 else tensor
    row = t[0].numel() if t.shape[0] > 0 else int(torch.tensor(t.shape[1:]).prod().item())
    n = size()
    shapes = torch.zeros(2 * n, dtype=torch.int64)
    mine = torch.tensor([t.shape[0], row], dtype=torch.int64)
    rc = lib.tide_allgather(comm, _ptr(mine), _ptr(shapes), 2, _lib.I64)
    if rc < 0:
        raise _fail(rc, call)
    rows = shapes[0::2].tolist()
    widths = set(shapes[1::2].tolist())
    if len(widths) != 1:
        raise _invalid(call, "ranks' tensors differ beyond dimension 0 (elements per row: %s)" %
                       shapes[1::2].tolist())
    counts = (ctypes.c_size_t * n)(*[r * row for r in rows])
    out = torch.empty((sum(rows),) + tuple(t.shape[1:]), dtype=t.dtype)
    rc = lib.tide_allgatherv(comm, _ptr(t), t.numel(), _ptr(out), counts, dtype)
    if rc < 0:
        raise _fail(rc, call)
    return out


def broadcast_async_(tensor, root_rank=0, name=None):
    call = "broadcast_(%s)" % name if name else "broadcast_"
    with one_thread(call):
        return _broadcast_async_locked(tensor, root_rank, call)


def _broadcast_async_locked(tensor, root_rank, call):
    dtype = _check_tensor(tensor, call)
    comm = _c(call)
    if tensor.is_cuda:
        def start(piece):
            req = ctypes.c_void_p()
            rc = lib.tide_ibroadcast(comm, _ptr(piece), piece.numel(), dtype, root_rank, ctypes.byref(req))
            if rc < 0:
                raise _fail(rc, call)
            return req
        return Handle(None, None, tensor, call, staged=_cuda.Staged(tensor, tensor, start, call, _fail))
    req = ctypes.c_void_p()
    rc = lib.tide_ibroadcast(comm, _ptr(tensor), tensor.numel(), dtype, root_rank, ctypes.byref(req))
    if rc < 0:
        raise _fail(rc, call)
    return Handle(req, (tensor,), tensor, call)


def broadcast_(tensor, root_rank=0, name=None):
    """Overwrites tensor with root_rank's, in place."""
    return synchronize(broadcast_async_(tensor, root_rank, name))


def broadcast(tensor, root_rank=0, name=None):
    """root_rank's tensor, as a new tensor."""
    return broadcast_(tensor.clone(), root_rank, name)


def barrier():
    with one_thread("barrier"):
        rc = lib.tide_barrier(_c("barrier"))
    if rc < 0:
        raise _fail(rc, "barrier")


def broadcast_parameters(params, root_rank=0):
    """Overwrites every tensor of params (a state_dict, named_parameters(),
    or an iterable of tensors) with root_rank's, in place."""
    if isinstance(params, dict):
        items = list(params.items())
    else:
        items = [(None, p) if isinstance(p, torch.Tensor) else tuple(p) for p in params]
    handles = []
    with torch.no_grad():
        for name, p in items:
            if isinstance(p, torch.Tensor):
                handles.append(broadcast_async_(p.data, root_rank, name))
    for h in handles:
        h.wait()


def pack_object(obj):
    """obj's torch.save bytes in an int32 tensor (zero-padded to whole
    words), and their count."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    data = buf.getvalue()
    words = torch.zeros((len(data) + 3) // 4, dtype=torch.int32)
    ctypes.memmove(words.data_ptr(), data, len(data))
    return words, len(data)


def unpack_object(words, nbytes, at=0):
    """The object whose nbytes bytes start at word `at` of words."""
    return torch.load(io.BytesIO(ctypes.string_at(words.data_ptr() + at * 4, nbytes)))


def broadcast_object_with(obj, is_root, broadcast_in_place):
    """root's obj on every rank: its length, then its bytes, each through
    broadcast_in_place(tensor, part) ("sz", "t")."""
    if is_root:
        words, nbytes = pack_object(obj)
        broadcast_in_place(torch.tensor([nbytes], dtype=torch.int64), "sz")
        broadcast_in_place(words, "t")
        return obj
    length = torch.zeros(1, dtype=torch.int64)
    broadcast_in_place(length, "sz")
    nbytes = int(length.item())
    words = torch.zeros((nbytes + 3) // 4, dtype=torch.int32)
    broadcast_in_place(words, "t")
    return unpack_object(words, nbytes)


def broadcast_object(obj, root_rank=0, name=None):
    """root_rank's obj (anything torch.save takes), on every rank."""
    call = "broadcast_object(%s)" % name if name else "broadcast_object"
    return broadcast_object_with(obj, rank() == root_rank, lambda t, part: broadcast_(t, root_rank, call))


def broadcast_optimizer_state(optimizer, root_rank=0, model=None):
    """Gives every rank root_rank's optimizer state and hyperparameters
    (optimizer.state_dict(), loaded on the other ranks). model is accepted
    for Horovod's signature and not needed: the whole state_dict travels,
    so state that does not exist yet needs no step to create it."""
    state = broadcast_object(optimizer.state_dict(), root_rank, "optimizer state")
    if rank() != root_rank:
        optimizer.load_state_dict(state)


