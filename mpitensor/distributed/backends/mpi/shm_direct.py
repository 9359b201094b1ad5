"""The engine's direct path: collectives that read the peers' buffers where they lie.

Where every member may read every other member's memory (:mod:`cma`, probed and agreed when
the group's engine is made), a call needs neither the segment's slots nor a step per chunk:
each member publishes, in its row of the segment's address table, where its peers find what
they read from it, and the members meet at two or three points per call (``Engine.sync``):

* **all_reduce**: member ``r`` reads part ``r`` of every peer's buffer, piece by piece into a
  scratch piece that stays in cache, and reduces it with its own part in rank order
  (``x0 op x1 op ... op x(p-1)``: bitwise the same wherever it is computed) into its own
  buffer (or its output: out of place, the input is only read); then (everyone done) it
  reads every peer's reduced part straight into its buffer (output).
  Each rank moves ``2 (p-1)/p`` of the buffer across memory once, as a ring would, with no
  staging copy and a sync per phase instead of per chunk. In place on every member, where
  members may also write into each other's memory (``_tiny.put``), each member instead
  writes each reduced chunk into its peers' buffers while it is in cache, and the members
  meet twice;
* **reduce_scatter**: the first phase alone, into the output (out of place, each chunk of
  the output first receives a peer's piece and then takes the others in place, still in
  rank order: ``_reduce_apart``);
* **all_gather**: each member reads every peer's input straight into its place in its output
  (one copy per byte, where the segment takes two);
* **reduce**: the root reads every peer's buffer and reduces it into its own;
* **broadcast**: every member but the root reads the root's buffer.

Every call ends at a meeting after its last read or write, so no member returns (and may
change its buffer) while a peer still reads it or writes into it; a member that leaves early,
on an error, first closes its buffer to writes (``_close``). A read or write that fails
because the peer's process is gone ends with :class:`PeerFailedError`
(``Engine.check_alive``); one whose peer is alive (its buffer gone or closed: it left the
call) with what made the peer leave, where it told (``_left_why``).
"""

from __future__ import annotations

import errno
import time
from typing import Callable, List, Optional

import numpy as np

from ...._base import native as _native
from ....errors import MpiTensorError
from ...health import watchdog as W
from ...health.backoff import Backoff
from . import cma as _cma
from .shm_pipe import _LINE, BUSY, CLOSED, OUT, PID, PUTS, RED, Engine, Reducer, _alive, bounds

try:
    from . import _tiny  # type: ignore[attr-defined]
except ImportError:  # not built: no writes into peers' buffers
    _tiny = None

CHUNK = 512 << 10  # bytes per peer read into scratch before a reduction (cache-resident)
STREAM_BYTES = 4 << 20  # a copy of this many bytes or more bypasses the cache
_ZERO = np.zeros(1, np.int64)
_WHY_S = 1.0  # how long a failed read waits for the notice of why its peer left


_copy_runs = _native.function("copy_runs")


def setup(eng: Engine, chunk: int = CHUNK) -> None:
    """Give the engine what its direct calls need (once every member agreed to use them)."""
    eng.reader = _cma.Reader()
    eng.scratch = [np.empty(chunk, np.uint8) for _ in range(eng.p)]
    eng.cma = True


def probe_row(eng: Engine, mark: np.ndarray) -> None:
    """Publish where this member's probe word ``mark`` lies (every member reads it)."""
    eng.addr[eng.me] = mark.ctypes.data


def probe(eng: Engine) -> bool:
    """Whether this member can read every peer's probe word (each holds its peer's pid),
    once every member has published its row."""
    eng.pids = [int(eng.q[r * _LINE + PID]) for r in range(eng.p)]
    got = np.zeros(1, np.int64)
    reader = _cma.Reader()
    for r in range(eng.p):
        if r == eng.me:
            continue
        try:
            reader.read(eng.pids[r], got.ctypes.data, int(eng.addr[r, eng.me]), 8)
        except OSError:
            return False
        if int(got[0]) != eng.pids[r]:
            return False
    return True


def probe_write(eng: Engine) -> bool:
    """Whether this member can also write into every peer's memory (:func:`_write`): it
    writes each peer's probe word with the value it holds (:func:`probe` read it)."""
    if _tiny is None or not hasattr(_tiny, "put"):
        return False
    word = np.zeros(1, np.int64)
    for r in range(eng.p):
        if r == eng.me:
            continue
        word[0] = eng.pids[r]
        if _tiny.put(eng.q, eng.me * _LINE + BUSY, r * _LINE + CLOSED, -1, eng.pids[r],
                     int(eng.addr[r, eng.me]), word.ctypes.data, 8):
            return False
    return True


def _addr(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def _read(eng: Engine, r: int, dst: np.ndarray, src: int) -> None:
    """Copy ``dst.nbytes`` bytes from member ``r``'s address ``src`` into ``dst``."""
    if not dst.nbytes:
        return
    try:
        eng.reader.read(eng.pids[r], _addr(dst), src, dst.nbytes)
    except _cma.CmaError as exc:
        _refused(eng, r, exc, "read")


def _write(eng: Engine, r: int, dst: int, src: np.ndarray) -> None:
    """Copy ``src`` into member ``r``'s address ``dst`` (``_tiny.put``), unless ``r`` left
    the call (:func:`_close`): then raise what made it leave, as for a read that fails."""
    err = _tiny.put(eng.q, eng.me * _LINE + BUSY, r * _LINE + CLOSED, eng.step, eng.pids[r],
                    dst, _addr(src), src.nbytes)
    if err:
        exc = (_cma.CmaError(errno.ECONNRESET, "it left the call") if err < 0
               else _cma.CmaError(err, f"process_vm_writev failed: {errno.errorcode.get(err)}"))
        _refused(eng, r, exc, "write into")


def _refused(eng: Engine, r: int, exc: "_cma.CmaError", verb: str) -> None:
    """Raise for a read or write of member ``r``'s buffer that failed with ``exc``."""
    # ESRCH: the peer's memory is gone (it may not be a zombie yet): PeerFailedError
    eng.check_alive(r, exc.errno == errno.ESRCH)
    _left_why(eng, exc)
    raise MpiTensorError(f"rank {eng.h.ranks[eng.me]}: {eng.op} (#{eng.seq}) could not "
                         f"{verb} rank {eng.h.ranks[r]}'s buffer ({exc.strerror}); set "
                         "MPITENSOR_SHM_COLLECTIVES=off to keep collectives on MPI") from exc


def _close(eng: Engine) -> None:
    """This member leaves its direct call early (an error): from now on no peer writes into
    its buffers, and one that writes now is waited for (while its process lives, at most the
    group's timeout), so no write lands after the caller has the buffer back."""
    q, t = eng.q, eng.step
    if q is None or not eng.puts:  # (puts: _tiny.put was probed)
        return
    _tiny.close(q, eng.me * _LINE + CLOSED, t)
    deadline = time.perf_counter() + eng.h.timeout
    backoff = Backoff(time.perf_counter(), passive=True)
    while any(q[r * _LINE + BUSY] == t and _alive(eng.pids[r])
              for r in range(eng.p) if r != eng.me):
        now = time.perf_counter()
        if now > deadline:
            return
        backoff.pause(now, 0.0)


def _left_why(eng: Engine, exc: BaseException) -> None:
    """A live peer's buffer could not be read: the peer left the call (its memory there is
    gone) for a reason it may have told, or that the agreement slots show. Raise that (what
    a wait's slow tick would find: a mismatch, a broken group's PeerFailedError), waiting
    briefly for its notice; return where none comes."""
    h = eng.h
    t0 = time.perf_counter()
    backoff = Backoff(t0, passive=True)  # (a notice arrives without this rank's polling)
    while True:
        fault = W.fault_in_wait(h, "coll", eng.seq, eng.op, None, t0)
        if fault is not None:
            raise fault from exc
        now = time.perf_counter()
        if now - t0 > _WHY_S:
            return
        backoff.pause(now, 0.0)


def _copy(dst: np.ndarray, src: np.ndarray) -> None:
    """``dst[...] = src`` (flat, contiguous, one dtype), with stores that bypass the cache
    from :data:`STREAM_BYTES`: a plain store reads each destination line first, and this
    member's own piece of a 64 MiB all_gather took 1.5-2 ms more so at 2 ranks (7.5 ms
    against 5.4-6.1 for the whole call, raw MPI's 7.3-8.5)."""
    if (_copy_runs is None or dst.nbytes < STREAM_BYTES or dst.nbytes != src.nbytes
            or not (dst.flags.c_contiguous and src.flags.c_contiguous)):
        dst[...] = src
        return
    _copy_runs(dst.view(np.uint8), _ZERO, src.view(np.uint8), _ZERO, dst.nbytes, 1)


def _reduce_part(eng: Engine, dest: np.ndarray, own: np.ndarray, remote: List[int],
                 red: Reducer, done: Optional[Callable[[int, int], None]] = None) -> None:
    """``dest`` = the rank-order reduction of every member's piece: this member's ``own``,
    member ``r``'s at its address ``remote[r]`` (``dest`` may be ``own`` itself). ``done(lo,
    hi)``, where given (``dest`` is then ``own``), runs once ``dest[lo:hi]`` holds its result."""
    if red.wide is None and not np.may_share_memory(dest, own):
        _reduce_apart(eng, dest, own, remote, red)
        return
    p, me, dt = eng.p, eng.me, dest.dtype
    isz = dt.itemsize
    ce = eng.scratch[0].nbytes // isz
    alias = me >= 2 and np.may_share_memory(dest, own)  # the first op would overwrite it
    for lo in range(0, dest.size, ce):
        hi = min(dest.size, lo + ce)
        srcs = []
        for r in range(p):
            piece = eng.scratch[r][:(hi - lo) * isz].view(dt)
            if r != me:
                _read(eng, r, piece, remote[r] + lo * isz)
            elif alias:
                piece[...] = own[lo:hi]
            else:
                piece = own[lo:hi]
            srcs.append(piece)
        red.into(dest[lo:hi], srcs)
        if done is not None:
            done(lo, hi)


def _reduce_apart(eng: Engine, dest: np.ndarray, own: np.ndarray, remote: List[int],
                  red: Reducer) -> None:
    """:func:`_reduce_part` into a ``dest`` apart from ``own``, by an op of the piece's own
    dtype: each chunk of ``dest`` first receives a peer's piece (member 0's, or on member 0
    member 1's), then takes every other piece in place, in rank order (on member 0, ``own op
    dest``: still ``x0 op x1``). A store into a line that was just read costs no extra
    traffic, where ``out = a op b`` into a third buffer reads each of ``out``'s lines from
    memory first: a 2-rank reduce_scatter of 64 MiB took 8.5-9.4 ms so, against 11.7-12.1
    with the reduction into ``dest`` from ``own`` and a scratch copy of the peer's piece."""
    if red.view is not None:  # (the op's dtype, of the same width: bool as uint8)
        dest, own = dest.view(red.view), own.view(red.view)
    p, me, dt = eng.p, eng.me, dest.dtype
    isz = dt.itemsize
    ce = eng.scratch[0].nbytes // isz
    f, first = red.ufunc, 1 if me == 0 else 0
    for lo in range(0, dest.size, ce):
        hi = min(dest.size, lo + ce)
        acc = dest[lo:hi]
        _read(eng, first, acc, remote[first] + lo * isz)
        if me == 0:
            f(own[lo:hi], acc, out=acc)
        for r in range(first + 1, p):
            if r == me:
                piece = own[lo:hi]
            else:
                piece = eng.scratch[r][:(hi - lo) * isz].view(dt)
                _read(eng, r, piece, remote[r] + lo * isz)
            f(acc, piece, out=acc)
        if red.divide:
            np.divide(acc, red.divide, out=acc)


def all_reduce(eng: Engine, buf: np.ndarray, red: Reducer,
               out: Optional[np.ndarray] = None) -> None:
    """All-reduce of the flat contiguous ``buf`` in place, or into ``out`` (flat, contiguous,
    of ``buf``'s length, apart from it: ``buf`` is only read).

    A member's row gives its peers part ``k`` of its input for member ``k`` and, in its own
    entry (which no peer reads in the first phase), where its reduced part lies: the same
    address in place, so members in place and out of place take one call together.

    Where members may write into each other's memory (``eng.puts``) and every member's call
    is in place (each says so in its PUTS word before it arrives), each chunk of this
    member's reduced part goes into every peer's buffer as soon as it is reduced, from the
    cache, where the peers would read it back from memory after a meeting: 2 ranks, 64 MiB,
    9.8-10.2 ms against 11.4-12.5. A peer's part ``me`` is read (its input) before its result
    is written there, by this member alone. A member that leaves such a call early closes
    its buffer to writes first (:func:`_close`)."""
    p, me, isz = eng.p, eng.me, buf.itemsize
    dest = buf if out is None else out
    b = bounds(buf.size, p)
    base, home = _addr(buf), _addr(dest)
    row = [(home if k == me else base) + b[k] * isz for k in range(p)]
    if eng.puts:
        eng.q[me * _LINE + PUTS] = eng.step + 1 if out is None else 0
    try:
        t = eng.arrive(row)
        if not eng.puts or any(eng.q[r * _LINE + PUTS] != t for r in range(p)):
            _all_reduce_read(eng, buf, dest, b, red, t)
            return
        remote = [int(eng.addr[r, me]) for r in range(p)]
        peers = [(me + i) % p for i in range(1, p)]
        mine = buf[b[me]:b[me + 1]]

        def put(lo: int, hi: int) -> None:
            for r in peers:
                _write(eng, r, remote[r] + lo * isz, mine[lo:hi])

        _reduce_part(eng, mine, mine, remote, red, put)
        eng.sync(OUT, t)
    except BaseException:
        _close(eng)
        raise


def _all_reduce_read(eng: Engine, buf: np.ndarray, dest: np.ndarray, b: List[int],
                     red: Reducer, t: int) -> None:
    """:func:`all_reduce` by reads alone, from step ``t`` (every member arrived): reduce this
    member's part, meet, read the peers' reduced parts, meet."""
    p, me = eng.p, eng.me
    mine = dest[b[me]:b[me + 1]]
    _reduce_part(eng, mine, buf[b[me]:b[me + 1]], [int(eng.addr[r, me]) for r in range(p)], red)
    eng.sync(RED, t)
    for i in range(1, p):
        r = (me + i) % p
        _read(eng, r, dest[b[r]:b[r + 1]], int(eng.addr[r, r]))
    eng.sync(OUT, t)


def reduce_scatter(eng: Engine, dest: np.ndarray, segs: List[np.ndarray],
                   red: Reducer) -> None:
    """``dest`` (flat, contiguous) = the reduction of every member's ``segs[me]``; ``dest``
    overlaps no piece a peer reads (the caller copies them where it would)."""
    p, me = eng.p, eng.me
    t = eng.arrive([_addr(s) for s in segs])
    _reduce_part(eng, dest, segs[me], [int(eng.addr[r, me]) for r in range(p)], red)
    eng.sync(OUT, t)


def all_gather(eng: Engine, src: np.ndarray, outs: List[np.ndarray]) -> None:
    """Every member's ``outs[r]`` (flat bytes) = member r's ``src``; ``src`` overlaps no
    ``outs[k]`` but this member's own (the caller copies it where it would)."""
    p, me = eng.p, eng.me
    t = eng.arrive([_addr(src)] * p)
    if _addr(outs[me]) != _addr(src):
        _copy(outs[me], src)
    for i in range(1, p):
        r = (me + i) % p
        _read(eng, r, outs[r], int(eng.addr[r, 0]))
    eng.sync(OUT, t)


def reduce(eng: Engine, buf: np.ndarray, red: Reducer, root: int) -> None:
    """Reduce of the flat contiguous ``buf`` to member ``root``: the root reads every peer's
    buffer piece by piece and reduces it in rank order into its own; the others' stay as
    they are."""
    t = eng.arrive([_addr(buf)] * eng.p)
    if eng.me == root:
        _reduce_part(eng, buf, buf, [int(eng.addr[r, root]) for r in range(eng.p)], red)
    eng.sync(OUT, t)


def broadcast(eng: Engine, buf: np.ndarray, root: int) -> None:
    """Every member's flat ``buf`` = the root's."""
    t = eng.arrive([_addr(buf)] * eng.p)
    if eng.me != root:
        _read(eng, root, buf, int(eng.addr[root, 0]))
    eng.sync(OUT, t)
