"""tide.torch.elastic: Horovod Elastic's API (horovod.torch.elastic) on
tide's in-place elastic membership (docs/elastic.md, docs/torch.md "Elastic").

    import tide.torch as hvd
    hvd.init()
    state = hvd.elastic.TorchState(model, optimizer, epoch=1, batch=0)

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs + 1):
            ...
            state.commit()          # saves the state, then checks for a grow or shrink

    train(state)

Run under `tiderun --elastic --min-np N --max-np M`. When a collective fails
because a peer died (PeerError, which is HorovodInternalError; also a
timeout or an abort) the survivors restore their last commit; when the job
is asked to grow (workers wait to join) or shrink (`tide ctl resize`),
commit()/check_host_updates() raise HostsUpdatedInterrupt on every member at
the same commit. Either way run() then starts the next membership epoch in
place (tide_comm_resize: the survivors and the admitted joiners get a new
communicator; no process restarts), calls the reset callbacks, broadcasts
the state from rank 0 (always a member that was there before: the members
keep their rank order and joiners come last) and calls func again. A joiner
(started by tiderun with TIDE_ELASTIC_JOIN=1) is admitted in tide.torch.init()
and receives the state in run()'s first sync. A worker that a shrink leaves
out exits with status 0 (SystemExit), as a released tide-train worker does.
"""
import copy
import ctypes
import functools
import sys

import torch
import torch.utils.data

from .. import _lib
from .._lib import lib
from . import _comm
from ._comm import broadcast_parameters, broadcast_optimizer_state
from ._horovod import broadcast_object, HorovodInternalError  # noqa: F401 (Horovod's name, re-exported)
from ._optimizer import _DistributedMixin

# The failures a membership change recovers from: the communicator is dead
# for good (include/tide.h), the survivors go on without the lost peer.
_FATAL = (_lib.PeerError, _lib.TideTimeoutError, _lib.AbortedError)


class HostsUpdatedInterrupt(RuntimeError):
    """Raised by commit()/check_host_updates() on every member at the same
    commit when the job is to grow or shrink. skip_sync: the members' state
    needs no broadcast afterwards (a shrink: nobody new)."""

    def __init__(self, skip_sync=False):
        super().__init__("the job's membership is changing (%s)" % ("shrink" if skip_sync else "grow"))
        self.skip_sync = skip_sync


_next_size = [0]  # the size the pending HostsUpdatedInterrupt asked for (tide_comm_resize's size)


def _param(name):
    """An INT parameter as libtide's table holds it (default, or the valid
    environment value: tide_comm_init already refused a bad one)."""
    value = ctypes.c_int64()
    _lib.check(lib.tide_param_get(name.encode(), None, ctypes.byref(value)), "tide.torch.elastic (%s)" % name)
    return value.value


def is_elastic():
    """True when this job's membership can change (tiderun --elastic)."""
    return lib.tide_comm_epoch(_comm._c("is_elastic")) >= 0


def epoch():
    """The current membership epoch (0 at the start, +1 per change; -1 when
    the job is not elastic)."""
    return lib.tide_comm_epoch(_comm._c("epoch"))


def request(size):
    """Asks the job for `size` workers, as `tide ctl resize SIZE` does (0
    withdraws the request): tiderun starts the workers, and the members grow
    or shrink at their next commit. Any one member may call it."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise _comm._invalid("request", "size must be an integer >= 0, got %r" % (size,))
    comm = _comm._c("request")
    if lib.tide_comm_epoch(comm) < 0:
        raise _comm._invalid("request", "the job is not elastic: start it with tiderun --elastic")
    _lib.check(lib.tide_comm_elastic_request(comm, size), "tide.torch.elastic.request")


def pending():
    """(target, waiting): the workers asked for (0: none) and the workers
    waiting to join, as the job's store holds them now (no collective)."""
    target, waiting = ctypes.c_int(), ctypes.c_int()
    _lib.check(lib.tide_comm_elastic_status(_comm._c("pending"), ctypes.byref(target), ctypes.byref(waiting)),
               "tide.torch.elastic.pending")
    return target.value, waiting.value


def _decide():
    """Collective: rank 0 reads the job's requests and broadcasts the new
    size (the C trainer's rule, src/train/elastic.c): a target below the
    current size shrinks to it; waiting joiners grow the job up to the
    target (or TIDE_ELASTIC_MAX), clamped to [TIDE_ELASTIC_MIN, MAX]."""
    call = "check_host_updates"
    comm = _comm._c(call)
    n = _comm.size()
    if lib.tide_comm_epoch(comm) < 0:
        return n
    wire = torch.tensor([n], dtype=torch.int64)
    if _comm.rank() == 0:
        target, waiting = pending()
        lo, hi = _param("TIDE_ELASTIC_MIN"), _param("TIDE_ELASTIC_MAX")
        cap = min(max(target if target > 0 else hi, lo), hi)
        if cap < n:
            wire[0] = cap
        elif waiting > 0 and n < cap:
            wire[0] = min(n + waiting, cap)
    if n > 1:
        with _comm.one_thread(call):
            rc = lib.tide_broadcast(comm, ctypes.c_void_p(wire.data_ptr()), 1, _lib.I64, 0)
        if rc < 0:
            raise _comm._fail(rc, call)
    return int(wire[0])


def _reset(size):
    """Starts the next membership epoch in place: what is in flight on the
    old communicator finishes (with its error), the named requests and
    process sets go (as at shutdown), and tide_comm_resize builds the new
    communicator. A worker left out exits 0."""
    call = "tide.torch.elastic.run"
    with _comm.one_thread(call):
        old = _comm._comm
        for h in list(_comm._in_flight):
            h._finish_request()
        for reset in _comm._on_reset:
            reset()
        new = ctypes.c_void_p()
        rc = lib.tide_comm_resize(old, size, -1, ctypes.byref(new))
        if rc < 0:
            raise _lib.error(rc, "the membership change failed: %s (tide's log above says why)"
                             % lib.tide_strerror(rc).decode(), call)
        lib.tide_comm_destroy(old)
        if not new.value:
            _comm._comm = None
            print("tide.torch.elastic: this worker was released by a shrink of the job; it exits", file=sys.stderr)
            raise SystemExit(0)
        _comm._comm = new


class State:
    """Horovod's State: what commit() saves, restore() brings back, sync()
    broadcasts from rank 0, plus reset callbacks. Subclasses define save,
    restore and sync (ObjectState, TorchState)."""

    def __init__(self, bcast_object=None, get_rank=None):
        self._bcast_object = bcast_object or broadcast_object
        self._rank = get_rank or _comm.rank
        self._reset_callbacks = []

    def register_reset_callbacks(self, callbacks):
        """callbacks (functions of no argument) run after every membership
        change, before the state is synced: e.g. rescale the learning rate
        with the new size()."""
        callbacks = list(callbacks)
        for c in callbacks:
            if not callable(c):
                raise _comm._invalid("register_reset_callbacks", "callbacks must be callables, got %r" % (c,))
        self._reset_callbacks.extend(callbacks)

    def on_reset(self):
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def commit(self):
        """Saves the state (the point restore() returns to after a failure),
        then check_host_updates(). Collective."""
        self.save()
        self.check_host_updates()

    def check_host_updates(self):
        """Raises HostsUpdatedInterrupt on every member when the job is to
        grow (workers wait to join) or shrink (a request below the size).
        Collective: rank 0 reads the job's store and tells the others."""
        n = _comm.size()
        size = _decide()
        if size != n:
            _next_size[0] = size
            raise HostsUpdatedInterrupt(skip_sync=size < n)

    def save(self):
        raise NotImplementedError("State.save")

    def restore(self):
        raise NotImplementedError("State.restore")

    def sync(self):
        raise NotImplementedError("State.sync")

    def reset(self):
        """After a membership change, before the sync (override it)."""


class ObjectState(State):
    """Python objects as attributes (each keyword argument), saved by
    commit() and broadcast from rank 0 by sync()."""

    def __init__(self, bcast_object=None, get_rank=None, **kwargs):
        self._saved_state = kwargs
        self._set_attrs()
        super().__init__(bcast_object=bcast_object, get_rank=get_rank)

    def save(self):
        self._saved_state = {k: getattr(self, k) for k in self._saved_state}

    def restore(self):
        self._set_attrs()

    def sync(self):
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state)
            self._set_attrs()

    def _set_attrs(self):
        for k, v in self._saved_state.items():
            setattr(self, k, v)


class _Handler:
    """A model's or an optimizer's state_dict, kept by commit()."""

    def __init__(self, value):
        self.value = value
        self.save()

    def save(self):
        self._saved = copy.deepcopy(self.value.state_dict())

    def restore(self):
        self.value.load_state_dict(self._saved)

    def set_value(self, value):
        self.value = value
        self.save()

    def on_reset(self):
        """After a membership change, before the reset callbacks."""


class _ModelHandler(_Handler):
    def sync(self):
        broadcast_parameters(self.value.state_dict(), root_rank=0)


class _OptimizerHandler(_Handler):
    def restore(self):
        _abandon(self.value)
        super().restore()

    def sync(self):
        _abandon(self.value)
        broadcast_optimizer_state(self.value, root_rank=0)


class ElasticSampler(torch.utils.data.Sampler):
    """Horovod's ElasticSampler: deals a dataset's indices over the current
    members and, kept in a TorchState, deals what is left of the epoch over
    the new members after every membership change. Call record_batch after
    each batch and set_epoch(e) when an epoch starts or ends (it clears the
    count of processed samples). The order is a permutation seeded by
    seed + epoch (shuffle) or the dataset's order; the last round is padded
    with the first remaining indices so that every rank gets as many."""

    def __init__(self, dataset, shuffle=True, seed=0):
        self.dataset, self.shuffle, self.seed = dataset, bool(shuffle), int(seed)
        self.epoch = 0
        self.processed_num = 0
        self.reset()

    def set_epoch(self, epoch):
        self.epoch = epoch
        self.processed_num = 0
        self.reset()

    def record_batch(self, batch_idx, batch_size):
        """batch_size samples were processed on every member."""
        self.processed_num += batch_size * self.num_replicas

    def state_dict(self):
        return {"epoch": self.epoch, "processed_num": self.processed_num}

    def load_state_dict(self, state_dict):
        self.epoch = state_dict["epoch"]
        self.processed_num = state_dict["processed_num"]
        self.reset()

    def reset(self):
        """Deals the epoch's unprocessed indices over the current members."""
        self.num_replicas, self.rank = _comm.size(), _comm.rank()
        n = len(self.dataset)
        if self.shuffle:
            order = torch.randperm(n, generator=torch.Generator().manual_seed(self.seed + self.epoch)).tolist()
        else:
            order = list(range(n))
        self.remaining_indices = order[self.processed_num:]
        self.num_samples = -(-len(self.remaining_indices) // self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas

    def __iter__(self):
        left = self.remaining_indices
        padded = left + (left * (self.total_size // max(len(left), 1) + 1))[:self.total_size - len(left)]
        return iter(padded[self.rank:self.total_size:self.num_replicas])

    def __len__(self):
        return self.num_samples


class _SamplerHandler(_Handler):
    def sync(self):
        self.value.load_state_dict(broadcast_object(self.value.state_dict()))

    def on_reset(self):
        self.value.reset()


def _abandon(optimizer):
    if isinstance(optimizer, _DistributedMixin):
        optimizer._abandon_exchanges()


_HANDLERS = [(torch.nn.Module, _ModelHandler), (torch.optim.Optimizer, _OptimizerHandler),
             (ElasticSampler, _SamplerHandler)]


class TorchState(ObjectState):
    """Horovod's TorchState: model and optimizer (and any further modules,
    optimizers or ElasticSamplers among kwargs) by their state_dict, the other kwargs as Python
    objects; each is an attribute (state.model, state.epoch, ...)."""

    def __init__(self, model=None, optimizer=None, **kwargs):
        kwargs.update(model=model, optimizer=optimizer)
        handlers, plain = {}, {}
        for k, v in kwargs.items():
            cls = next((h for t, h in _HANDLERS if isinstance(v, t)), None)
            if cls is not None:
                handlers[k] = cls(v)
            else:
                plain[k] = v
        object.__setattr__(self, "_handlers", handlers)
        for k, h in handlers.items():
            object.__setattr__(self, k, h.value)
        super().__init__(bcast_object=broadcast_object, get_rank=_comm.rank, **plain)

    def save(self):
        for h in self._handlers.values():
            h.save()
        super().save()

    def restore(self):
        for h in self._handlers.values():
            h.restore()
        super().restore()

    def sync(self):
        for h in self._handlers.values():
            h.sync()
        super().sync()

    def on_reset(self):
        for h in self._handlers.values():
            h.on_reset()  # an ElasticSampler deals the rest of its epoch over the new members
        super().on_reset()

    def __setattr__(self, name, value):
        handlers = self.__dict__.get("_handlers", {})
        if name in handlers:
            handlers[name].set_value(value)
        super().__setattr__(name, value)


def run(func):
    """Horovod's decorator: func(state, ...) runs until it returns; after a
    peer's death (restoring the last commit) or a HostsUpdatedInterrupt the
    membership changes in place, the reset callbacks run, the state is
    synced from rank 0 and func is called again. Collectives must not be
    called outside func between init() and run (a joiner meets the members
    in the sync)."""

    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        call = "tide.torch.elastic.run"
        if not isinstance(state, State):
            raise _comm._invalid(call, "the first argument must be a tide.torch.elastic State (TorchState, "
                                 "ObjectState), got %s" % type(state).__name__)
        _comm._c(call)
        skip_sync = False
        while True:
            try:
                if not skip_sync:
                    state.sync()
                result = func(state, *args, **kwargs)
                comm = _comm._c(call)
                if lib.tide_comm_epoch(comm) >= 0:
                    lib.tide_comm_elastic_finish(comm)  # workers still waiting to join give up
                return result
            except _FATAL as e:
                if lib.tide_comm_epoch(_comm._c(call)) < 0:
                    raise
                print("tide.torch.elastic: rank %d: %s; restoring the last commit and going on with the "
                      "survivors" % (_comm.rank(), e), file=sys.stderr)
                state.restore()
                size, skip_sync = 0, False
            except HostsUpdatedInterrupt as e:
                size, skip_sync = _next_size[0], e.skip_sync
            _reset(size)
            state.on_reset()

    return wrapper


__all__ = ["run", "State", "ObjectState", "TorchState", "ElasticSampler", "HostsUpdatedInterrupt", "HorovodInternalError",
           "is_elastic", "epoch", "request", "pending"]
