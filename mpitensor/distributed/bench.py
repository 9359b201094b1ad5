"""OSU-style micro-benchmarks of ``mpitensor.distributed``: latency and bandwidth over a size sweep.

Usage (every rank runs it; rank 0 prints)::

    mpiexec -n 2 python -m mpitensor.distributed.bench       # every op, 4 B .. 64 MiB
    mpiexec -n 2 mpitensor-bench --ops all_reduce,p2p --max-bytes 1M --mode barrier
    mpiexec -n 4 python -m mpitensor.distributed.bench --min-bytes 1K --max-bytes 16M --factor 4 \\
        --reps 9 --json results.json
    mpiexec -n 2 python -m mpitensor.distributed.bench --device cuda --backend nccl    # CuPy arrays

Method (the OSU micro-benchmarks' and nccl-tests'):

* For each operation and message size: warm-up calls, then ``--reps`` timed repetitions, each
  timing a batch of calls; the reported time is the median repetition (after taking, per
  repetition, the slowest rank). The batch size is chosen from the warm-up so one repetition
  takes about ``--rep-time`` seconds (fewer calls for large messages); ``--iters`` fixes it.
* ``--mode back-to-back`` times calls issued one after another; ``--mode barrier`` puts an MPI
  barrier before every call and times the call alone (no pipelining between calls);
  ``both`` (default) reports both. ``--mode fresh`` times calls back to back on data written
  just before each call, as a program's gradients or parameters are: every rank writes one
  element of each cache line of what it sends (:func:`line_writer`), then calls; the same
  writes, timed alone in the same repetition, are taken out. Back to back on unchanged
  buffers, a library whose ranks read their peers' memory (MPI's single-copy transfers) finds
  every line it read by the last call still in its own cache; with fresh data it fetches each
  from the writer's. ``all`` runs the three.
* ``size`` is the buffer each rank passes, as in nccl-tests: the tensor for all_reduce,
  broadcast and reduce; the *output* of all_gather (each rank contributes size/n); the *input*
  of reduce_scatter (each rank receives size/n); the input (= output) of all_to_all; the message
  for p2p. Sizes are rounded to whole elements (and to a multiple of n elements where the
  buffer is split among ranks); ``bytes`` in the output is the size actually moved.
* ``p2p_latency`` is the ping-pong between ranks 0 and 1: half the round trip.
  ``p2p_bw`` streams a window of ``--window`` isends from rank 0 to rank 1 (which answers with
  a 4-byte ack per window); its latency column is the time per message of the window.
  ``--ops p2p`` selects both. Other ranks idle during p2p.
* algbw = bytes / latency (GB/s, 1e9 bytes); busbw = algbw × a factor per nccl-tests:
  all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all (n-1)/n; broadcast, reduce and
  p2p 1.

The timing helpers (:func:`measure`, :class:`Api`, :func:`make_case`) are reused by
``benchmarks/compare_collectives.py`` to run raw mpi4py and torch.distributed through the very
same harness.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import platform
import re
import statistics
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .launch import launcher_rank

__all__ = [
    "OPS", "DEFAULT_OPS", "bus_factor", "parse_size", "format_size", "sweep_sizes",
    "element_count", "calibrate", "time_rep", "slowest", "measure", "Api", "MpitensorApi",
    "Case", "make_case", "row_for", "run_sweep", "format_table", "machine_info", "main",
]

#: every operation the benchmark knows, in report order
OPS = ("p2p_latency", "p2p_bw", "all_reduce", "broadcast", "reduce", "all_gather",
       "reduce_scatter", "all_to_all")
#: what runs without ``--ops``
DEFAULT_OPS = OPS
#: names accepted by ``--ops`` besides the ones in :data:`OPS`
OP_ALIASES = {"p2p": ("p2p_latency", "p2p_bw"), "all": OPS,
              "all_gather_into_tensor": ("all_gather",),
              "reduce_scatter_tensor": ("reduce_scatter",),
              "all_to_all_single": ("all_to_all",), "allreduce": ("all_reduce",),
              "bcast": ("broadcast",)}
#: operations whose buffer is split into n equal parts
SPLIT_OPS = ("all_gather", "reduce_scatter", "all_to_all")
MODES = ("back-to-back", "barrier", "fresh")
#: what ``--mode both`` runs; ``--mode all`` runs :data:`MODES`
BOTH = ("back-to-back", "barrier")
#: the cache line :func:`line_writer` writes one element of
LINE = 64
DTYPES = ("float32", "float64", "float16", "int32", "int64", "int8", "uint8", "complex64",
          "complex128")
P2P_WINDOW = 64
#: the window's receive buffers are capped at this many bytes (fewer messages for huge sizes)
P2P_WINDOW_BYTES = 64 << 20

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def bus_factor(op: str, n: int) -> float:
    """The nccl-tests factor that turns algorithm bandwidth into bus bandwidth on n ranks."""
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op in SPLIT_OPS:
        return (n - 1) / n
    if op in ("broadcast", "reduce", "p2p_latency", "p2p_bw"):
        return 1.0
    raise ValueError(f"unknown op {op!r}; known ops: {', '.join(OPS)}")


def parse_size(text: str) -> int:
    """Parse a byte count: ``4096``, ``4K``, ``4KiB``, ``64M``, ``1G`` (binary units).

    Example:
        >>> parse_size("64MiB")
        67108864
    """
    m = _SIZE_RE.match(str(text))
    if m is None:
        raise ValueError(f"invalid size {text!r}: use bytes with an optional K/M/G suffix, "
                         "e.g. 4, 1K, 64MiB")
    value = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if value != int(value):
        raise ValueError(f"invalid size {text!r}: not a whole number of bytes")
    return int(value)


def format_size(nbytes: int) -> str:
    """Render a byte count compactly: 4 B, 64 KiB, 1 MiB (exact binary multiples only)."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def sweep_sizes(min_bytes: int, max_bytes: int, factor: int = 2) -> List[int]:
    """Message sizes from ``min_bytes`` to ``max_bytes`` (inclusive), multiplying by ``factor``."""
    if min_bytes < 1 or max_bytes < min_bytes or factor < 2:
        raise ValueError(f"bad sweep: min {min_bytes}, max {max_bytes}, factor {factor}")
    sizes, s = [], min_bytes
    while s <= max_bytes:
        sizes.append(s)
        s *= factor
    return sizes


def element_count(op: str, nbytes: int, itemsize: int, n: int) -> int:
    """Elements of the per-rank buffer for ``op`` at ``nbytes`` (at least 1; a multiple of n
    where the buffer is split among the n ranks)."""
    count = max(1, nbytes // itemsize)
    if op in SPLIT_OPS:
        count = -(-count // n) * n
    return count


def default_warmup(nbytes: int) -> int:
    """Warm-up calls before timing (OSU uses many for small messages, a few for large)."""
    if nbytes <= 16 << 10:
        return 100
    if nbytes <= 1 << 20:
        return 20
    return 3


def calibrate(fn: Callable[[], Any], comm: Any, nbytes: int, iters: Optional[int] = None,
              warmup: Optional[int] = None, rep_time: float = 0.02, max_iters: int = 10000,
              sync: Optional[Callable[[], Any]] = None,
              barrier: Optional[Callable[[], Any]] = None,
              touch: Optional[Callable[[], Any]] = None) -> int:
    """Run the warm-up calls and return the calls per repetition (the same on every rank).
    With ``touch`` (mode ``fresh``), each warm-up call is ``touch()`` then ``fn()``.

    Without ``iters``, the warm-up is timed (all but its first call, which may pay one-time
    costs: a group's shared-memory engine made and calibrated, MPI's first use of a size) and
    the batch is sized to take about ``rep_time`` seconds on the slowest rank (at least 1
    call, at most ``max_iters``).
    """
    from mpi4py import MPI

    sync = sync or _noop
    if touch is not None:
        fn = _after(touch, fn)
    nwarm = default_warmup(nbytes) if warmup is None else warmup
    if iters is None:
        fn()  # untimed: timed, a one-time cost sized the batch to a single call (issue 29)
        sync()
        nwarm = max(nwarm - 1, 1)
    (barrier or comm.Barrier)()
    t0 = time.perf_counter()
    for _ in range(nwarm):
        fn()
    sync()
    if iters is not None:
        return iters
    est = comm.allreduce((time.perf_counter() - t0) / nwarm, op=MPI.MAX)
    return int(min(max_iters, max(1, rep_time / max(est, 1e-9))))


def time_rep(fn: Callable[[], Any], comm: Any, mode: str, iters: int,
             sync: Optional[Callable[[], Any]] = None,
             barrier: Optional[Callable[[], Any]] = None,
             touch: Optional[Callable[[], Any]] = None) -> float:
    """One timed repetition on this rank: mean seconds per call over ``iters`` calls.

    ``back-to-back`` times the batch after one barrier; ``barrier`` puts a barrier before
    every call and times the calls alone; ``fresh`` times a batch of ``touch()`` then
    ``fn()``, then a batch of ``touch()`` alone, and returns the difference.
    """
    clock = time.perf_counter
    sync = sync or _noop
    barrier = barrier or comm.Barrier
    if mode == "back-to-back":
        barrier()
        t0 = clock()
        for _ in range(iters):
            fn()
        sync()
        return (clock() - t0) / iters
    if mode == "fresh":
        touch = touch or _noop
        barrier()
        t0 = clock()
        for _ in range(iters):
            touch()
            fn()
        sync()
        both = clock() - t0
        barrier()  # (every rank past its calls: the writes alone meet no peer's reads)
        t0 = clock()
        for _ in range(iters):
            touch()
        sync()
        return (both - (clock() - t0)) / iters
    if mode != "barrier":
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    total = 0.0
    for _ in range(iters):
        barrier()
        t0 = clock()
        fn()
        sync()
        total += clock() - t0
    return total / iters


def slowest(comm: Any, samples: Sequence[float]) -> List[float]:
    """Per repetition, the slowest rank's time (every rank gets the list)."""
    return [max(col) for col in zip(*comm.allgather(list(samples)))]


def measure(fn: Callable[[], Any], comm: Any, mode: str, reps: int, nbytes: int,
            iters: Optional[int] = None, warmup: Optional[int] = None, rep_time: float = 0.02,
            max_iters: int = 10000, sync: Optional[Callable[[], Any]] = None,
            barrier: Optional[Callable[[], Any]] = None,
            touch: Optional[Callable[[], Any]] = None) -> Tuple[float, int, List[float]]:
    """Time ``fn`` the OSU way; return (median seconds per call, calls per repetition, samples).

    Every rank of ``comm`` (an mpi4py communicator) must call it with the same arguments.

    Args:
        fn: one operation; called ``warmup + reps × iters`` times on every rank.
        mode: ``"back-to-back"``, ``"barrier"`` (a barrier before each call, not timed) or
            ``"fresh"`` (``touch()`` before each call, its own time taken out).
        reps: timed repetitions; the median is reported.
        nbytes: message size, for the default warm-up count.
        iters: calls per repetition; by default enough for ``rep_time`` seconds (at least 1).
        sync: called before reading the clock (e.g. a CUDA stream synchronize).
        barrier: the barrier to use (default ``comm.Barrier``).
        touch: for ``"fresh"``: this rank's writes of what one call sends
            (:attr:`Case.touch`).

    Returns:
        The median over repetitions of the slowest rank's mean time per call, the calls per
        repetition, and the per-repetition times (slowest rank).

    Example:
        >>> t = mpitensor.zeros(1024)
        >>> sec, iters, _ = measure(lambda: dist.all_reduce(t), MPI.COMM_WORLD, "barrier", 5,
        ...                         4096)
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    touch = touch if mode == "fresh" else None
    iters = calibrate(fn, comm, nbytes, iters, warmup, rep_time, max_iters, sync, barrier,
                      touch)
    worst = slowest(comm, [time_rep(fn, comm, mode, iters, sync, barrier, touch)
                           for _ in range(reps)])
    return statistics.median(worst), iters, worst


def _noop() -> None:
    return None


def _after(first: Callable[[], Any], fn: Callable[[], Any]) -> Callable[[], Any]:
    def both() -> Any:
        first()
        return fn()

    return both


def line_writer(arr: Any) -> Callable[[], Any]:
    """A callable writing zero into one element of every :data:`LINE`-byte stretch of the
    contiguous ``arr`` (NumPy, CuPy or torch), the whole buffer's cache lines then held, dirty,
    by the writer: a buffer just written, as a program's are. Zeros keep the benchmark's
    buffers what they were."""
    size = arr.element_size() if hasattr(arr, "element_size") else arr.itemsize
    view = arr.reshape(-1)[::max(1, LINE // size)]
    return view.zero_ if hasattr(view, "zero_") else functools.partial(view.fill, 0)


# ---------------------------------------------------------------------------- what is timed
def _unprovided(op: str, call: str) -> Callable[..., Callable[[], Any]]:
    """The :class:`Api` method ``op`` of a library that does not provide it (it raises)."""
    def method(self: Any, *args: Any) -> Callable[[], Any]:
        raise NotImplementedError(f"{self.name} provides no {op}")

    method.__name__ = method.__qualname__ = op
    method.__doc__ = f"``{call}``: a zero-argument callable that makes the call."
    return method


class Api:
    """One communication library as the harness sees it.

    Subclasses turn buffers into zero-argument callables (mostly ``functools.partial`` of the
    library function, so that the harness adds the same single call to every library). A
    buffer is whatever the library's functions take (a Tensor, a ``[array, MPI type]`` spec, a
    torch tensor).
    """

    name = "api"
    #: ops this library cannot run (rows are skipped)
    unsupported: Tuple[str, ...] = ()

    def alloc(self, count: int) -> Any:
        """A zero-filled buffer of ``count`` elements (zeros keep repeated SUMs finite)."""
        raise NotImplementedError

    def split(self, buf: Any, parts: int) -> List[Any]:
        """``parts`` equal, disjoint views of ``buf``."""
        raise NotImplementedError

    # what a library provides to be timed on each op: a callable per call (isend/irecv's
    # callables start the call and return its handle)
    send = _unprovided("send", "send(buf, peer)")
    recv = _unprovided("recv", "recv(buf, peer)")
    isend = _unprovided("isend", "isend(buf, peer)")
    irecv = _unprovided("irecv", "irecv(buf, peer)")
    all_reduce = _unprovided("all_reduce", "all_reduce(buf)")
    broadcast = _unprovided("broadcast", "broadcast(buf, root)")
    reduce = _unprovided("reduce", "reduce(buf, root)")
    all_gather = _unprovided("all_gather", "all_gather(out, inp)")
    reduce_scatter = _unprovided("reduce_scatter", "reduce_scatter(out, inp)")
    all_to_all = _unprovided("all_to_all", "all_to_all(out, inp)")

    def waitall(self, handles: List[Any]) -> None:
        for h in handles:
            h.wait()

    def sync(self) -> None:
        """Wait for queued device work (a no-op on the CPU)."""

    def data_of(self, buf: Any) -> Any:
        """The array (NumPy, CuPy, torch) behind a buffer of :meth:`alloc`."""
        return buf

    def touch(self, buf: Any) -> Callable[[], Any]:
        """A callable writing every cache line of ``buf`` (mode ``fresh``: :func:`line_writer`)."""
        return line_writer(self.data_of(buf))


def _dist_call(fn: str) -> Callable[..., Callable[[], Any]]:
    """An :class:`MpitensorApi` method: ``mpitensor.distributed.<fn>`` bound to its arguments."""
    return lambda self, *args: functools.partial(getattr(self.dist, fn), *args)


class MpitensorApi(Api):
    """``mpitensor.distributed`` on Tensors (``array="tensor"``) or bare arrays (``"numpy"``;
    CuPy arrays when ``device="cuda"``)."""

    name = "mpitensor"

    def __init__(self, dtype: str = "float32", array: str = "tensor",
                 device: str = "cpu") -> None:
        import numpy as np

        import mpitensor.distributed as dist

        self.dist = dist
        self.dtype = np.dtype(dtype)
        self.array = array
        self.device = device
        if device == "cuda":
            from mpitensor.backend import get_cupy

            self.xp = get_cupy()
            self._stream_sync = lambda: self.xp.cuda.get_current_stream().synchronize()
        else:
            self.xp = np
            self._stream_sync = None
        self._wrap = _tensor_wrapper() if array == "tensor" else (lambda a: a)

    def alloc(self, count: int) -> Any:
        return self._wrap(self.xp.zeros(count, dtype=self.dtype))

    def split(self, buf: Any, parts: int) -> List[Any]:
        arr = self.data_of(buf)
        step = arr.shape[0] // parts
        return [self._wrap(arr[i * step:(i + 1) * step]) for i in range(parts)]

    def data_of(self, buf: Any) -> Any:
        return buf._data if hasattr(buf, "_data") else buf

    send = _dist_call("send")
    recv = _dist_call("recv")
    isend = _dist_call("isend")
    irecv = _dist_call("irecv")
    all_reduce = _dist_call("all_reduce")
    broadcast = _dist_call("broadcast")
    reduce = _dist_call("reduce")
    all_gather = _dist_call("all_gather_into_tensor")
    reduce_scatter = _dist_call("reduce_scatter_tensor")
    all_to_all = _dist_call("all_to_all_single")

    def sync(self) -> None:
        if self._stream_sync is not None:
            self._stream_sync()


def _tensor_wrapper() -> Callable[[Any], Any]:
    """A function wrapping a NumPy/CuPy array in an ``mpitensor.Tensor`` without a copy."""
    # from the tensor layer, not the package root (which sits above distributed)
    from mpitensor._ops.create import from_numpy
    from mpitensor.tensor import Tensor as tensor_cls

    def wrap(arr: Any) -> Any:
        if type(arr).__module__.startswith("numpy"):
            t = from_numpy(arr)
        else:
            t = tensor_cls(arr)
        if getattr(t, "_data", None) is not arr and not _shares(t._data, arr):
            raise RuntimeError("mpitensor.Tensor copied the benchmark buffer; the benchmark "
                               "needs a Tensor that shares the array's memory")
        return t

    return wrap


def _shares(a: Any, b: Any) -> bool:
    try:
        return a.data.ptr == b.data.ptr if hasattr(a.data, "ptr") else \
            a.__array_interface__["data"][0] == b.__array_interface__["data"][0]
    except Exception:
        return False


class Case:
    """One benchmark at one size: the per-rank callable, what one call stands for, the bytes."""

    __slots__ = ("fn", "divisor", "nbytes", "count", "keep", "touch")

    def __init__(self, fn: Callable[[], Any], divisor: float, nbytes: int, count: int,
                 keep: Any, touch: Callable[[], Any] = _noop) -> None:
        self.fn = fn
        self.divisor = divisor  # messages (or half round trips) per call
        self.nbytes = nbytes
        self.count = count
        self.keep = keep  # buffers the callable uses
        # mode "fresh": this rank's writes of what a call sends (none where it sends nothing,
        # or where what it sends was written by the last call: the ping-pong's receives)
        self.touch = touch


def _ping_pong_case(api: Api, rank: int, count: int, nbytes: int) -> Case:
    """osu_latency: ranks 0 and 1 bounce one message (a call is the round trip)."""
    buf = api.alloc(count)
    fn: Callable[[], Any] = _noop
    if rank in (0, 1):
        peer = 1 - rank
        first = api.send(buf, peer) if rank == 0 else api.recv(buf, peer)
        second = api.recv(buf, peer) if rank == 0 else api.send(buf, peer)

        def fn() -> None:
            first()
            second()

    return Case(fn, 2.0, nbytes, count, buf)


def _window_case(api: Api, rank: int, count: int, nbytes: int, window: int) -> Case:
    """osu_bw: rank 0 sends a window of messages, rank 1 answers each window with an ack."""
    w = max(1, min(window, P2P_WINDOW_BYTES // max(nbytes, 1)))
    ack = api.alloc(1)
    fn: Callable[[], Any] = _noop
    keep: Any = ack
    touch: Callable[[], Any] = _noop
    waitall = api.waitall
    if rank == 0:
        src = api.alloc(count)
        starts = [api.isend(src, 1)] * w
        finish = api.recv(ack, 1)
        keep = (src, ack)
        touch = api.touch(src)
    elif rank == 1:
        dst = api.alloc(count * w)
        starts = [api.irecv(view, 0) for view in api.split(dst, w)]
        finish = api.send(ack, 0)
        keep = (dst, ack)
    if rank in (0, 1):

        def fn() -> None:
            waitall([start() for start in starts])
            finish()

    return Case(fn, float(w), nbytes, count, keep, touch)


def make_case(api: Api, op: str, size: int, rank: int, n: int, itemsize: int,
              window: int = P2P_WINDOW) -> Case:
    """Build the callable timing ``op`` at nominal ``size`` bytes for this rank.

    Raises:
        NotImplementedError: ``api`` does not provide ``op``.
        ValueError: p2p on fewer than 2 ranks, or an unknown op.
    """
    if op in api.unsupported:
        raise NotImplementedError(f"{api.name} does not provide {op}")
    count = element_count(op, size, itemsize, n)
    nbytes = count * itemsize
    if op in ("p2p_latency", "p2p_bw") and n < 2:
        raise ValueError(f"{op} needs at least 2 ranks")
    if op == "p2p_latency":
        return _ping_pong_case(api, rank, count, nbytes)
    if op == "p2p_bw":
        return _window_case(api, rank, count, nbytes, window)
    if op == "all_reduce":
        buf = api.alloc(count)
        return Case(api.all_reduce(buf), 1.0, nbytes, count, buf, api.touch(buf))
    if op == "broadcast":
        buf = api.alloc(count)
        return Case(api.broadcast(buf, 0), 1.0, nbytes, count, buf,
                    api.touch(buf) if rank == 0 else _noop)
    if op == "reduce":
        buf = api.alloc(count)
        return Case(api.reduce(buf, 0), 1.0, nbytes, count, buf, api.touch(buf))
    if op == "all_gather":
        out, inp = api.alloc(count), api.alloc(count // n)
        return Case(api.all_gather(out, inp), 1.0, nbytes, count, (out, inp), api.touch(inp))
    if op == "reduce_scatter":
        out, inp = api.alloc(count // n), api.alloc(count)
        return Case(api.reduce_scatter(out, inp), 1.0, nbytes, count, (out, inp),
                    api.touch(inp))
    if op == "all_to_all":
        out, inp = api.alloc(count), api.alloc(count)
        return Case(api.all_to_all(out, inp), 1.0, nbytes, count, (out, inp), api.touch(inp))
    raise ValueError(f"unknown op {op!r}; known ops: {', '.join(OPS)}")


def row_for(op: str, mode: str, size: int, case: Case, seconds: float, iters: int,
            reps: int, n: int, **extra: Any) -> Dict[str, Any]:
    """One result row: latency in µs, algbw and busbw in GB/s (1e9 bytes per second)."""
    latency = seconds / case.divisor
    algbw = case.nbytes / latency / 1e9 if latency > 0 else 0.0
    row = {"op": op, "mode": mode, "size": size, "bytes": case.nbytes, "count": case.count,
           "ranks": n, "iters": iters, "reps": reps, "latency_us": latency * 1e6,
           "algbw_GBps": algbw, "busbw_GBps": algbw * bus_factor(op, n)}
    row.update(extra)
    return row


def run_sweep(api: Api, comm: Any, ops: Sequence[str], sizes: Sequence[int],
              modes: Sequence[str], reps: int, itemsize: int, iters: Optional[int] = None,
              warmup: Optional[int] = None, rep_time: float = 0.02, window: int = P2P_WINDOW,
              on_row: Optional[Callable[[Dict[str, Any]], None]] = None) -> List[Dict[str, Any]]:
    """Measure every (op, size, mode) for one library; return the rows (on every rank)."""
    rank, n = comm.Get_rank(), comm.Get_size()
    rows = []
    for op in ops:
        for size in sizes:
            case = make_case(api, op, size, rank, n, itemsize, window)
            for mode in modes:
                seconds, used, _ = measure(case.fn, comm, mode, reps, case.nbytes, iters,
                                           warmup, rep_time, sync=api.sync, touch=case.touch)
                row = row_for(op, mode, size, case, seconds, used, reps, n, impl=api.name)
                rows.append(row)
                if on_row is not None:
                    on_row(row)
            del case
    return rows


# ---------------------------------------------------------------------------- output
_COLUMNS = (("op", "{:<14}"), ("mode", "{:<12}"), ("size", "{:>9}"), ("bytes", "{:>10}"),
            ("iters", "{:>6}"), ("latency_us", "{:>12.2f}"), ("algbw_GBps", "{:>11.3f}"),
            ("busbw_GBps", "{:>11.3f}"))
_HEADERS = {"latency_us": "latency(us)", "algbw_GBps": "algbw(GB/s)", "busbw_GBps": "busbw(GB/s)"}


def format_header() -> str:
    """The table's header line."""
    parts = []
    for key, fmt in _COLUMNS:
        width = re.search(r"(\d+)", fmt).group(1)
        align = "<" if "<" in fmt else ">"
        parts.append(f"{_HEADERS.get(key, key):{align}{width}}")
    return "  ".join(parts)


def format_row(row: Dict[str, Any]) -> str:
    """One table line."""
    values = dict(row, size=format_size(row["size"]))
    return "  ".join(fmt.format(values[key]) for key, fmt in _COLUMNS)


def format_table(rows: Sequence[Dict[str, Any]]) -> str:
    """The whole table as text."""
    return "\n".join([format_header(), *(format_row(r) for r in rows)])


def machine_info() -> Dict[str, Any]:
    """Where the numbers come from: CPU, cores, MPI library, package versions."""
    info: Dict[str, Any] = {"python": platform.python_version(), "nproc": os.cpu_count(),
                            "cpu": _cpu_model(), "platform": platform.platform()}
    try:
        import mpi4py
        from mpi4py import MPI

        info["mpi_library"] = " ".join(MPI.Get_library_version().split("\n")[0].split())
        info["mpi4py"] = mpi4py.__version__
    except Exception:  # pragma: no cover - mpi4py is a dependency
        pass
    import numpy as np

    from mpitensor.version import __version__

    info["numpy"] = np.__version__
    info["mpitensor"] = __version__
    return info


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


# ---------------------------------------------------------------------------- command line
class _Parser(argparse.ArgumentParser):
    """argparse that speaks once per job (rank 0) and reports errors on one line."""

    def _print_message(self, message: str, file: Any = None) -> None:
        if launcher_rank() == 0:
            super()._print_message(message, file)

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _ops_arg(text: str) -> Tuple[str, ...]:
    chosen: List[str] = []
    for name in (p.strip().lower().replace("-", "_") for p in text.split(",")):
        if not name:
            continue
        expanded = OP_ALIASES.get(name, (name,) if name in OPS else None)
        if expanded is None:
            raise argparse.ArgumentTypeError(
                f"unknown op {name!r}; choose from {', '.join(OPS)} or p2p, all")
        chosen.extend(o for o in expanded if o not in chosen)
    if not chosen:
        raise argparse.ArgumentTypeError("no op given")
    return tuple(o for o in OPS if o in chosen)


def _size_arg(text: str) -> int:
    try:
        value = parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"size must be at least 1 byte, got {text!r}")
    if value > 1 << 32:
        raise argparse.ArgumentTypeError(f"size {text!r} exceeds 4 GiB")
    return value


def _number_arg(parse: Callable[[str], Any], ok: Callable[[Any], bool],
                expected: str) -> Callable[[str], Any]:
    """An argparse ``type``: ``parse(text)``, refused unless ``ok`` (the message says
    ``expected``)."""
    def check(text: str) -> Any:
        try:
            value = parse(text)
        except ValueError:
            value = None
        if value is None or not ok(value):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value

    return check


_positive_int = _number_arg(int, lambda v: v >= 1, "a positive integer")
_non_negative_int = _number_arg(int, lambda v: v >= 0, "an integer >= 0")
_positive_float = _number_arg(float, lambda v: v > 0 and not math.isinf(v), "a positive number")


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``python -m mpitensor.distributed.bench`` / ``mpitensor-bench``."""
    p = _Parser(
        prog="mpitensor-bench",
        description="OSU-style latency/bandwidth sweep of mpitensor.distributed collectives and "
                    "point-to-point operations. Run under mpiexec, e.g. "
                    "`mpiexec -n 2 python -m mpitensor.distributed.bench --max-bytes 1M`.",
        epilog="Sizes take K/M/G suffixes (binary: 1K = 1024). busbw follows nccl-tests: "
               "all_reduce algbw*2(n-1)/n; all_gather, reduce_scatter, all_to_all "
               "algbw*(n-1)/n; broadcast, reduce, p2p algbw.")
    p.add_argument("--ops", type=_ops_arg, default=DEFAULT_OPS, metavar="OP[,OP...]",
                   help=f"operations to run (default: all): {', '.join(OPS)}; 'p2p' means "
                        "p2p_latency,p2p_bw")
    p.add_argument("--min-bytes", type=_size_arg, default=4, metavar="SIZE",
                   help="smallest message size (default 4)")
    p.add_argument("--max-bytes", type=_size_arg, default=64 << 20, metavar="SIZE",
                   help="largest message size (default 64M)")
    p.add_argument("--factor", type=int, choices=(2, 4), default=2,
                   help="size step: powers of 2 or of 4 (default 2)")
    p.add_argument("--reps", type=_positive_int, default=5,
                   help="timed repetitions per size; the median is reported (default 5)")
    p.add_argument("--iters", type=_positive_int, default=None,
                   help="calls per repetition (default: enough for --rep-time seconds, fewer "
                        "for large messages)")
    p.add_argument("--warmup", type=_non_negative_int, default=None,
                   help="warm-up calls per size (default 100 up to 16 KiB, 20 up to 1 MiB, "
                        "3 above)")
    p.add_argument("--rep-time", type=_positive_float, default=0.02, metavar="SECONDS",
                   help="target duration of one repetition when --iters is not given "
                        "(default 0.02)")
    p.add_argument("--window", type=_positive_int, default=P2P_WINDOW,
                   help=f"isends in flight for p2p_bw (default {P2P_WINDOW}; capped so the "
                        "receive window stays within 64 MiB)")
    p.add_argument("--mode", choices=("back-to-back", "barrier", "fresh", "both", "all"),
                   default="both",
                   help="time calls back to back, with a barrier before each, or both "
                        "(default both); fresh: back to back on data each rank writes just "
                        "before each call (the writes' own time taken out); all: the three")
    p.add_argument("--dtype", choices=DTYPES, default="float32",
                   help="element type (default float32)")
    p.add_argument("--array", choices=("tensor", "numpy"), default="tensor",
                   help="pass mpitensor.Tensor objects or bare arrays (NumPy, or CuPy with "
                        "--device cuda) to mpitensor (default tensor)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="where buffers live; cuda needs CuPy and a GPU (default cpu)")
    p.add_argument("--backend", choices=("mpi", "nccl"), default=None,
                   help="process-group backend (default: nccl with --device cuda when NCCL is "
                        "available, else mpi)")
    p.add_argument("--json", metavar="PATH", default=None,
                   help="also write every row, with the run's settings and machine, as JSON")
    p.add_argument("--quiet", action="store_true", help="print no table (use with --json)")
    return p


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """Parse and cross-check the arguments (exit 2 with a one-line error when they are bad)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.max_bytes < args.min_bytes:
        parser.error(f"--max-bytes ({args.max_bytes}) is smaller than --min-bytes "
                     f"({args.min_bytes})")
    if args.device == "cuda":
        from mpitensor.backend import cupy_unavailable_reason

        reason = cupy_unavailable_reason()
        if reason:
            parser.error(f"--device cuda is unavailable: {reason}")
    if args.backend == "nccl" and args.device != "cuda":
        parser.error("--backend nccl needs --device cuda (NCCL moves GPU buffers)")
    if args.backend is None:
        args.backend = "mpi"
        if args.device == "cuda":
            from mpitensor.backend import nccl_unavailable_reason

            args.backend = "nccl" if nccl_unavailable_reason() == "" else "mpi"
    if args.json:
        folder = os.path.dirname(os.path.abspath(args.json))
        if not os.path.isdir(folder):
            parser.error(f"--json: folder {folder} does not exist")
    args.modes = modes_of(args.mode)
    return args


def modes_of(mode: str) -> Tuple[str, ...]:
    """The modes a ``--mode`` value runs."""
    return BOTH if mode == "both" else MODES if mode == "all" else (mode,)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the benchmark; rank 0 prints the table (and writes ``--json``). Returns 0."""
    args = parse_args(argv)
    import numpy as np

    import mpitensor.distributed as dist

    dist.init_process_group(backend=args.backend)
    from mpi4py import MPI

    comm = MPI.COMM_WORLD.Dup()  # the harness's own barriers and reductions
    rank, n = comm.Get_rank(), comm.Get_size()
    ops = args.ops
    skipped = []
    if n < 2:
        skipped = [o for o in ops if o.startswith("p2p")]
        ops = tuple(o for o in ops if not o.startswith("p2p"))
    sizes = sweep_sizes(args.min_bytes, args.max_bytes, args.factor)
    itemsize = np.dtype(args.dtype).itemsize
    api = MpitensorApi(args.dtype, args.array, args.device)
    settings = {k: getattr(args, k) for k in ("reps", "iters", "warmup", "rep_time", "window",
                                               "dtype", "array", "device", "backend")}
    settings.update(ops=list(ops), sizes=sizes, modes=list(args.modes), ranks=n,
                    debug=dist.get_debug(), command=" ".join(sys.argv))
    show = rank == 0 and not args.quiet
    if show:
        print(f"# mpitensor-bench: {n} ranks, {args.dtype} {args.array} on {args.device}, "
              f"backend {args.backend}, reps {args.reps}, median of the slowest rank"
              + (" [MPITENSOR_DEBUG on: argument checks included]" if settings["debug"] else ""))
        if skipped:
            print(f"# skipped {', '.join(skipped)}: point-to-point needs at least 2 ranks")
        print(format_header(), flush=True)
    rows = run_sweep(api, comm, ops, sizes, args.modes, args.reps, itemsize, args.iters,
                     args.warmup, args.rep_time, args.window,
                     on_row=(lambda r: print(format_row(r), flush=True)) if show else None)
    for r in rows:
        r.update(dtype=args.dtype, array=args.array, device=args.device, backend=args.backend)
    if rank == 0 and args.json:
        payload = {"settings": settings, "machine": machine_info(),
                   "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "rows": rows}
        with open(args.json, "w") as f:
            json.dump(payload, f, indent=1)
            f.write("\n")
    comm.Barrier()
    comm.Free()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
