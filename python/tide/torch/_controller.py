"""Horovod's name-matched collectives on tide's ordered ones.

tide's communicator runs collectives in the order each rank issues them.
Horovod matches them by name instead: ranks may start named collectives in
different orders, and a rank may start one long before the others. So the
Horovod-shaped calls (allreduce, allgather, broadcast, alltoall,
reducescatter, barrier, join, their async and grouped forms) do not issue
tide collectives directly: each becomes a pending request under its name
(given, or "<kind>.noname.<n>", counted per kind) in its process set.

When a rank waits for one (synchronize, or any blocking call), the ranks of
the process set negotiate in rounds on the set's communicator: a round
gathers every rank's pending requests (name, and what must agree: kind,
dtype, shape, op, root), and every rank then handles the same requests in
the same order, so the ordered tide collectives under them line up:
  - a name that every rank (every rank not joined) has submitted is ready;
    if the ranks' descriptions differ, it fails on every rank that made it
    with MismatchError naming both calls, and nothing moves;
  - a ready allreduce with joined ranks runs with zeros from them (Horovod's
    join); any other ready collective fails while ranks have joined;
  - when every rank has joined, join returns (the rank that joined last);
  - a round in which nothing is ready cannot be followed by one that is
    (every rank of the set is waiting, so none can submit anything): the
    pending requests fail on every rank with MismatchError listing what
    each rank has pending, instead of hanging.
A rank leaves the rounds once what it waits for is done; requests it
started and dropped stay pending (their tensors kept alive) until a later
round runs them, as in Horovod. Rounds happen inside waits and polls: a
poll starts a round without waiting for it (a nonblocking allgather) and
finishes it in a later poll or wait once every rank has joined it, so a
loop of polls makes progress as Horovod's background thread would. Each
rank says in the round whether it waits; a round with nothing ready is a
stall only when every rank does (a polling rank may still submit).

Process sets are tide sub-communicators (tide_comm_split): each has its
own pending requests and rounds, so a set's ranks wait only for each other.
"""
import ctypes
import pickle

import torch

from .. import _lib
from .._lib import lib
from . import _comm

_EMISMATCH = -3002  # TIDE_EMISMATCH (include/tide/errors.h)
_JOIN = "join"


def _mismatch(message, call):
    return _lib.error(_EMISMATCH, message, call)


class _State:
    """One process set's negotiation: its pending requests (name -> request,
    in submission order), per-kind counters for unnamed calls, its round
    count and this rank's join, if any."""

    def __init__(self):
        self.pending = {}
        self.counters = {}
        self.rounds = 0
        self.join = None
        self.inflight = None  # a round started by a poll: (_Exchange, blocking)


class ProcessSet:
    """Horovod's process set: collectives among a subset of the job's ranks
    (a tide sub-communicator). Pass ranks, then register it on every rank
    with add_process_set (or init(process_sets=[...]))."""

    def __init__(self, ranks=None):
        self.ranks = None if ranks is None else sorted(int(r) for r in ranks)
        self.process_set_id = None
        self._handle = None  # the sub-communicator (members only)
        self._state = _State()

    def _members(self):
        return list(range(_comm.size())) if self.ranks is None else self.ranks

    def size(self):
        return len(self._members())

    def rank(self):
        """This rank's index in the set (-1: not a member)."""
        me = _comm.rank()
        members = self._members()
        return members.index(me) if me in members else -1

    def included(self):
        return _comm.rank() in self._members()

    def _comm_handle(self, call):
        if self.ranks is None:
            return _comm._c(call)
        if self.process_set_id is None:
            raise _comm._invalid(call, "process set %s is not registered: call add_process_set first (on every "
                                 "rank)" % (self.ranks,))
        if self._handle is None:
            raise _comm._invalid(call, "rank %d is not in process set %s" % (_comm.rank(), self.ranks))
        return self._handle

    def __repr__(self):
        return "ProcessSet(process_set_id=%s, ranks=%s)" % (self.process_set_id, self._members()
                                                           if _comm.is_initialized() else self.ranks)


def _drain():
    """shutdown(): the requests this rank started and never waited for run
    first (the other ranks, shutting down too, run theirs)."""
    for ps in list(_sets.values()):
        for req in list(ps._state.pending.values()):
            if ps._handle is not None or ps is global_process_set:
                wait(req)


_comm._on_shutdown.append(lambda: _drain())
_comm._on_reset.append(lambda: reset())
global_process_set = ProcessSet(None)
global_process_set.process_set_id = 0
_sets = {0: global_process_set}
_next_id = [1]


def reset():
    """init()/shutdown(): every set's pending requests fail, its
    sub-communicator goes."""
    for ps in list(_sets.values()):
        for req in list(ps._state.pending.values()) + ([ps._state.join] if ps._state.join else []):
            req.finish(error=_comm._invalid(req.call, "tide.torch was shut down before this collective ran"))
        if ps._handle is not None:
            lib.tide_comm_destroy(ps._handle)
        ps._handle = None
        ps._state = _State()
        if ps is not global_process_set:
            ps.process_set_id = None
    _sets.clear()
    _sets[0] = global_process_set
    _next_id[0] = 1


def add_process_set(process_set):
    """Registers a ProcessSet (or a list of ranks) on this rank; collective
    over the whole job: every rank calls it, with the same ranks, in the
    same order. Returns the ProcessSet."""
    call = "add_process_set"
    ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    if ps.ranks is None or ps is global_process_set:
        raise _comm._invalid(call, "the global process set is always registered")
    if ps.process_set_id is not None:
        raise _comm._invalid(call, "process set %s is already registered (id %d)" % (ps.ranks, ps.process_set_id))
    n = _comm.size()
    if not ps.ranks or len(set(ps.ranks)) != len(ps.ranks) or ps.ranks[0] < 0 or ps.ranks[-1] >= n:
        raise _comm._invalid(call, "ranks must be distinct ranks in [0, %d), got %s" % (n, ps.ranks))
    for other in _sets.values():
        if other.ranks == ps.ranks:
            raise _comm._invalid(call, "a process set with ranks %s is already registered (id %d)"
                                 % (ps.ranks, other.process_set_id))
    with _comm.one_thread(call):
        views = [pickle.loads(b) for b in _exchange(_comm._c(call), pickle.dumps(ps.ranks), call)]
        if any(v != views[0] for v in views):
            first = next(r for r, v in enumerate(views) if v != views[0])
            raise _mismatch("rank 0 called add_process_set(%s) while rank %d called add_process_set(%s)"
                            % (views[0], first, views[first]), call)
        member = _comm.rank() in ps.ranks
        out = ctypes.c_void_p()
        rc = lib.tide_comm_split(_comm._c(call), 0 if member else -1, _comm.rank(), ctypes.byref(out))
        if rc < 0:
            raise _comm._fail(rc, call)
    ps._handle = out if member else None
    ps.process_set_id = _next_id[0]
    _next_id[0] += 1
    ps._state = _State()
    _sets[ps.process_set_id] = ps
    return ps


def remove_process_set(process_set):
    """Unregisters a process set on this rank (its pending requests fail).
    Returns True when it was registered."""
    ps = process_set
    if not isinstance(ps, ProcessSet) or ps is global_process_set or ps.process_set_id not in _sets:
        return False
    for req in list(ps._state.pending.values()):
        req.finish(error=_comm._invalid(req.call, "process set %s was removed" % (ps.ranks,)))
    ps._state = _State()
    del _sets[ps.process_set_id]
    ps.process_set_id = None
    if ps._handle is not None:
        lib.tide_comm_destroy(ps._handle)
        ps._handle = None
    return True


def resolve(process_set, call):
    """The ProcessSet a call names (None: the global set), checked."""
    ps = global_process_set if process_set is None else process_set
    if not isinstance(ps, ProcessSet):
        raise _comm._invalid(call, "process_set must be a tide.torch.ProcessSet, got %r" % (process_set,))
    ps._comm_handle(call)  # registered and a member, or raises
    return ps


_FRAME_WORDS = 256  # a round's request list fits one 1 KiB frame per rank in the common case


class _Exchange:
    """Every rank's bytes (a list in rank order), started without waiting:
    one allgather of a 1 KiB frame per rank (the length, then the bytes
    when they fit); a second (allgatherv, blocking) only when some rank's
    bytes do not fit, which every rank sees in the frames."""

    def __init__(self, comm, payload, call):
        self.comm, self.payload, self.call = comm, payload, call
        self.n = lib.tide_comm_size(comm)
        self.req = ctypes.c_void_p()
        if self.n == 1:
            return
        cap = (_FRAME_WORDS - 1) * 4
        self.frame = torch.zeros(_FRAME_WORDS, dtype=torch.int32)
        self.frame[0] = len(payload)
        if len(payload) <= cap:
            ctypes.memmove(self.frame.data_ptr() + 4, payload, len(payload))
        self.frames = torch.zeros(self.n * _FRAME_WORDS, dtype=torch.int32)
        rc = lib.tide_iallgather(comm, _comm._ptr(self.frame), _comm._ptr(self.frames), _FRAME_WORDS, _lib.I32,
                                 ctypes.byref(self.req))
        if rc < 0:
            raise _lib.comm_error(comm, rc, call)

    def ready(self):
        """True once every rank has joined (finish() will not wait)."""
        if self.n == 1:
            return True
        done = ctypes.c_int()
        rc = lib.tide_test(self.req, ctypes.byref(done))
        if rc < 0:
            raise _lib.comm_error(self.comm, rc, self.call)
        return bool(done.value)

    def finish(self):
        comm, call, n = self.comm, self.call, self.n
        if n == 1:
            return [self.payload]
        rc = lib.tide_wait(self.req)
        if rc < 0:
            raise _lib.comm_error(comm, rc, call)
        cap = (_FRAME_WORDS - 1) * 4
        frames = self.frames
        lengths = frames[0::_FRAME_WORDS].tolist()
        base = frames.data_ptr()
        result = [ctypes.string_at(base + (r * _FRAME_WORDS + 1) * 4, lengths[r]) if lengths[r] <= cap else None
                  for r in range(n)]
        if all(b is not None for b in result):
            return result
        words = [(x + 3) // 4 if x > cap else 0 for x in lengths]
        me = lib.tide_comm_rank(comm)
        send = torch.zeros(max(words[me], 1), dtype=torch.int32)
        if words[me]:
            ctypes.memmove(send.data_ptr(), self.payload, len(self.payload))
        out = torch.zeros(max(sum(words), 1), dtype=torch.int32)
        counts = (ctypes.c_size_t * n)(*words)
        rc = lib.tide_allgatherv(comm, _comm._ptr(send), words[me], _comm._ptr(out), counts, _lib.I32)
        if rc < 0:
            raise _lib.comm_error(comm, rc, call)
        at = 0
        for r in range(n):
            if words[r]:
                result[r] = ctypes.string_at(out.data_ptr() + at * 4, lengths[r])
                at += words[r]
        return result


def _exchange(comm, payload, call):
    """Every rank's bytes (a list in rank order), blocking."""
    return _Exchange(comm, payload, call).finish()


class Request:
    """One pending named collective. run() issues its ordered tide
    collectives (in the set's communicator) and returns the output; a
    joined rank runs _JOINED[kind](desc) in its place."""

    def __init__(self, ps, name, desc, run, call):
        self.ps, self.name, self.desc, self.run, self.call = ps, name, desc, run, call
        self.done = False
        self.output = None
        self.error = None
        self.fuse = None  # (prepare, finish, reduce) where fusible(desc)

    def finish(self, output=None, error=None):
        self.output, self.error, self.done = output, error, True
        self.run = self.fuse = None  # drops the tensors they held


_FUSION_BYTES = 64 << 20
_ELEMENT_BYTES = {"torch.float64": 8, "torch.int64": 8, "torch.float32": 4, "torch.int32": 4}


def fusible(desc):
    """Whether an allreduce may share one buffer with its neighbours in a
    round (tensor fusion): on the CPU, an elementwise op. A function of the
    description only, so every rank decides alike."""
    return desc[0] == "allreduce" and desc[3] in ("Sum", "Average", "Min", "Max") and desc[4] == "cpu"


def _nbytes(desc):
    n = 1
    for d in desc[2]:
        n *= d
    return n * _ELEMENT_BYTES.get(desc[1], 2)


class Handle:
    """What the async calls return: synchronize(handle) waits (negotiating
    with the other ranks) and returns the output; poll(handle) is True once
    a wait on this rank ran it."""

    def __init__(self, req, finish=None):
        self._req = req
        self._finish = finish
        self.output = None
        self._waited = False

    def poll(self):
        """True once done; else starts or advances a negotiation round
        without waiting for the other ranks."""
        req = self._req
        if not req.done:
            with _comm.one_thread(req.call):
                _round(req.ps, req.call, blocking=False)
        return req.done

    def wait(self):
        if not self._waited:
            wait(self._req)
            self._waited = True
            if self._req.error is None:
                out = self._req.output
                self.output = self._finish(out) if self._finish is not None else out
        if self._req.error is not None:
            raise self._req.error
        return self.output


def describe(name, desc):
    return "%s(name=%r%s)" % (desc[0], name, "".join(", %s" % (d,) for d in desc[1:]))


def submit(ps, kind, name, desc, run, call):
    """Registers a request on this rank (nothing is sent). A name already
    pending in the set raises InvalidArgumentError (a ValueError) here."""
    with _comm.one_thread(call):  # another thread inside a collective: refused before anything is counted
        return _submit_locked(ps, kind, name, desc, run, call)


def _submit_locked(ps, kind, name, desc, run, call):
    st = ps._state
    if name is None:
        n = st.counters.get(kind, 0)
        st.counters[kind] = n + 1
        name = "%s.noname.%d" % (kind, n)
    elif not isinstance(name, str):
        raise _comm._invalid(call, "name must be a str, got %r" % (name,))
    elif name in st.pending:
        raise _comm._invalid(call, "a collective named %r is already in flight on rank %d (%s); names must be "
                             "unique among the collectives in flight" %
                             (name, _comm.rank(), describe(name, st.pending[name].desc)))
    req = Request(ps, name, (kind,) + tuple(desc), run, call)
    st.pending[name] = req
    return req


def wait(req):
    """Runs negotiation rounds in req's process set until req is done."""
    with _comm.one_thread(req.call):
        while not req.done:
            _round(req.ps, req.call)


def join(call="join"):
    """Horovod's join on the global set: this rank contributes zeros to the
    allreduces the others still make, until every rank has joined; returns
    the rank that joined last (the same on every rank)."""
    ps = global_process_set
    ps._comm_handle(call)
    st = ps._state
    if st.join is None:
        st.join = Request(ps, _JOIN, (_JOIN, st.rounds), None, call)
    req = st.join
    wait(req)
    if req.error is not None:
        raise req.error
    return req.output


def _round(ps, call, blocking=True):
    """One negotiation round (blocking: this rank waits for it; else a
    round is started, or the one started before is finished only if every
    rank has joined it)."""
    st = ps._state
    comm = ps._comm_handle(call)
    me = lib.tide_comm_rank(comm)
    if st.inflight is None:
        join_round = st.join.desc[1] if st.join is not None and not st.join.done else -1
        mine = [(name, r.desc) for name, r in st.pending.items()]
        st.inflight = _Exchange(comm, pickle.dumps((join_round, mine, blocking)), call)
    if not blocking and not st.inflight.ready():
        return
    exchange, st.inflight = st.inflight, None
    views = [pickle.loads(b) for b in exchange.finish()]
    st.rounds += 1
    n = len(views)
    joined = [r for r in range(n) if views[r][0] >= 0]
    members = ps._members()
    if len(joined) == n:
        last = max(range(n), key=lambda r: (views[r][0], r))
        st.join.finish(output=members[last])
        st.join = None
        return
    order, seen = [], {}
    for r in range(n):
        for name, desc in views[r][1]:
            if name not in seen:
                seen[name] = {}
                order.append(name)
            seen[name][r] = desc
    ready = [nm for nm in order if all(r in seen[nm] for r in range(n) if r not in joined)]
    if not ready:
        if all(v[2] for v in views):  # every rank waits: nothing can become ready
            _stalled(ps, views, joined, members, call)
        return
    with _comm.using(comm):
        if not joined:
            ready = _run_fused(st, ready, seen, call)
        for nm in ready:
            descs = seen[nm]
            first = min(descs)
            other = next((r for r in sorted(descs) if descs[r] != descs[first]), None)
            req = st.pending.pop(nm, None)
            error = None
            if other is not None:
                error = _mismatch("collective mismatch: rank %d called %s while rank %d called %s"
                                  % (members[first], describe(nm, descs[first]), members[other],
                                     describe(nm, descs[other])), call)
            elif joined and descs[first][0] != "allreduce":
                error = _mismatch("rank %d called %s after rank %d joined: only allreduce runs while ranks have "
                                  "joined (hvd.join)" % (members[first], describe(nm, descs[first]),
                                                         members[joined[0]]), call)
            if req is not None:
                if error is not None:
                    if other is None:  # refused for the joined ranks, which made no such call and counted none
                        _uncount(st, nm)
                    req.finish(error=error)
                else:
                    try:
                        req.finish(output=req.run())
                    except _lib.TideError as e:
                        req.finish(error=e)
            elif me in joined and error is None:
                _JOINED[descs[first][0]](descs[first])


def _run_fused(st, ready, seen, call):
    """Tensor fusion: runs of consecutive ready allreduces that agree on
    every rank and share dtype, op and device (CPU) go as one flat
    allreduce of at most 64 MiB. Returns the names left to run alone."""
    def key(nm):
        descs = list(seen[nm].values())
        d = descs[0]
        if not fusible(d) or any(x != d for x in descs):
            return None
        return (d[1], d[3])
    left, i = [], 0
    while i < len(ready):
        k, j = key(ready[i]), i + 1
        total = _nbytes(seen[ready[i]][0]) if k is not None else 0
        while k is not None and j < len(ready) and key(ready[j]) == k and total + _nbytes(seen[ready[j]][0]) \
                <= _FUSION_BYTES:
            total += _nbytes(seen[ready[j]][0])
            j += 1
        if j - i < 2:
            left.append(ready[i])
            i += 1
            continue
        reqs = [st.pending.pop(nm) for nm in ready[i:j]]
        try:
            parts = [r.fuse[0]() for r in reqs]
            out = reqs[0].fuse[2](torch.cat([w.reshape(-1) for w, _ in parts]))
            at = 0
            for r, (w, state) in zip(reqs, parts):
                r.finish(output=r.fuse[1](out[at:at + w.numel()].view(w.shape), state))
                at += w.numel()
        except _lib.TideError as e:
            for r in reqs:
                if not r.done:
                    r.finish(error=e)
        i = j
    return left


def _uncount(st, name):
    """An unnamed call the joined ranks never made gives its number back
    (when it is the last of its kind), so that the ranks' next unnamed calls
    of that kind keep matching."""
    kind, sep, number = name.rpartition(".noname.")
    if sep and number.isdigit() and st.counters.get(kind) == int(number) + 1:
        st.counters[kind] = int(number)


def _stalled(ps, views, joined, members, call):
    """Nothing is ready and every rank of the set waits: fail them all."""
    parts = []
    for r, (join_round, lst, _) in enumerate(views):
        what = ", ".join(describe(nm, d) for nm, d in lst) or "nothing"
        parts.append("rank %d %s %s" % (members[r], "joined and has" if r in joined else "waits with", what))
    message = ("collective mismatch: no collective was started by every rank: %s (names must match across ranks; "
               "unnamed calls are matched by kind and order)" % "; ".join(parts))
    st = ps._state
    for req in list(st.pending.values()):
        req.finish(error=_mismatch(message, req.call))
    st.pending.clear()
    if st.join is not None:
        st.join.finish(error=_mismatch(message, call))
        st.join = None


def _joined_allreduce(desc):
    """A joined rank's part in an allreduce: zeros of its dtype and shape."""
    kind, dtype, shape, op, device = desc
    _JOINED_ALLREDUCE[0](getattr(torch, dtype.replace("torch.", "")), shape, device, op)


_JOINED_ALLREDUCE = [None]  # set by _horovod: (dtype, shape, device, op name) -> runs the allreduce
_JOINED = {"allreduce": _joined_allreduce}
