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

The response cache (Horovod's): a name whose request ran in a round, with
the description every rank agreed on, gets a bit in the set's cache; the
ranks' caches stay identical because every rank updates its own from the
same round. In the next rounds a rank sends each pending request that
matches its cache entry as that bit, and only the others (new names, a
changed shape or dtype) as the pickled (name, description). When every
rank sent bits only, the requests whose bit every rank set run as the plan
cached for that set of bits (their order and fusion), with no lists to
build or compare; anything else is expanded back into the lists above and
negotiated in full, with the same outcomes and errors. A training loop
that allreduces the same named gradients every step sends a few bytes per
rank per step instead of its whole request list. TIDE_TORCH_CACHE_CAPACITY
entries (default 1024, least recently used evicted; 0: off), the same on
every rank.

Process sets are tide sub-communicators (tide_comm_split): each has its
own pending requests, rounds and cache, so a set's ranks wait only for each
other.
"""
import collections
import ctypes
import os
import pickle
import re
import struct
import time

import torch

from .. import _lib
from .._lib import lib
from . import _comm

_EMISMATCH = -3002  # TIDE_EMISMATCH (include/tide/errors.h)
_JOIN = "join"


DEFAULT_CACHE_CAPACITY = 1024
_MAX_CACHE_CAPACITY = 1 << 20


def _read_cache_capacity():
    value = os.environ.get("TIDE_TORCH_CACHE_CAPACITY", "")
    if value == "":
        return DEFAULT_CACHE_CAPACITY
    try:
        n = int(value)
    except ValueError:
        n = -1
    if not 0 <= n <= _MAX_CACHE_CAPACITY:
        raise ValueError("TIDE_TORCH_CACHE_CAPACITY must be an integer in [0, %d] (entries of the response cache; "
                         "0 turns it off), got %r" % (_MAX_CACHE_CAPACITY, value))
    return n


_cache_capacity = [_read_cache_capacity()]
_UNNAMED = re.compile(r"\.noname\.[0-9]+$")


def _mismatch(message, call):
    return _lib.error(_EMISMATCH, message, call)


class _Cache:
    """A process set's response cache: name -> [bit, description] of the
    requests that ran, least recently used first, and the plans (names in
    order, fusion groups) of the bit sets that ran from it. Updated only
    from what every rank saw in a round, so identical on every rank."""

    def __init__(self, capacity):
        self.capacity = capacity
        self.entries = collections.OrderedDict()
        self.names = []   # bit -> name (None: free)
        self.free = []    # free bits, reused lowest first
        self.plans = {}   # ready bits (an int) -> (names, fusion groups)

    def encode(self, join_round, pending, waits):
        """This rank's round message: the bits of its pending requests the
        cache holds as they are, and the others in full, and whether it
        waits (or polls). Returns (payload, hits, misses)."""
        bits, extras = 0, []
        for name, req in pending.items():
            entry = self.entries.get(name)
            if entry is not None and entry[1] == req.desc:
                bits |= 1 << entry[0]
            else:
                extras.append((name, req.desc))
        packed = bits.to_bytes((bits.bit_length() + 7) // 8, "little")
        payload = struct.pack("<iiii", join_round, self.capacity, int(waits), len(packed)) + packed
        if extras:
            payload += pickle.dumps(extras)
        return payload, len(pending) - len(extras), len(extras)

    @staticmethod
    def decode(payload):
        """(join round, capacity, bits, extras, waits) of a rank's message."""
        join_round, capacity, waits, nbits = struct.unpack_from("<iiii", payload)
        bits = int.from_bytes(payload[16:16 + nbits], "little")
        extras = pickle.loads(payload[16 + nbits:]) if len(payload) > 16 + nbits else []
        return join_round, capacity, bits, extras, bool(waits)

    def expand(self, bits):
        """The (name, description) list the bits stand for, in bit order."""
        out = []
        while bits:
            low = bits & -bits
            name = self.names[low.bit_length() - 1]
            out.append((name, self.entries[name][1]))
            bits ^= low
        return out

    def learn(self, name, desc):
        """name ran with desc on every rank: cache it (or refresh it).
        Unnamed calls' names ("<kind>.noname.<n>") never repeat within a
        cache's life, so they are not cached."""
        if self.capacity == 0 or _UNNAMED.search(name):
            return
        entry = self.entries.get(name)
        if entry is not None:
            self.entries.move_to_end(name)
            if entry[1] != desc:
                entry[1] = desc
                self._drop_plans(entry[0])
            return
        if len(self.entries) >= self.capacity:
            _, (bit, _) = self.entries.popitem(last=False)
            self.names[bit] = None
            self.free.append(bit)
            self._drop_plans(bit)
        if self.free:
            self.free.sort()
            bit = self.free.pop(0)
            self.names[bit] = name
        else:
            bit = len(self.names)
            self.names.append(name)
        self.entries[name] = [bit, desc]

    def forget(self, name):
        """name met a mismatch: its entry goes."""
        entry = self.entries.pop(name, None)
        if entry is not None:
            self.names[entry[0]] = None
            self.free.append(entry[0])
            self._drop_plans(entry[0])

    def _drop_plans(self, bit):
        """The plans that use bit go (its name or description changed)."""
        self.plans = {k: v for k, v in self.plans.items() if not k >> bit & 1}


class _State:
    """One process set's negotiation: its pending requests (name -> request,
    in submission order), per-kind counters for unnamed calls, its round
    count, this rank's join, if any, its response cache and counters."""

    def __init__(self):
        self.pending = {}
        self.counters = {}
        self.rounds = 0
        self.join = None
        self.inflight = None  # a round started by a poll: (_Exchange, hits, misses)
        self.cache = _Cache(_cache_capacity[0])
        self.cached_rounds = 0  # rounds run from the cache alone (every rank sent bits only)
        self.cache_hits = 0     # this rank's requests sent as a bit
        self.cache_misses = 0   # this rank's requests sent in full
        self.negotiate_s = 0.0  # seconds in rounds before their collectives ran (the exchange, the matching)


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
    if req.done:  # ran in an earlier wait's round: nothing to negotiate
        return
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
    start = time.perf_counter()
    st = ps._state
    comm = ps._comm_handle(call)
    me = lib.tide_comm_rank(comm)
    cache = st.cache
    if st.inflight is None:  # the cache changes only when a round is done: the same at its start and end
        join_round = st.join.desc[1] if st.join is not None and not st.join.done else -1
        payload, hits, misses = cache.encode(join_round, st.pending, blocking)
        st.inflight = (_Exchange(comm, payload, call), hits, misses)
    if not blocking and not st.inflight[0].ready():
        return
    (exchange, hits, misses), st.inflight = st.inflight, None
    messages = [cache.decode(b) for b in exchange.finish()]
    st.rounds += 1
    st.cache_hits += hits
    st.cache_misses += misses
    n = len(messages)
    members = ps._members()
    if any(m[1] != cache.capacity for m in messages):
        _capacity_mismatch(ps, messages, members, call)
        return
    if all(m[0] < 0 and not m[3] for m in messages):
        ready_bits = messages[0][2]
        for m in messages[1:]:
            ready_bits &= m[2]
        if ready_bits:
            st.cached_rounds += 1
            _run_cached(st, comm, ready_bits, start, call)
            return
    views = [(m[0], cache.expand(m[2]) + m[3]) for m in messages]
    joined = [r for r in range(n) if views[r][0] >= 0]
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
        if all(m[4] for m in messages):  # every rank waits: nothing can become ready
            _stalled(ps, views, joined, members, call)
        return
    groups = _fusion_groups(ready, lambda nm: _agreed(seen[nm])) if not joined else [[nm] for nm in ready]
    st.negotiate_s += time.perf_counter() - start
    with _comm.using(comm):
        left = _run_fused(st, groups)
        for nm in left:
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
    # the cache learns from what every rank saw, never from how a run ended here, so it stays the same everywhere
    if not joined:
        for nm in ready:
            desc = _agreed(seen[nm])
            if desc is not None:
                cache.learn(nm, desc)
            else:
                cache.forget(nm)


def _run_cached(st, comm, ready_bits, start, call):
    """Runs the requests of ready_bits (set on every rank, so identical on
    every rank) as the plan cached for them: bit order, fusion groups."""
    cache = st.cache
    plan = cache.plans.get(ready_bits)
    if plan is None:
        names = [nm for nm, _ in cache.expand(ready_bits)]
        plan = (names, _fusion_groups(names, lambda nm: cache.entries[nm][1]))
        if len(cache.plans) >= 64:
            cache.plans.clear()
        cache.plans[ready_bits] = plan
    names, groups = plan
    st.negotiate_s += time.perf_counter() - start
    with _comm.using(comm):
        for group in groups:
            reqs = [st.pending.pop(nm) for nm in group]
            if len(reqs) > 1:
                _run_group(reqs)
                continue
            req = reqs[0]
            try:
                req.finish(output=req.run())
            except _lib.TideError as e:
                req.finish(error=e)
    for nm in names:
        cache.entries.move_to_end(nm)


def _fusion_groups(names, desc_of):
    """names cut into runs to fuse (tensor fusion): consecutive fusible
    allreduces of one dtype and op, at most 64 MiB a run. desc_of(name) is
    the name's description, or None when it may not fuse (the ranks
    disagree). A list of lists; a list of one runs alone."""
    def key(nm):
        d = desc_of(nm)
        return (d[1], d[3]) if d is not None and fusible(d) else None
    groups, i = [], 0
    while i < len(names):
        k, j = key(names[i]), i + 1
        total = _nbytes(desc_of(names[i])) if k is not None else 0
        while k is not None and j < len(names) and key(names[j]) == k and total + _nbytes(desc_of(names[j])) \
                <= _FUSION_BYTES:
            total += _nbytes(desc_of(names[j]))
            j += 1
        groups.append(names[i:j])
        i = j
    return groups


def _run_group(reqs):
    """One flat allreduce of the fused requests' tensors."""
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


def _agreed(descs):
    """The description every rank gave (descs: rank -> description), or
    None when they differ."""
    values = list(descs.values())
    return values[0] if all(d == values[0] for d in values) else None


def _run_fused(st, groups):
    """Tensor fusion: runs each group of several requests (consecutive ready
    allreduces that agree on every rank and share dtype, op and device,
    _fusion_groups) as one flat allreduce. Returns the names left to run
    alone."""
    left = []
    for group in groups:
        if len(group) < 2:
            left.extend(group)
        else:
            _run_group([st.pending.pop(nm) for nm in group])
    return left


def _capacity_mismatch(ps, messages, members, call):
    """The ranks' caches differ in size, so their bits mean different
    things: every pending request fails on every rank."""
    caps = ", ".join("rank %d has %d" % (members[r], m[1]) for r, m in enumerate(messages))
    message = ("collective mismatch: TIDE_TORCH_CACHE_CAPACITY must be the same on every rank (%s); set it alike "
               "(or unset) on every rank" % caps)
    _fail_all(ps._state, message, call)


def set_cache_capacity(capacity):
    """Sets the response cache's size (0: off) and empties every process
    set's cache. Every rank must call it at the same point (between
    collectives), as TIDE_TORCH_CACHE_CAPACITY must be the same everywhere."""
    if not isinstance(capacity, int) or not 0 <= capacity <= _MAX_CACHE_CAPACITY:
        raise _comm._invalid("set_cache_capacity", "capacity must be an int in [0, %d], got %r"
                             % (_MAX_CACHE_CAPACITY, capacity))
    _cache_capacity[0] = capacity
    for ps in _sets.values():
        ps._state.cache = _Cache(capacity)


def negotiation_stats(process_set=None):
    """This rank's negotiation counters in a process set (None: the global
    one), since init(): rounds, cached_rounds (run from the response cache
    alone), cache_hits and cache_misses (this rank's requests sent as a
    cache bit / in full), cache_entries and cache_capacity."""
    ps = global_process_set if process_set is None else process_set
    if not isinstance(ps, ProcessSet):
        raise _comm._invalid("negotiation_stats", "process_set must be a tide.torch.ProcessSet, got %r"
                             % (process_set,))
    st = ps._state
    return {"rounds": st.rounds, "cached_rounds": st.cached_rounds, "cache_hits": st.cache_hits,
            "cache_misses": st.cache_misses, "cache_entries": len(st.cache.entries),
            "cache_capacity": st.cache.capacity, "negotiate_s": st.negotiate_s}


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
    for r, (join_round, lst) in enumerate(views):
        what = ", ".join(describe(nm, d) for nm, d in lst) or "nothing"
        parts.append("rank %d %s %s" % (members[r], "joined and has" if r in joined else "waits with", what))
    message = ("collective mismatch: no collective was started by every rank: %s (names must match across ranks; "
               "unnamed calls are matched by kind and order)" % "; ".join(parts))
    _fail_all(ps._state, message, call)


def _fail_all(st, message, call):
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
