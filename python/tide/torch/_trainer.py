"""Trainer: tide's step API (tide_trainer_*) driving a torch model.

The model's parameters and gradients are moved into two flat float32
buffers (each parameter's .data and .grad become views into them), which
the trainer exchanges, measures, adapts and updates with its own optimizer.
The loop asks the trainer which samples to compute and hands back the loss:

    trainer = tide.torch.Trainer(model, dataset_size=len(ds), batch=64, epochs=5,
                                 lr=0.05, adapt="gns,adascale")
    for batch in trainer:                      # instead of the DataLoader
        if batch.count:
            x, y = ds[batch.indices]
            F.cross_entropy(model(x), y).backward()
        stats = trainer.step(loss)             # instead of optimizer.step()
"""
import ctypes

import numpy as np
import torch

from .. import _lib
from .._lib import lib
from ..schedule import lr_schedule
from . import _comm


class StepStats:
    """One step's figures (tide_step_stats_t): noise_scale, gain_ratio,
    lr, global_batch, compute_s, exchange_s, comm_share, throughput, ..."""

    def __init__(self, s):
        for name, _ in _lib.StepStats._fields_:
            setattr(self, name, getattr(s, name))
        self.exchange = lib.tide_exchange_name(s.exchange).decode()

    def as_dict(self):
        return dict(self.__dict__)

    def __repr__(self):
        return "StepStats(%s)" % ", ".join("%s=%r" % kv for kv in self.__dict__.items())


class Batch:
    """The micro-batch to compute: indices (int64 tensor of sample indices,
    maybe empty), micro of micro_count in this step, epoch, step."""

    def __init__(self, b):
        n = b.count
        if n:
            self.indices = torch.from_numpy(np.ctypeslib.as_array(b.indices, (n,)).astype(np.int64))
        else:
            self.indices = torch.empty(0, dtype=torch.int64)
        self.count = n
        self.micro = b.micro
        self.micro_count = b.micro_count
        self.epoch = b.epoch
        self.step = b.step


def _parse(fn, name, what):
    out = ctypes.c_int()
    _lib.check(fn(str(name).encode(), ctypes.byref(out)), "Trainer(%s=%r)" % (what, name))
    return out.value


class Trainer:
    """A tide trainer over model's parameters (all float32 CPU, the same on
    every rank after construction: rank 0's are broadcast). Collective."""

    def __init__(self, model, dataset_size, batch=64, epochs=1.0, optimizer="momentum", lr=0.05, momentum=None,
                 weight_decay=0.0, schedule="constant", warmup_epochs=0.0, final_lr=0.0, exchange="dense",
                 density=0.01, selector="sampled", sparse_warmup_epochs=0.0, adapt=None, max_batch=0, max_accum=16,
                 base_batch=0, seed=1, gns_decay=None, tensor_stats=False):
        call = "Trainer"
        comm = _comm._c(call)
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        for n, p in named:
            _comm._check_tensor(p, "Trainer(%s)" % n, dtypes={torch.float32: _lib.F32})
        total = sum(p.numel() for _, p in named)
        self.params = torch.zeros(total, dtype=torch.float32)
        self.grads = torch.zeros(total, dtype=torch.float32)
        self._tensors = (_lib.Tensor * len(named))()
        self._names = []
        off = 0
        with torch.no_grad():
            for i, (n, p) in enumerate(named):
                k = p.numel()
                self.params[off:off + k].copy_(p.data.reshape(-1))
                p.data = self.params[off:off + k].view_as(p)
                p.grad = self.grads[off:off + k].view_as(p)
                t = self._tensors[i]
                self._names.append(n.encode())
                t.name = self._names[-1]
                t.offset, t.count = off, k
                if 1 <= p.dim() <= 4:
                    t.ndim = p.dim()
                    for j, s in enumerate(p.shape):
                        t.shape[j] = s
                else:
                    t.ndim, t.shape[0] = 1, k
                off += k
        self._model_params = [p for _, p in named]
        _comm.broadcast_(self.params, 0, "Trainer parameters")

        cfg = _lib.TrainerConfig()
        lib.tide_trainer_config_default(ctypes.byref(cfg))
        cfg.dataset_size = int(dataset_size)
        cfg.seed = int(seed)
        cfg.batch = int(batch)
        cfg.max_batch = int(max_batch)
        cfg.max_accum = int(max_accum)
        cfg.epochs = float(epochs)
        kind = _parse(lib.tide_optim_parse, optimizer, "optimizer")
        lib.tide_optim_config_default(kind, ctypes.byref(cfg.optim))
        if momentum is not None:
            cfg.optim.momentum = float(momentum)
        cfg.optim.weight_decay = float(weight_decay)
        # The base batch and the schedule as tide-train sets them (one C definition each).
        m0 = ctypes.c_long(int(base_batch))
        if not base_batch:
            _lib.check(lib.tide_trainer_base_batch(comm, int(batch), ctypes.byref(m0)), call)
        cfg.base_batch = m0.value
        cfg.schedule = lr_schedule(schedule, lr, epochs, dataset_size, m0.value, warmup_epochs, final_lr)
        cfg.exchange = _parse(lib.tide_exchange_parse, exchange, "exchange")
        cfg.density = float(density)
        cfg.selector = _parse(lib.tide_topk_parse, selector, "selector")
        cfg.sparse_warmup_epochs = float(sparse_warmup_epochs)
        if gns_decay is not None:
            cfg.gns_decay = float(gns_decay)
        cfg.tensor_stats = 1 if tensor_stats else 0
        tr = ctypes.c_void_p()
        with _comm.one_thread(call):
            rc = lib.tide_trainer_create(comm, ctypes.byref(cfg), ctypes.c_void_p(self.params.data_ptr()),
                                         ctypes.c_void_p(self.grads.data_ptr()), total, self._tensors, len(named),
                                         ctypes.byref(tr))
        if rc < 0:
            raise _comm._fail(rc, call)
        self._tr = tr
        if adapt:
            rc = lib.tide_trainer_adapt(tr, adapt.encode())
            if rc < 0:
                raise self._error(rc, "Trainer(adapt=%r)" % adapt)
        self._batch = _lib.Batch()
        self._stats = _lib.StepStats()
        self.done = False

    def _error(self, rc, call):
        msg = lib.tide_trainer_last_error(self._tr) if self._tr else None
        if not msg:
            msg = lib.tide_comm_last_error(_comm._comm)
        return _lib.error(rc, msg.decode(errors="replace") if msg else None, call)

    def next(self):
        """The next micro-batch, or None when training is done. Collective."""
        with _comm.one_thread("Trainer.next"):
            rc = lib.tide_trainer_next(self._tr, ctypes.byref(self._batch))
        if rc < 0:
            raise self._error(rc, "Trainer.next")
        if self._batch.done:
            self.done = True
            return None
        return Batch(self._batch)

    def __iter__(self):
        while True:
            b = self.next()
            if b is None:
                return
            yield b

    def step(self, loss=0.0):
        """After backward of the micro-batch next() gave (the mean loss over
        it; any value when it was empty): accumulates, and on the step's last
        micro-batch exchanges, measures, adapts and updates. Zeroes the
        gradients for the next micro-batch. Returns StepStats (stepped = 1
        when an update ran)."""
        if isinstance(loss, torch.Tensor):
            loss = loss.item()
        with _comm.one_thread("Trainer.step"):
            rc = lib.tide_trainer_step(self._tr, float(loss), ctypes.byref(self._stats))
        if rc < 0:
            raise self._error(rc, "Trainer.step")
        self.grads.zero_()
        for p, (off, k) in zip(self._model_params, ((t.offset, t.count) for t in self._tensors)):
            if p.grad is None or p.grad.data_ptr() != self.grads.data_ptr() + 4 * off:
                p.grad = self.grads[off:off + k].view_as(p)  # a zero_grad(set_to_none) broke the view
        return StepStats(self._stats)

    @property
    def stats(self):
        """The last step's figures (tide_trainer_stats)."""
        return StepStats(lib.tide_trainer_stats(self._tr).contents)

    def close(self):
        if self._tr is not None:
            lib.tide_trainer_destroy(self._tr)
            self._tr = None

    def __del__(self):
        if getattr(self, "_tr", None) is not None:
            self.close()


def gns_estimate(b_small, b_big, sq_small, sq_big):
    """McCandlish et al.'s unbiased (|G|^2, tr(Sigma)) from two batch sizes'
    squared gradient norms (tide_gns_estimate)."""
    g, s = ctypes.c_double(), ctypes.c_double()
    _lib.check(lib.tide_gns_estimate(b_small, b_big, sq_small, sq_big, ctypes.byref(g), ctypes.byref(s)),
               "gns_estimate")
    return g.value, s.value


def adascale_gain(var, sqr, scale):
    """AdaScale's gain ratio (tide_adascale_gain)."""
    return lib.tide_adascale_gain(var, sqr, scale)
