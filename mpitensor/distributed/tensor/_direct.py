"""Redistributions that move each byte once: blocks written into the peers' results.

A gather or a shard swap moves blocks whose rows may be strided on either side: through a
collective they take a packing (or unpacking) pass *and* the collective's own move of every
byte (one copy or more, as the MPI library does it). Where every rank of the group may reach
its peers' memory (same node, same user, ptrace allowed; probed once per group and agreed by
all), each block goes straight from the sender's piece into its place in the receiver's
result, and this rank's own block is one local copy. Every byte is read once and written
once. Two ways, in this order:

* **Mapped results** (:mod:`mapped`): every rank's result is a shared segment from a
  recycled pool, which its peers map; each rank writes its blocks into every rank's result
  with one compiled pass over its piece (``_cpu_kernels.scatter_runs``: a row's chunks go
  to their destinations one after the other, prefetched, with stores that bypass the cache).
  No system call moves a byte. Runs of ``MIN_MAPPED_RUN`` bytes or more.
* **Cross-memory attach** (:mod:`cma_runs`), where a rank's pool has no segment to give:
  one system call per 1024 runs. The side whose runs are strided moves the block, so that
  the peer's side of the call is one range (the kernel pins the peer's pages per range): the
  sender writes (``Shard(i) -> Shard(j)`` with ``i`` before ``j``: its rows' chunks are
  strided, the receiver's block is whole rows), the receiver reads otherwise (``j`` before
  ``i`` and the gather). A read into short strided runs goes through a cache-resident
  staging buffer (:func:`_transfer`). Runs of ``MIN_RUN`` bytes (``MIN_PUSH_RUN`` written).

A call: the ranks exchange the address of the array their peers touch, their result's
segment and a fingerprint of the call (one small all_gather), move the blocks, and agree that
every move succeeded (one small all_reduce, which is also the barrier after which a rank may
read its result and reuse its piece). A fingerprint that differs (a rank with another shape)
or a failed move sends every rank to the collective path, which overwrites the result whole
(and reports a mismatch there). ``MPITENSOR_SHM_COLLECTIVES=off`` and debug mode keep every
call on the collectives.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import weakref
import zlib
from typing import Any, Callable, List, Optional, Sequence, Tuple

import numpy as np

import mpitensor.distributed as dist
from mpitensor._base import config as _config
from mpitensor._base import native as _native
from mpitensor._base import workspace as _workspace

from ..backends.mpi import cma as _cma1
from ..backends.mpi import cma_runs as _cma
from ..backends.mpi import mapped as _mapped
from ..device_mesh import DeviceMesh
from .placement_types import shard_size_and_offset

__all__ = ["swap", "gather", "all_reduce", "set_enabled"]

MIN_BYTES = MIN_BYTES_DEFAULT = 1 << 20  # smaller: the collective beats two small exchanges
MIN_RUN = MIN_RUN_DEFAULT = 512  # bytes: shorter runs cost the system calls more than they save
# a write from strided runs needs longer ones: 1 KiB runs at 4 ranks (1368 bytes at 3) ran
# no faster than the collective path (3.74/2.39x the bare all_to_all against 3.58/2.61x;
# 3.03x against 2.76x), 2 KiB runs at 2 ranks 1.87-2.55x against 3.35-3.65x
MIN_PUSH_RUN = MIN_PUSH_RUN_DEFAULT = 2048
STAGE = STAGE_DEFAULT = 1 << 20  # bytes of the cache-resident buffer strided short runs use
STAGE_RUN = STAGE_RUN_DEFAULT = 64 << 10  # runs this long move straight (copied well)
MIN_MAPPED_RUN = MIN_MAPPED_RUN_DEFAULT = 64  # bytes: runs copied into the peers' mapped results
MAPPED = True  # tests: False keeps every call on cross-memory attach

_probed: "weakref.WeakKeyDictionary[Any, Optional[List[int]]]" = weakref.WeakKeyDictionary()
_enabled = True
_local = threading.local()
_log = logging.getLogger(__name__)


def set_enabled(use: bool) -> bool:
    """Tests: whether redistributions may take the direct path; returns the old setting."""
    global _enabled
    old, _enabled = _enabled, bool(use)
    return old


_copy_runs = _native.function("copy_runs")
_scatter_runs = _native.function("scatter_runs")


# ------------------------------------------------------------------ blocks as runs
class _Block:
    """The block ``[start, start + size)`` per dim of a C-contiguous array of ``shape``."""

    __slots__ = ("shape", "start", "size")

    def __init__(self, shape: Sequence[int], start: Sequence[int], size: Sequence[int]):
        self.shape, self.start, self.size = tuple(shape), tuple(start), tuple(size)

    def whole(self, d: int) -> bool:
        return self.size[d] == self.shape[d]


def _cut(shape: Sequence[int], cuts: Sequence[Tuple[int, int, int]]) -> _Block:
    """The block of ``shape`` that is ``(dim, start, size)`` along each cut dim, whole along
    the others."""
    start, size = [0] * len(shape), list(shape)
    for d, s, n in cuts:
        start[d], size[d] = s, n
    return _Block(shape, start, size)


def _depth(a: _Block, b: _Block) -> int:
    """The first dim of the runs both blocks (of one size) hold contiguous: every dim after
    it is whole in both."""
    t = len(a.shape) - 1
    while t > 0 and a.whole(t) and b.whole(t):
        t -= 1
    return t


def _offsets(b: _Block, t: int, itemsize: int) -> np.ndarray:
    """Byte offsets (int64) of the block's runs in C order, the runs spanning dims ``t..``."""
    strides = [itemsize * math.prod(b.shape[d + 1:]) for d in range(len(b.shape))]
    base = sum(s * st for s, st in zip(b.start, strides))
    offs = np.full(1, base, np.int64)
    for d in range(t):
        offs = (offs[:, None] + np.arange(b.size[d], dtype=np.int64) * strides[d]).reshape(-1)
    return offs


def _runs(a: _Block, b: _Block, itemsize: int) -> Tuple[np.ndarray, np.ndarray, int]:
    """(offsets in ``a``, offsets in ``b``, run bytes) of the same block in two layouts."""
    if math.prod(a.size) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), 0
    t = _depth(a, b)
    return _offsets(a, t, itemsize), _offsets(b, t, itemsize), itemsize * math.prod(a.size[t:])


def _view(arr: np.ndarray, b: _Block) -> np.ndarray:
    return arr[tuple(slice(s, s + n) for s, n in zip(b.start, b.size))]


def _copy_local(dst: np.ndarray, db: _Block, src: np.ndarray, sb: _Block) -> None:
    """This rank's own block through NumPy (where ``_cpu_kernels`` is not built)."""
    if math.prod(db.size):
        np.copyto(_view(dst, db), _view(src, sb))


# ------------------------------------------------------------------ the group's peers
class _Probe:
    """What a group's members may do to one another's memory (agreed by all of them)."""

    __slots__ = ("pids", "cma", "mapped")

    def __init__(self, pids: List[int], cma: bool, mapped: bool):
        self.pids, self.cma, self.mapped = pids, cma, mapped


def _probe(group: Any, k: int) -> Optional[_Probe]:
    """How this group's members may reach every other's memory: cross-memory attach
    (``cma``), mapping the others' shared results (``mapped``); None where neither works for
    every pair, or the path is off. Collective on the first call per group."""
    if not _enabled or _config.DEBUG or _config.shm_collectives() == "off":
        return None
    try:
        return _probed[group]
    except KeyError:
        pass
    token = np.array([int.from_bytes(os.urandom(7), "little")], np.int64)
    seg = _mapped.POOL.empty((1,), np.int64) if _mapped.available() else None
    arr, fd, ino = seg if seg is not None else (None, -1, -1)
    if arr is not None:
        arr[0] = token[0]
    info = np.zeros((k, 5), np.int64)
    dist.all_gather_into_tensor(
        info, np.array([os.getpid(), token.ctypes.data, token[0], fd, ino], np.int64),
        group=group)
    got, cma, mapped = np.zeros(1, np.int64), _cma.available(), (info[:, 3] >= 0).all()
    me = dist.get_rank(group)
    for r in range(k):
        if r == me:
            continue
        if cma:
            try:
                _cma.transfer(int(info[r, 0]), False, got.ctypes.data, np.zeros(1, np.int64),
                              int(info[r, 1]), np.zeros(1, np.int64), 8)
                cma = int(got[0]) == int(info[r, 2])
            except OSError:
                cma = False
        if mapped:
            try:
                peer = _mapped.PEERS.get(int(info[r, 0]), int(info[r, 3]), int(info[r, 4]), 8)
                mapped = int(peer.view(np.int64)[0]) == int(info[r, 2])
            except OSError:
                mapped = False
    flags = np.array([int(cma), int(mapped)], np.int64)
    dist.all_reduce(flags, op=dist.ReduceOp.MIN, group=group)
    seg = arr = None  # the probe's segment goes back to the pool
    found = (_Probe([int(p) for p in info[:, 0]], bool(flags[0]), bool(flags[1]))
             if flags.any() else None)
    try:
        _probed[group] = found
    except TypeError:  # a group that takes no weak reference: probed at each call
        pass
    return found


def _pids(group: Any, k: int) -> Optional[List[int]]:
    """The group members' pids where the direct path may run on it (see :func:`_probe`)."""
    found = _probe(group, k)
    return None if found is None else found.pids


def _fingerprint(*what: Any) -> int:
    return zlib.crc32(repr(what).encode())


def _move(group: Any, pids: List[int], me: int, addr: int, fp: int, plan: Any,
          seg: Tuple[int, int] = (-1, -1)) -> bool:
    """Exchange addresses, fingerprints and result segments (``seg``: fd and inode, -1 where
    this rank's result is not shared), run ``plan(info)`` (the moves; ``info``: one row per
    rank, ``(addr, fp, fd, inode)``), agree they all succeeded. False (on every rank) where
    the collective path must run instead, or ``plan`` returned False (on every rank alike:
    its choice may depend on ``info`` only)."""
    k = len(pids)
    info = np.zeros((k, 4), np.int64)
    dist.all_gather_into_tensor(info, np.array([addr, fp, seg[0], seg[1]], np.int64),
                                group=group)
    if (info[:, 1] != fp).any():
        return False
    ok = True
    try:
        if plan(info) is False:
            return False
    except Exception as exc:  # noqa: BLE001 - every rank must reach the agreement below
        # (a peer gone shows in the agreement itself: the group's health raises there)
        _log.warning("rank %d: a direct redistribution failed (%s); every rank of the group "
                     "takes the collective path for this call", dist.get_rank(), exc)
        ok = False
    flag = np.array([int(ok)], np.int64)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
    return bool(flag[0])


def _worth(nbytes: int, run: int, push: bool, mapped: bool = False) -> bool:
    """Whether the direct path pays: through mapped results (``mapped``), or else through
    cross-memory attach (reads, or writes where ``push``)."""
    if mapped:
        return nbytes >= MIN_BYTES and run >= MIN_MAPPED_RUN
    return nbytes >= MIN_BYTES and run >= (max(MIN_RUN, MIN_PUSH_RUN) if push else MIN_RUN)


# ------------------------------------------------------------------ the redistributions
Pair = Callable[[int, int], Tuple[_Block, _Block]]


def swap(x: np.ndarray, i: int, j: int, n_i: int, mesh: DeviceMesh, m: int) -> Optional[Any]:
    """Shard(i) -> Shard(j) over mesh dim ``m`` (see ``_shard_swap``) moving each byte once:
    this rank's C-contiguous piece, or None where the group takes the all_to_all."""
    k = mesh.size(m)
    full = _cut(x.shape, [(i, 0, n_i)]).size
    rows = [shard_size_and_offset(n_i, k, r) for r in range(k)]  # (size, start) of dim i
    cols = [shard_size_and_offset(x.shape[j], k, r) for r in range(k)]
    piece = [_cut(full, [(i, 0, rows[r][0])]).size for r in range(k)]  # rank r's input
    result = [_cut(full, [(j, 0, cols[r][0])]).size for r in range(k)]  # rank r's output

    def pair(src: int, dst: int) -> Tuple[_Block, _Block]:
        """Rank ``src``'s block for rank ``dst``: where it lies in each one's array."""
        return (_cut(piece[src], [(j, cols[dst][1], cols[dst][0])]),
                _cut(result[dst], [(i, rows[src][1], rows[src][0])]))

    me = mesh.get_coordinate()[m]
    return _run(x, mesh, m, full, result[me], pair, i < j, ("swap", i, j))


def gather(x: np.ndarray, dim: int, n: int, mesh: DeviceMesh, m: int) -> Optional[Any]:
    """Shard(dim) -> Replicate over mesh dim ``m`` (see ``_blocks.gather_dim``), each peer's
    piece read straight into its place: the C-contiguous whole, or None where the group
    takes the all_gather."""
    k = mesh.size(m)
    full = _cut(x.shape, [(dim, 0, n)]).size
    parts = [shard_size_and_offset(n, k, r) for r in range(k)]

    def pair(src: int, dst: int) -> Tuple[_Block, _Block]:
        """Rank ``src``'s piece (whole) and where it lies in the result."""
        size, start = parts[src]
        return _cut(_cut(full, [(dim, 0, size)]).size, []), _cut(full, [(dim, start, size)])

    return _run(x, mesh, m, full, full, pair, False, ("gather", dim))


def _run(x: np.ndarray, mesh: DeviceMesh, m: int, full: Tuple[int, ...],
         shape: Tuple[int, ...], pair: Pair, push: bool, what: tuple) -> Optional[Any]:
    """Move every rank's blocks (``pair(src, dst)``: where rank src's block for rank dst lies
    in src's piece and in dst's result) into this rank's result of ``shape``. Where every
    rank's result is a shared segment (:mod:`mapped`), each rank writes its blocks into its
    peers' results; otherwise the sender writes them where ``push``, the receiver reads them
    (cross-memory attach). None where the group takes the collective."""
    k, me, isz = mesh.size(m), mesh.get_coordinate()[m], x.itemsize
    # rank 0's chunks are the longest: its runs decide (alike on every rank)
    nbytes, run0 = math.prod(full) * isz, _runs(*pair(0, 0), isz)[2]
    if not (_worth(nbytes, run0, push, True) or _worth(nbytes, run0, push)):
        return None
    group = mesh.get_group(m)
    found = _probe(group, k)
    if found is None:
        return None
    mapped = found.mapped and MAPPED and _worth(nbytes, run0, push, True)
    cma = found.cma and _worth(nbytes, run0, push)
    if not (mapped or cma):
        return None
    x = np.ascontiguousarray(x)
    out, fd, ino = ((mapped and _mapped.POOL.empty(shape, x.dtype))
                    or (_workspace.empty(np, shape, x.dtype), -1, -1))

    def plan(info: np.ndarray) -> bool:
        if (info[:, 2] >= 0).all():
            _write_all(x, out, found.pids, me, info, pair)
        elif not cma:  # a rank's pool is full: the runs are too short for the system calls
            return False
        else:
            _attach(x, out, found.pids, me, info[:, 0], pair, push)
            _own(x, out, pair(me, me))
        return True

    fp = _fingerprint(what, full, x.dtype.str)
    ok = _move(group, found.pids, me, _addr(out if push else x), fp, plan, (fd, ino))
    return out if ok else None


def _write_all(x: np.ndarray, out: np.ndarray, pids: List[int], me: int, info: np.ndarray,
               pair: Pair) -> None:
    """Write this rank's block for each rank into that rank's result (the peers': their
    mapped segments), in one pass over ``x`` where the blocks have as many runs each (a
    row's chunks go to their destinations one after the other), one destination after
    another otherwise. The destinations go in rank order: a rank's chunk of a row lies
    before the next rank's, so ``x`` is read front to back (any other order ran 1.5-2.2x
    slower: the hardware's prefetch loses the stream)."""
    k, isz, flat = len(pids), x.itemsize, x.reshape(-1).view(np.uint8)
    dsts, moves = [], []
    for r in range(k):
        sb, db = pair(me, r)
        if r == me:
            dsts.append(out.reshape(-1).view(np.uint8))
        else:
            dsts.append(_mapped.PEERS.get(pids[r], int(info[r, 2]), int(info[r, 3]),
                                          math.prod(db.shape) * isz))
        moves.append((sb, db))
    if _copy_runs is None:
        for dst, (sb, db) in zip(dsts, moves):
            _copy_local(dst.view(x.dtype).reshape(db.shape), db, x, sb)
        return
    runs = [_runs(sb, db, isz) for sb, db in moves]
    if _scatter_runs is not None and len({len(xo) for xo, _, _ in runs}) == 1:
        _scatter_runs(dsts, np.concatenate([do for _, do, _ in runs]), flat,
                      np.concatenate([xo for xo, _, _ in runs]),
                      np.array([n for _, _, n in runs], np.int64))
        return
    for dst, (xoffs, doffs, run) in zip(dsts, runs):
        _copy_runs(dst, doffs, flat, xoffs, run)


def _attach(x: np.ndarray, out: np.ndarray, pids: List[int], me: int, addrs: np.ndarray,
            pair: Pair, push: bool) -> None:
    """Move the peers' blocks by cross-memory attach: this rank writes its own into its
    peers' results where ``push``, reads theirs into its result otherwise."""
    k, isz = len(pids), x.itemsize
    for step in range(1, k):  # the peers' blocks, then this rank's own
        r = (me + step) % k
        if push:
            xoffs, roffs, run = _runs(*pair(me, r), isz)
            _transfer(pids[r], True, x, xoffs, int(addrs[r]), roffs, run)
        else:
            roffs, ooffs, run = _runs(*pair(r, me), isz)
            _transfer(pids[r], False, out, ooffs, int(addrs[r]), roffs, run)


def _own(x: np.ndarray, out: np.ndarray, blocks: Tuple[_Block, _Block]) -> None:
    """This rank's own block: one local copy."""
    sb, db = blocks
    if _copy_runs is None:
        _copy_local(out, db, x, sb)
    else:
        doffs, soffs, run = _runs(db, sb, x.itemsize)
        _copy_runs(out.reshape(-1).view(np.uint8), doffs, x.reshape(-1).view(np.uint8),
                   soffs, run)


def all_reduce(x: np.ndarray, op: Any, mesh: DeviceMesh, m: int) -> Optional[np.ndarray]:
    """Partial -> Replicate over mesh dim ``m`` (``op``: a ``ReduceOp``): a new C-contiguous
    array holding the reduction of every rank's term ``x`` (left as it is), or None where
    the group takes its all_reduce.

    Through mapped results only: each rank reduces one part of the terms (its own part
    where it lies, the peers' read by cross-memory attach into a cache-resident scratch, a
    chunk at a time, in rank order, as the node-local engine reduces them), and writes the
    reduced chunk into every rank's result in one pass. Every byte of a term is read once
    and every byte of a result written once, with stores that bypass the cache; the results
    are the same bits on every rank."""
    from ..backends.mpi.shm_coll import _reducer  # noqa: PLC0415 - the engine's reductions

    k = mesh.size(m)
    if k == 1 or x.nbytes < MIN_BYTES or not MAPPED:
        return None
    red = _reducer(op, x.dtype, k)[1]
    if red is None or red.wide is not None or red.view is not None:
        return None  # (half precision, bool: the engine's own staging)
    group = mesh.get_group(m)
    found = _probe(group, k)
    if found is None or not (found.mapped and found.cma):
        return None
    x = np.ascontiguousarray(x)
    out, fd, ino = _mapped.POOL.empty(x.shape, x.dtype) or (None, -1, -1)
    me = mesh.get_coordinate()[m]

    def plan(info: np.ndarray) -> bool:
        if (info[:, 2] < 0).any():
            return False  # a rank's pool has no segment to give: every rank takes the group's
        dsts = [out.reshape(-1).view(np.uint8) if r == me else
                _mapped.PEERS.get(found.pids[r], int(info[r, 2]), int(info[r, 3]), x.nbytes)
                for r in range(k)]
        _reduce_part(x.reshape(-1), me, found.pids, info[:, 0], red, dsts)
        return True

    fp = _fingerprint(("all_reduce", str(op)), x.shape, x.dtype.str)
    ok = _move(group, found.pids, me, _addr(x), fp, plan, (fd, ino))
    return out if ok else None


REDUCE_CHUNK = 1 << 20  # bytes of each term reduced at a time (see docs/sharding.md)


def _reduce_part(flat: np.ndarray, me: int, pids: List[int], addrs: np.ndarray, red: Any,
                 dsts: List[np.ndarray]) -> None:
    """Reduce part ``me`` of every rank's flat term (rank r's at ``addrs[r]``) and write it
    into every rank's result (``dsts``, bytes)."""
    k, isz, n = len(pids), flat.itemsize, flat.size
    line = max(1, 64 // isz)  # parts start on a cache line (a whole number of elements)
    per = -(-n // k)
    per = -(-per // line) * line
    lo, hi = min(n, me * per), min(n, (me + 1) * per)
    ce = max(line, REDUCE_CHUNK // isz // line * line)
    scratch = _staging((k + 1) * ce * isz)
    pieces = [scratch[r * ce * isz:(r + 1) * ce * isz] for r in range(k + 1)]
    reader = _reader()
    zero, runs, doffs = np.zeros(k, np.int64), np.zeros(k, np.int64), np.zeros(k, np.int64)
    for c0 in range(lo, hi, ce):
        nb = (min(hi, c0 + ce) - c0) * isz
        srcs = []
        for r in range(k):
            if r == me:
                srcs.append(flat[c0:c0 + nb // isz])
            else:
                reader.read(pids[r], _addr(pieces[r]), int(addrs[r]) + c0 * isz, nb)
                srcs.append(pieces[r][:nb].view(flat.dtype))
        red.into(pieces[k][:nb].view(flat.dtype), srcs)
        if _scatter_runs is None:  # (no compiled kernels: NumPy's copies)
            for dst in dsts:
                dst[c0 * isz:c0 * isz + nb] = pieces[k][:nb]
            continue
        runs[:], doffs[:] = nb, c0 * isz
        _scatter_runs(dsts, doffs, pieces[k], zero, runs, 1)


def _reader() -> Any:
    """This thread's reader of peers' memory (its iovecs made once)."""
    reader = getattr(_local, "reader", None)
    if reader is None:
        reader = _local.reader = _cma1.Reader()
    return reader


def _addr(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def _staging(nbytes: int) -> np.ndarray:
    """This thread's staging buffer of at least ``nbytes`` (kept for the next call)."""
    buf = getattr(_local, "stage", None)
    if buf is None or buf.nbytes < nbytes:
        buf = _local.stage = np.empty(nbytes, np.uint8)
    return buf


def _transfer(pid: int, write: bool, local: np.ndarray, local_offs: np.ndarray, remote: int,
              remote_offs: np.ndarray, run: int) -> None:
    """Move the runs between this rank's C-contiguous ``local`` and the peer ``pid``.

    A read into strided short runs goes through a cache-resident staging buffer a slice at a
    time: the kernel moves each slice as one range on this side, and the compiled copy
    scatters it into place with stores that bypass the cache. The kernel's own copy into
    strided short runs reads every destination line before writing it and ran several times
    slower than this (3.5-13 against 2.2-2.9 ms for 16 MiB of 2 KiB runs, 2 ranks, the slower
    under load). A write from strided runs gains nothing so (the kernel reads them as fast
    as a gathering copy would: 2.2-2.6x against 2.5-2.6x the bare all_to_all, paired)."""
    if not run:
        return
    base = _addr(local)
    if (write or _copy_runs is None or run >= STAGE_RUN
            or (len(local_offs) > 1 and (np.diff(local_offs) == run).all())):
        _cma.transfer(pid, write, base, local_offs, remote, remote_offs, run)
        return
    per = max(1, STAGE // run)
    stage = _staging(per * run)
    flat = local.reshape(-1).view(np.uint8)
    inner = np.arange(per, dtype=np.int64) * run
    for lo in range(0, len(local_offs), per):
        hi = min(len(local_offs), lo + per)
        _cma.transfer(pid, False, _addr(stage), inner[:hi - lo], remote, remote_offs[lo:hi], run)
        _copy_runs(flat, local_offs[lo:hi], stage, inner[:hi - lo], run, 1)
