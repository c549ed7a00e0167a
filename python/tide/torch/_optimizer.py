"""DistributedOptimizer: gradient hooks start bucketed nonblocking
allreduces during backward; step() waits for them, then updates.

Each bucket is one flat tensor, and every parameter's .grad is a view into
its bucket, so autograd accumulates straight into the buffer the allreduce
sends: no copy in, no copy out. Buckets are filled in reverse parameter
order (the order backward produces gradients), at most bucket_bytes each.
"""
import contextlib
import ctypes
import time
import warnings

import torch

from .. import _lib
from .._lib import lib
from . import _comm, _controller, _cuda
from ._comm import Average, Sum, Adasum


class Compression:
    """Gradient compression for DistributedOptimizer. Compression.none sends
    gradients as they are; topk(density) sends each rank's largest-magnitude
    density share (TopK-AllGather) and hitopk(density) runs HiTopKComm
    (intra-host reduce-scatter, top-k of the host's sum across hosts). Both
    keep what they did not send in a residual added to the next step's
    gradient (error feedback). On CUDA parameters the selection runs on
    the GPU and the residual stays there: only the (value, index) pairs
    leave the device (hitopk's intra-host dense step goes through host
    memory first). With warmup_steps=W > 0 the density starts
    higher and falls to its target over the first W steps, as Deep Gradient
    Compression's warm-up does: step t < W uses density ** ((t + 1) / (W + 1))
    (tide-train's --sparse-warmup-epochs with a step for an epoch); a
    common choice is one epoch's steps."""

    class _Kind:
        def __init__(self, name, density=1.0, selector="sampled", warmup_steps=0):
            self.name = name
            self.density = density
            self.selector = selector
            self.warmup_steps = warmup_steps

        def density_at(self, step):
            """The density of step `step` (0-based), warm-up included."""
            w = self.warmup_steps
            return self.density ** ((step + 1.0) / (w + 1.0)) if step < w else self.density

        def compress(self, tensor):
            """Horovod's interface: (the tensor to send, what decompress needs)."""
            if self.name == "fp16" and tensor.is_floating_point() and tensor.dtype != torch.float16:
                return tensor.to(torch.float16), tensor.dtype
            return tensor, None

        def decompress(self, tensor, ctx):
            return tensor if ctx is None else tensor.to(ctx)

        @property
        def dense(self):
            """Exchanged by allreduce (none, fp16), not as top-k pairs."""
            return self.name in ("none", "fp16")

        def __repr__(self):
            if self.name in ("none", "fp16"):
                return "Compression." + self.name
            w = ", warmup_steps=%d" % self.warmup_steps if self.warmup_steps else ""
            return "Compression.%s(%g%s)" % (self.name, self.density, w)

    none = _Kind("none")
    # Horovod's Compression.fp16: floating-point tensors travel as float16
    # (half the bytes) and come back in their own dtype; no residual.
    fp16 = _Kind("fp16")

    @staticmethod
    def topk(density, selector="sampled", warmup_steps=0):
        Compression._check(density, warmup_steps, "topk")
        return Compression._Kind("topk", float(density), selector, warmup_steps)

    @staticmethod
    def hitopk(density, selector="sampled", warmup_steps=0):
        Compression._check(density, warmup_steps, "hitopk")
        return Compression._Kind("hitopk", float(density), selector, warmup_steps)

    @staticmethod
    def _check(density, warmup_steps, name):
        if isinstance(density, bool) or not (isinstance(density, (int, float)) and 0 < density <= 1):
            raise _comm._invalid("Compression.%s" % name, "density must be in (0, 1], got %r" % (density,))
        if isinstance(warmup_steps, bool) or not (isinstance(warmup_steps, int) and warmup_steps >= 0):
            raise _comm._invalid("Compression.%s" % name,
                                 "warmup_steps must be an integer >= 0, got %r" % (warmup_steps,))


class _Bucket:
    def __init__(self, params, names, dtype):
        self.params = params
        self.names = names
        self.dtype = dtype
        total = sum(p.numel() for p in params)
        self.flat = torch.zeros(total, dtype=dtype, device=params[0].device)
        self.views = []
        self.tensors = (_lib.Tensor * len(params))()  # Adasum combines each tensor on its own
        off = 0
        for i, p in enumerate(params):
            n = p.numel()
            self.views.append(self.flat[off:off + n].view_as(p))
            self.tensors[i].offset = off
            self.tensors[i].count = n
            off += n
        self.ready = 0
        self.handle = None
        self.half = None  # Compression.fp16: the float16 copy in flight


class _DistributedMixin:
    """The first base of the class DistributedOptimizer builds, before the
    wrapped optimizer's class (so isinstance and lr schedulers keep working).
    super() here is the next class in the instance's MRO: the optimizer's
    class, also when the user subclasses the result (super(self.__class__,
    self) named the subclass there and recursed)."""

    def __init__(self, params, named_parameters, compression, op, backward_passes_per_step, bucket_bytes,
                 measure_overlap, gradient_predivide_factor=1.0, groups=None, sparse_as_dense=False,
                 process_set=None):
        super().__init__(params)
        call = "DistributedOptimizer"
        _comm._c(call)
        ps = _controller.global_process_set if process_set is None else process_set
        if not isinstance(ps, _controller.ProcessSet) or ps.process_set_id is None:
            raise _comm._invalid(call, "process_set must be a registered tide.torch.ProcessSet, got %r"
                                 % (process_set,))
        # Horovod's process_set: the gradients are combined over its ranks only;
        # a rank outside it updates with its own gradients.
        self._process_set = ps
        self._local_only = not ps.included()
        self._set_comm = None if ps.ranks is None or self._local_only else ps._comm_handle(call)
        self._sparse_as_dense = bool(sparse_as_dense)
        self._sparse = set()  # ids of the parameters whose gradients came sparse (nn.Embedding(sparse=True))
        _comm._check_op(op, call)
        if op in (_comm.Min, _comm.Max):
            raise _comm._invalid(call, "op must be Average, Sum or Adasum for gradients")
        if not isinstance(compression, Compression._Kind):
            raise _comm._invalid(call, "compression must be Compression.none, .fp16, .topk(d) or .hitopk(d)")
        if compression.name != "none" and op == Adasum:
            raise _comm._invalid(call, "Adasum cannot be combined with %r" % compression)
        if not (isinstance(backward_passes_per_step, int) and backward_passes_per_step >= 1):
            raise _comm._invalid(call, "backward_passes_per_step must be an integer >= 1")
        if bucket_bytes <= 0:
            raise _comm._invalid(call, "bucket_bytes must be > 0")
        f = gradient_predivide_factor
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not f > 0:
            raise _comm._invalid(call, "gradient_predivide_factor must be a number > 0, got %r" % (f,))
        if f != 1.0 and (op != Average or not compression.dense):
            raise _comm._invalid(call, "gradient_predivide_factor != 1 needs op=Average and Compression.none or "
                                 ".fp16 (got op %s, %r)" % (_comm._OP_NAMES[op], compression))
        self._predivide = float(f)
        self._op = op
        self._compression = compression
        self._passes = backward_passes_per_step
        self._measure_overlap = measure_overlap

        params = [p for g in self.param_groups for p in g["params"] if p.requires_grad]
        names = {}
        if named_parameters is not None:
            named = list(named_parameters)
            for n, p in named:
                if id(p) in names:
                    raise _comm._invalid(call, "named_parameters lists a parameter twice (%s and %s)" %
                                         (names[id(p)], n))
                names[id(p)] = n
            missing = [i for i, p in enumerate(params) if id(p) not in names]
            if missing:
                raise _comm._invalid(call, "named_parameters does not name %d of the optimizer's parameters"
                                     % len(missing))
            order = {id(p): i for i, (_, p) in enumerate(named)}
            params.sort(key=lambda p: order[id(p)])
        for i, p in enumerate(params):
            names.setdefault(id(p), "param.%d" % i)
            _comm._check_tensor(p, "DistributedOptimizer(%s)" % names[id(p)])
        self._names = names
        self._parameter_names = {p: names[id(p)] for p in params}  # Horovod's attribute: parameter -> name

        # Buckets in backward order: last parameters first.
        self._buckets = []
        self._bucket_of = {}
        if not compression.dense:
            if any(p.dtype != torch.float32 for p in params):
                raise _comm._invalid(call, "%r needs float32 parameters" % compression)
            if len({p.device for p in params}) > 1:
                raise _comm._invalid(call, "%r needs every parameter on one device, got %s" %
                                     (compression, sorted(str(d) for d in {p.device for p in params})))
            groups = [list(reversed(params))]
        elif groups is not None:
            groups = self._user_groups(groups, params, names, call)
        else:
            groups, cur, cur_bytes = [], [], 0
            for p in reversed(params):
                nbytes = p.numel() * p.element_size()
                if cur and (cur[0].dtype != p.dtype or cur[0].device != p.device or
                            cur_bytes + nbytes > bucket_bytes):
                    groups.append(cur)
                    cur, cur_bytes = [], 0
                cur.append(p)
                cur_bytes += nbytes
            if cur:
                groups.append(cur)
        for g in groups:
            b = _Bucket(g, [names[id(p)] for p in g], g[0].dtype)
            for i, p in enumerate(g):
                self._bucket_of[id(p)] = (b, i)
                p.grad = b.views[i]
            self._buckets.append(b)

        self._delay = {id(p): self._passes for p in params}
        self._synchronized = False
        self._compressor = None
        self._probe = False
        self._steps = 0
        self._stats = {"steps": 0, "wait_s": 0.0, "probe_steps": 0, "probe_comm_s": 0.0}
        self._accumulators = []  # keep the grad accumulators (and so the hooks) alive
        for p in params:
            acc = p.expand_as(p).grad_fn.next_functions[0][0]
            acc.register_hook(self._make_hook(p))
            self._accumulators.append(acc)
            p.register_hook(self._make_sparse_hook(p))

    @staticmethod
    def _user_groups(groups, params, names, call):
        """Horovod's groups: an int k (the parameters in k buckets of about
        equal count) or lists of parameters (one bucket each; the rest one
        bucket per parameter). A bucket holds one dtype on one device."""
        rev = list(reversed(params))
        if isinstance(groups, int) and not isinstance(groups, bool):
            if groups < 1:
                raise _comm._invalid(call, "groups (num_groups) must be >= 1, got %d" % groups)
            k = min(groups, len(rev))
            out = [rev[len(rev) * i // k:len(rev) * (i + 1) // k] for i in range(k)]
        elif isinstance(groups, (list, tuple)):
            known = {id(p) for p in params}
            out, seen = [], set()
            for g in groups:
                g = [p for p in g]
                if not g or any(id(p) not in known or id(p) in seen for p in g):
                    raise _comm._invalid(call, "groups must be lists of the optimizer's parameters, each at most "
                                         "once, none empty")
                seen.update(id(p) for p in g)
                out.append(g)
            out += [[p] for p in rev if id(p) not in seen]
        else:
            raise _comm._invalid(call, "groups must be an int or a list of lists of parameters, got %r" % (groups,))
        for g in out:
            if len({(p.dtype, p.device) for p in g}) > 1:
                raise _comm._invalid(call, "a group mixes dtypes or devices: %s" % [names[id(p)] for p in g])
        return [g for g in out if g]

    def _make_sparse_hook(self, p):
        def hook(grad):
            if grad.is_sparse:  # accumulated into the dense bucket view; given back sparse after the exchange
                self._sparse.add(id(p))
        return hook

    def _make_hook(self, p):
        def hook(*unused):
            key = id(p)
            if self._delay[key] <= 0:
                raise _comm._invalid("DistributedOptimizer", "gradient of %s computed more than "
                                     "backward_passes_per_step=%d times before step()" %
                                     (self._names[key], self._passes))
            self._delay[key] -= 1
            if self._delay[key] == 0:
                b, i = self._bucket_of[key]
                self._adopt(p, b, i)
                b.ready += 1
                if b.ready == len(b.params) and not self._probe and self._compression.dense:
                    self._launch(b)
        return hook

    @staticmethod
    def _adopt(p, b, i):
        """Makes p.grad the bucket's view again (after a zero_grad that set
        it to None, or a user who assigned .grad)."""
        v = b.views[i]
        g = p.grad
        if g is None:
            v.zero_()
        elif g.data_ptr() != v.data_ptr():
            v.copy_(g)
        if g is not v:
            p.grad = v

    def _launch(self, b):
        if self._local_only:
            return
        with _comm.one_thread("DistributedOptimizer allreduce"), _comm.using(self._set_comm):
            self._launch_locked(b)

    def _launch_locked(self, b):
        comm = _comm._c()
        dtype = _comm._DTYPES[b.dtype]
        call = "DistributedOptimizer allreduce of %s" % ",".join(b.names)
        flat, op = b.flat, self._op
        if self._predivide != 1.0:  # Horovod's gradient_predivide_factor: sum of grad / f, then * f / size
            flat.mul_(1.0 / self._predivide)
            op = Sum
        if self._compression.name == "fp16" and flat.is_floating_point() and flat.dtype != torch.float16:
            b.half = flat = flat.to(torch.float16)
            dtype = _lib.F16
        def start(t):  # the allreduce of t in place, started
            r = ctypes.c_void_p()
            p = ctypes.c_void_p(t.data_ptr())
            if self._op == Adasum:
                rc = lib.tide_iadasum_allreduce(comm, p, p, t.numel(), dtype, b.tensors, len(b.params), ctypes.byref(r))
            else:
                rc = lib.tide_iallreduce(comm, p, p, t.numel(), dtype, op, ctypes.byref(r))
            if rc < 0:
                raise _comm._fail(rc, call)
            return r
        if flat.is_cuda:  # staged through pinned host memory, in pieces unless Adasum
            staged = _cuda.Staged(flat, flat, start, call, _comm._fail, elementwise=self._op != Adasum)
            b.handle = _comm.Handle(None, None, flat, call, staged=staged)
            return
        b.handle = _comm.Handle(start(flat), (flat,), flat, call)

    def _exchange_sparse(self, b):
        with _comm.one_thread("DistributedOptimizer sparse exchange"):
            self._exchange_sparse_locked(b)

    def _exchange_sparse_locked(self, b):
        comm = _comm._c()
        d = b.flat.numel()
        ptr = ctypes.c_void_p(b.flat.data_ptr())
        call = "DistributedOptimizer %r" % self._compression
        kind = ctypes.c_int()
        _lib.check(lib.tide_topk_parse(self._compression.selector.encode(), ctypes.byref(kind)), call)
        density = self._compression.density_at(self._steps)
        if self._compressor is None:
            n = d
            if self._compression.name == "hitopk":
                off, ln = ctypes.c_size_t(), ctypes.c_size_t()
                rc = lib.tide_hitopk_shard(comm, d, ctypes.byref(off), ctypes.byref(ln))
                if rc < 0:
                    raise _comm._fail(rc, call)
                n = ln.value
            c = ctypes.c_void_p()
            # Created at the first step's density, the highest: the pair
            # buffers then hold every later step's k.
            if b.flat.is_cuda:  # residual and selection on the GPU
                torch.cuda.set_device(b.flat.device)
                rc = lib.tide_compressor_create_gpu(kind.value, density, n, None,
                                                    ctypes.c_void_p(_cuda.stream_handle(b.flat.device)),
                                                    ctypes.byref(c))
                if rc < 0:
                    raise _cuda.gpu_error(call) or _lib.error(rc, None, call)
                self._dense_host = torch.empty(d, dtype=torch.float32, pin_memory=True)
            else:
                _lib.check(lib.tide_compressor_create(kind.value, density, _lib.TOPK_GLOBAL, None, 0,
                                                      n, None, ctypes.byref(c)), call)
            self._compressor = c
            self._density = density
            k = lib.tide_compressor_k(c)
            self._values = torch.empty(k, dtype=torch.float32)
            self._indices = torch.empty(k, dtype=torch.int32)
        elif density != self._density:
            _lib.check(lib.tide_compressor_set_density(self._compressor, density), call)
            self._density = density
        op = _lib.AVG if self._op == Average else _lib.SUM
        host = ptr
        if b.flat.is_cuda:  # the dense result comes back through a pinned buffer
            host = ctypes.c_void_p(self._dense_host.data_ptr())
        if self._compression.name == "hitopk":
            if b.flat.is_cuda:  # the intra-host dense reduce-scatter needs the gradient in host memory
                self._dense_host.copy_(b.flat, non_blocking=True)
                torch.cuda.current_stream(b.flat.device).synchronize()
            rc = lib.tide_hitopk_allreduce(comm, host, host, d, self._compressor, op)
            if rc < 0:
                raise _comm._fail(rc, call)
            if b.flat.is_cuda:
                b.flat.copy_(self._dense_host, non_blocking=True)
            return
        k = ctypes.c_size_t()
        rc = lib.tide_compressor_compress(self._compressor, ptr, d, ctypes.c_void_p(self._values.data_ptr()),
                                          ctypes.c_void_p(self._indices.data_ptr()), ctypes.byref(k))
        if rc < 0:
            msg = lib.tide_compressor_last_error(self._compressor)
            raise _lib.error(rc, msg.decode() if msg else None, call)
        rc = lib.tide_sparse_allgather(comm, ctypes.c_void_p(self._values.data_ptr()),
                                       ctypes.c_void_p(self._indices.data_ptr()), k.value, host, d, op)
        if rc < 0:
            raise _comm._fail(rc, call)
        if b.flat.is_cuda:
            b.flat.copy_(self._dense_host, non_blocking=True)

    def synchronize(self):
        """Waits for every bucket's exchange (starting those whose hooks did
        not all run: parameters unused this step count as zero gradients).
        Afterwards each .grad holds the combined gradient."""
        if self._synchronized:
            return
        t0 = time.perf_counter()
        for b in self._buckets:
            if b.handle is None:
                for i, p in enumerate(b.params):
                    if self._delay[id(p)] > 0:
                        self._adopt(p, b, i)
                if self._compression.dense:
                    self._launch(b)
                elif not self._local_only:
                    with _comm.using(self._set_comm):
                        self._exchange_sparse(b)
        for b in self._buckets:
            if b.handle is not None:
                h, b.handle = b.handle, None
                h.wait()
                if b.half is not None:  # Compression.fp16: back into the gradients' dtype
                    b.flat.copy_(b.half)
                    b.half = None
                if self._predivide != 1.0:
                    b.flat.mul_(self._predivide / self._process_set.size())
        dt = time.perf_counter() - t0
        key = "probe" if self._probe else ""
        if key:
            self._stats["probe_steps"] += 1
            self._stats["probe_comm_s"] += dt
        else:
            self._stats["steps"] += 1
            self._stats["wait_s"] += dt
        for b in self._buckets:
            b.ready = 0
            for i, p in enumerate(b.params):
                if id(p) in self._sparse:  # sparse in, sparse out (the optimizer may need it: SparseAdam)
                    p.grad = b.views[i].to_sparse()
        for k in self._delay:
            self._delay[k] = self._passes
        self._synchronized = True

    @contextlib.contextmanager
    def skip_synchronize(self):
        """Horovod's: step() inside does not call synchronize(); call
        synchronize() yourself first (to clip the combined gradients, say)."""
        self._skip_sync = True
        try:
            yield
        finally:
            self._skip_sync = False

    def step(self, closure=None):
        if not getattr(self, "_skip_sync", False):
            if self._synchronized:
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() context after "
                              "optimizer.synchronize(): step() does not exchange again, but wrap it in "
                              "`with optimizer.skip_synchronize():` to say so (as Horovod asks)")
            self.synchronize()
        elif any(b.handle is not None for b in self._buckets):
            raise _comm._invalid("step", "step() inside skip_synchronize() while allreduces are in flight: call "
                                 "synchronize() first")
        loss = super().step(closure)
        self._synchronized = False
        self._steps += 1
        # With measure_overlap, every 10th step from the 3rd defers its
        # exchange to step(): that step's wait is the exchange's whole time.
        self._probe = self._measure_overlap and self._steps >= 3 and self._steps % 10 == 0
        return loss

    def zero_grad(self, set_to_none=False):
        """Zeroes the gradient buckets (the .grad views stay; set_to_none is
        ignored: the buckets are the gradients' storage)."""
        if any(b.handle is not None for b in self._buckets):
            raise _comm._invalid("zero_grad", "allreduces are in flight: call step() or synchronize() first")
        for b in self._buckets:
            b.flat.zero_()
            for i, p in enumerate(b.params):
                if p.grad is not b.views[i]:
                    p.grad = b.views[i]

    def _abandon_exchanges(self):
        """Elastic recovery (tide.torch.elastic): forgets a half-done step,
        whose exchanges ended with the failed communicator, so that the next
        backward starts its buckets afresh on the new one."""
        for b in self._buckets:
            h, b.handle, b.half, b.ready = b.handle, None, None, 0
            if h is not None:
                try:
                    h.wait()
                except _lib.TideError:
                    pass
        for k in self._delay:
            self._delay[k] = self._passes
        self._synchronized = False

    def overlap_report(self):
        """Exchange time per step that backward did not hide, and the share
        of it that was hidden: 1 - wait / probe, where wait is step()'s mean
        wait for the exchange after backward and probe the mean time of the
        same exchange on the probe steps (measure_overlap=True: every 10th
        step starts it only in step(), so nothing hides it)."""
        s = dict(self._stats)
        s["wait_mean_s"] = s["wait_s"] / s["steps"] if s["steps"] else float("nan")
        s["probe_mean_s"] = s["probe_comm_s"] / s["probe_steps"] if s["probe_steps"] else float("nan")
        if s["probe_steps"] and s["steps"] and s["probe_mean_s"] > 0:
            s["hidden_share"] = max(0.0, 1.0 - s["wait_mean_s"] / s["probe_mean_s"])
        else:
            s["hidden_share"] = float("nan")
        s["buckets"] = len(self._buckets)
        return s

    def __del__(self):
        c = getattr(self, "_compressor", None)
        if c is not None:
            lib.tide_compressor_destroy(c)
            self._compressor = None


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none, op=Average,
                         backward_passes_per_step=1, bucket_bytes=1 << 20, measure_overlap=False,
                         gradient_predivide_factor=1.0, num_groups=0, groups=None, sparse_as_dense=False,
                         process_set=None):
    """Wraps a torch optimizer so that step() applies the gradient averaged
    (op=Average), summed (Sum) or Adasum-combined (Adasum) over all ranks.
    The exchange of a bucket of gradients starts as soon as backward has
    produced all of them (after backward_passes_per_step passes, whose
    gradients are summed locally), so it overlaps the rest of backward.
    Compression.topk/hitopk exchange in step(). Returns an optimizer of a
    subclass of optimizer's class; the original's state is not carried over
    (wrap before training, then broadcast_optimizer_state).
    gradient_predivide_factor=f (Horovod's; op=Average only) divides the
    gradients by f before the sum and multiplies the sum by f / size, so the
    result is the average either way; Compression.fp16 sends float16.
    Horovod's groups (an int, or lists of parameters; num_groups=k is
    groups=k) set the buckets instead of bucket_bytes; gradients that come
    sparse (nn.Embedding(sparse=True)) are exchanged dense and handed back
    sparse (sparse_as_dense either way: the same sum); process_set combines
    them over its ranks only (a rank outside it keeps its own)."""
    if isinstance(optimizer, _DistributedMixin):
        raise _comm._invalid("DistributedOptimizer", "the optimizer is already a DistributedOptimizer; wrap the "
                             "torch optimizer once")
    cls = type(optimizer.__class__.__name__, (_DistributedMixin, optimizer.__class__),
               {"__doc__": optimizer.__class__.__doc__})
    if num_groups and groups is None:
        groups = num_groups
    return cls(optimizer.param_groups, named_parameters, compression, op, backward_passes_per_step, bucket_bytes,
               measure_overlap, gradient_predivide_factor, groups, sparse_as_dense, process_set)


__all__ = ["Compression", "DistributedOptimizer", "Average", "Sum", "Adasum"]
