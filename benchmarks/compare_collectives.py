"""mpitensor against raw mpi4py and torch.distributed (gloo), in one run, size by size.

Run::

    mpiexec -n 2 python benchmarks/compare_collectives.py            # full sweep, writes docs/
    mpiexec -n 2 python benchmarks/compare_collectives.py --quick    # 4 B .. 4 MiB, fewer reps
    mpiexec -n 2 python benchmarks/compare_collectives.py --ops all_reduce,p2p \\
        --max-bytes 1M --out-md /tmp/b.md --out-png /tmp/b.png --json /tmp/b.json

Three libraries go through the same harness (``mpitensor.distributed.bench``: OSU method, median of
repetitions, slowest rank), on the same sizes, interleaved repetition by repetition (the order
rotates every repetition) so that noise on this shared machine hits them alike:

* ``mpi4py``: raw buffer calls (``Send``/``Recv``, ``Allreduce(MPI.IN_PLACE, ...)``,
  ``Bcast``, ``Reduce``, ``Allgather``, ``Reduce_scatter_block``, ``Alltoall``) on NumPy
  arrays: the floor that a Python layer over MPI can reach;
* ``mpitensor``: ``mpitensor.distributed`` on ``mpitensor.Tensor`` (``--array numpy`` for bare
  arrays);
* ``gloo``: ``torch.distributed`` with the gloo backend (TCP rendezvous on 127.0.0.1, rank and
  size from MPI), where torch is installed;
* and, at small sizes, ``mpi4py-pickle``: lowercase ``comm.send``/``comm.recv`` and
  ``comm.allreduce`` on a NumPy array, what the tensor API must never fall onto.

It writes ``docs/benchmarks-collectives.md`` (machine, command, targets with MET/NOT MET, tables),
``docs/img/collectives.png`` (latency against size, one panel per op) and, with ``--json``,
every row.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import shlex
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run from a checkout without installing

import mpitensor  # noqa: E402,F401 - first, as in a user's program: MPI starts with its settings

# isort: split
import numpy as np  # noqa: E402
from _torch_baseline import free_port, torch_missing_reason  # noqa: E402 (this folder)
from mpi4py import MPI  # noqa: E402

from mpitensor._base import config as _config  # noqa: E402
from mpitensor.distributed import bench as B  # noqa: E402

MPI4PY, MPITENSOR, GLOO, PICKLE = "mpi4py", "mpitensor", "gloo", "mpi4py-pickle"
PICKLE_OPS = ("p2p_latency", "all_reduce")
#: per timing mode: the title of its tables, and the summary they fold under (None: shown)
MODE_TITLES = {
    "back-to-back": ("calls back to back", None),
    "barrier": ("a barrier before every call (not timed)", "Barrier mode tables"),
    "fresh": ("calls back to back on inputs written just before each call (the writes' own "
              "time, measured alone, taken out)", None)}
LABELS = {"p2p_latency": "p2p latency (ping-pong / 2)", "p2p_bw": "p2p bandwidth (window)",
          "all_reduce": "all_reduce", "broadcast": "broadcast", "reduce": "reduce",
          "all_gather": "all_gather (into tensor)", "reduce_scatter": "reduce_scatter (tensor)",
          "all_to_all": "all_to_all (single)"}


# ---------------------------------------------------------------------------- libraries
class Mpi4pyApi(B.Api):
    """Raw mpi4py buffer methods on ``[array, MPI datatype]`` specs: the floor."""

    name = MPI4PY

    def __init__(self, comm: MPI.Comm, dtype: str) -> None:
        self.comm = comm
        self.dtype = np.dtype(dtype)
        # predefined types: MPICH refuses reductions on dtlib's duplicated ones
        self.mt = {"float32": MPI.FLOAT, "float64": MPI.DOUBLE, "int32": MPI.INT32_T,
                   "int64": MPI.INT64_T}[self.dtype.name]
        self.rank = comm.Get_rank()

    def alloc(self, count: int) -> Any:
        return [np.zeros(count, dtype=self.dtype), self.mt]

    def data_of(self, buf: Any) -> Any:
        return buf[0]

    def split(self, buf: Any, parts: int) -> List[Any]:
        arr = self.data_of(buf)
        step = arr.shape[0] // parts
        return [[arr[i * step:(i + 1) * step], self.mt] for i in range(parts)]

    def send(self, buf: Any, peer: int) -> Callable[[], Any]:
        return functools.partial(self.comm.Send, buf, peer)

    def recv(self, buf: Any, peer: int) -> Callable[[], Any]:
        return functools.partial(self.comm.Recv, buf, peer)

    def isend(self, buf: Any, peer: int) -> Callable[[], Any]:
        return functools.partial(self.comm.Isend, buf, peer)

    def irecv(self, buf: Any, peer: int) -> Callable[[], Any]:
        return functools.partial(self.comm.Irecv, buf, peer)

    def waitall(self, handles: List[Any]) -> None:
        MPI.Request.Waitall(handles)

    def all_reduce(self, buf: Any) -> Callable[[], Any]:
        return functools.partial(self.comm.Allreduce, MPI.IN_PLACE, buf, MPI.SUM)

    def broadcast(self, buf: Any, root: int) -> Callable[[], Any]:
        return functools.partial(self.comm.Bcast, buf, root)

    def reduce(self, buf: Any, root: int) -> Callable[[], Any]:
        if self.rank == root:
            return functools.partial(self.comm.Reduce, MPI.IN_PLACE, buf, MPI.SUM, root)
        return functools.partial(self.comm.Reduce, buf, None, MPI.SUM, root)

    def all_gather(self, out: Any, inp: Any) -> Callable[[], Any]:
        return functools.partial(self.comm.Allgather, inp, out)

    def reduce_scatter(self, out: Any, inp: Any) -> Callable[[], Any]:
        return functools.partial(self.comm.Reduce_scatter_block, inp, out, MPI.SUM)

    def all_to_all(self, out: Any, inp: Any) -> Callable[[], Any]:
        return functools.partial(self.comm.Alltoall, inp, out)


class PickleApi(B.Api):
    """mpi4py's lowercase (pickle) methods on NumPy arrays: the path to avoid."""

    name = PICKLE
    unsupported = tuple(op for op in B.OPS if op not in PICKLE_OPS)

    def __init__(self, comm: MPI.Comm, dtype: str) -> None:
        self.comm = comm
        self.dtype = np.dtype(dtype)

    def alloc(self, count: int) -> Any:
        return np.zeros(count, dtype=self.dtype)

    def send(self, buf: Any, peer: int) -> Callable[[], Any]:
        return functools.partial(self.comm.send, buf, peer)

    def recv(self, buf: Any, peer: int) -> Callable[[], Any]:
        return functools.partial(self.comm.recv, None, peer)

    def all_reduce(self, buf: Any) -> Callable[[], Any]:
        return functools.partial(self.comm.allreduce, buf)


class GlooApi(B.Api):
    """``torch.distributed`` with the gloo backend on CPU tensors."""

    name = GLOO

    def __init__(self, comm: MPI.Comm, dtype: str) -> None:
        import torch
        import torch.distributed as tdist

        self.torch, self.tdist = torch, tdist
        self.dtype = getattr(torch, dtype)
        port = free_port() if comm.Get_rank() == 0 else None
        port = comm.bcast(port, 0)
        tdist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                                 rank=comm.Get_rank(), world_size=comm.Get_size())
        # newer torch renamed these two; take the current names where they exist
        self._gather = getattr(tdist, "all_gather_single", tdist.all_gather_into_tensor)
        self._scatter = getattr(tdist, "reduce_scatter_single", tdist.reduce_scatter_tensor)

    def close(self) -> None:
        self.tdist.destroy_process_group()

    def alloc(self, count: int) -> Any:
        return self.torch.zeros(count, dtype=self.dtype)

    def split(self, buf: Any, parts: int) -> List[Any]:
        return list(buf.chunk(parts))

    def send(self, buf: Any, peer: int) -> Callable[[], Any]:
        return functools.partial(self.tdist.send, buf, peer)

    def recv(self, buf: Any, peer: int) -> Callable[[], Any]:
        return functools.partial(self.tdist.recv, buf, peer)

    def isend(self, buf: Any, peer: int) -> Callable[[], Any]:
        return functools.partial(self.tdist.isend, buf, peer)

    def irecv(self, buf: Any, peer: int) -> Callable[[], Any]:
        return functools.partial(self.tdist.irecv, buf, peer)

    def all_reduce(self, buf: Any) -> Callable[[], Any]:
        return functools.partial(self.tdist.all_reduce, buf)

    def broadcast(self, buf: Any, root: int) -> Callable[[], Any]:
        return functools.partial(self.tdist.broadcast, buf, root)

    def reduce(self, buf: Any, root: int) -> Callable[[], Any]:
        return functools.partial(self.tdist.reduce, buf, root)

    def all_gather(self, out: Any, inp: Any) -> Callable[[], Any]:
        return functools.partial(self._gather, out, inp)

    def reduce_scatter(self, out: Any, inp: Any) -> Callable[[], Any]:
        return functools.partial(self._scatter, out, inp)

    def all_to_all(self, out: Any, inp: Any) -> Callable[[], Any]:
        return functools.partial(self.tdist.all_to_all_single, out, inp)


# ---------------------------------------------------------------------------- the sweep
def run(comm: MPI.Comm, apis: Sequence[B.Api], pickle_api: Optional[B.Api], args: Any,
        log: Callable[[str], None]) -> List[Dict[str, Any]]:
    """Measure every (op, size, mode) for every library, interleaved per repetition."""
    rank, n = comm.Get_rank(), comm.Get_size()
    sizes = B.sweep_sizes(args.min_bytes, args.max_bytes, args.factor)
    itemsize = np.dtype(args.dtype).itemsize
    rows: List[Dict[str, Any]] = []
    for op in args.ops:
        for size in sizes:
            libs = [a for a in apis if op not in a.unsupported]
            if pickle_api is not None and op in PICKLE_OPS and size <= args.pickle_max_bytes:
                libs.append(pickle_api)
            cases = {a.name: B.make_case(a, op, size, rank, n, itemsize, args.window)
                     for a in libs}
            syncs = {a.name: a.sync for a in libs}
            for mode in args.modes:
                touches = {name: c.touch if mode == "fresh" else None
                           for name, c in cases.items()}
                iters = {name: B.calibrate(c.fn, comm, c.nbytes, args.iters, args.warmup,
                                           args.rep_time, sync=syncs[name],
                                           touch=touches[name])
                         for name, c in cases.items()}
                names = list(cases)
                samples: Dict[str, List[float]] = {name: [] for name in names}
                for r in range(args.reps):
                    for name in names[r % len(names):] + names[:r % len(names)]:
                        samples[name].append(B.time_rep(cases[name].fn, comm, mode,
                                                        iters[name], syncs[name],
                                                        touch=touches[name]))
                found = {}
                for name in names:
                    worst = B.slowest(comm, samples[name])
                    row = B.row_for(op, mode, size, cases[name], statistics.median(worst),
                                    iters[name], args.reps, n, impl=name, dtype=args.dtype,
                                    samples_us=[t / cases[name].divisor * 1e6 for t in worst])
                    rows.append(row)
                    found[name] = row
                log(_progress(op, size, mode, found))
            del cases
    return rows


def _progress(op: str, size: int, mode: str, found: Dict[str, Dict[str, Any]]) -> str:
    parts = []
    base = found.get(MPITENSOR)
    for name, row in found.items():
        text = f"{name} {row['latency_us']:.2f} us"
        if base is not None and name != MPITENSOR and base["latency_us"] > 0:
            text += f" ({row['latency_us'] / base['latency_us']:.2f}x mpitensor)"
        parts.append(text)
    return f"{op:<14} {B.format_size(size):>8} {mode:<12} " + ", ".join(parts)


# ---------------------------------------------------------------------------- statistics
def paired_ratio(a: Dict[str, Any], b: Dict[str, Any]) -> float:
    """Latency ratio a / b as the median of per-repetition ratios.

    Repetition r of every library ran within a few tens of milliseconds of the others (the
    libraries alternate repetition by repetition), so pairing them cancels most of the load
    that comes and goes on a shared machine; falls back to the ratio of medians.
    """
    sa, sb = a.get("samples_us"), b.get("samples_us")
    if sa and sb and len(sa) == len(sb):
        return statistics.median(x / y for x, y in zip(sa, sb) if y > 0)
    return a["latency_us"] / b["latency_us"]


def paired_diff(a: Dict[str, Any], b: Dict[str, Any]) -> float:
    """Latency difference a − b in µs, the median of per-repetition differences."""
    sa, sb = a.get("samples_us"), b.get("samples_us")
    if sa and sb and len(sa) == len(sb):
        return statistics.median(x - y for x, y in zip(sa, sb))
    return a["latency_us"] - b["latency_us"]


# ---------------------------------------------------------------------------- targets
def _index(rows: Sequence[Dict[str, Any]]) -> Dict[Tuple[str, str, str, int], Dict[str, Any]]:
    return {(r["impl"], r["op"], r["mode"], r["size"]): r for r in rows}


def evaluate_targets(rows: Sequence[Dict[str, Any]], mode: str = "back-to-back") -> List[dict]:
    """The issue's targets (2 ranks): each with the measured value and whether it is met."""
    idx = _index(rows)
    sizes = sorted({r["size"] for r in rows})
    out = []

    def pairs(op: str, a: str, b: str, pick: Callable[[int], bool]) -> List[tuple]:
        return [(s, idx[(a, op, mode, s)], idx[(b, op, mode, s)]) for s in sizes
                if pick(s) and (a, op, mode, s) in idx and (b, op, mode, s) in idx]

    for op, bw_op in (("p2p_latency", "p2p_bw"), ("all_reduce", "all_reduce")):
        small = pairs(op, MPITENSOR, MPI4PY, lambda s: s <= 1024)
        name = f"{op.split('_')[0] if op.startswith('p2p') else op} latency within +2 µs of raw " \
               f"mpi4py, 4 B–1 KiB"
        if small:
            diffs = [(paired_diff(m, r), s) for s, m, r in small]
            med = statistics.median(d for d, _ in diffs)
            worst = max(diffs)
            out.append({"target": name, "value": med,
                        "measured": f"median {med:+.2f} µs over {len(diffs)} sizes (worst "
                                    f"{worst[0]:+.2f} µs at {B.format_size(worst[1])})",
                        "met": med <= 2.0})
        big = pairs(bw_op, MPITENSOR, MPI4PY, lambda s: s >= 1 << 20)
        name = f"{'p2p' if op.startswith('p2p') else op} bandwidth ≥ 0.95× raw mpi4py, ≥ 1 MiB"
        if big:
            ratios = [(paired_ratio(r, m), s) for s, m, r in big]  # bandwidth: inverse
            med = statistics.median(x for x, _ in ratios)
            worst = min(ratios)
            out.append({"target": name, "value": med,
                        "measured": f"median {med:.3f}× over {len(ratios)} sizes (worst "
                                    f"{worst[0]:.3f}× at {B.format_size(worst[1])})",
                        "met": med >= 0.95})
    for op, bw_op in (("p2p_latency", "p2p_bw"), ("all_reduce", "all_reduce")):
        label = "p2p" if op.startswith("p2p") else op
        tiny = pairs(op, GLOO, MPITENSOR, lambda s: s == 4)
        if tiny:
            _, g, m = tiny[0]
            ratio = paired_ratio(g, m)
            out.append({"target": f"{label} latency ≥ 20× lower than torch gloo at 4 B",
                        "value": ratio,
                        "measured": f"{ratio:.1f}× (gloo {g['latency_us']:.1f} µs, mpitensor "
                                    f"{m['latency_us']:.2f} µs)", "met": ratio >= 20})
        mid = pairs(bw_op, GLOO, MPITENSOR, lambda s: s == 4 << 20)
        if mid:
            _, g, m = mid[0]
            ratio = paired_ratio(g, m)  # bandwidth ratio mpitensor / gloo
            out.append({"target": f"{label} bandwidth ≥ 2× torch gloo at 4 MiB", "value": ratio,
                        "measured": f"{ratio:.2f}× (mpitensor {m['algbw_GBps']:.2f} GB/s, "
                                    f"gloo {g['algbw_GBps']:.2f} GB/s)", "met": ratio >= 2})
    return out


# ---------------------------------------------------------------------------- copy bandwidth
SHM_OPS = ("all_reduce", "reduce_scatter", "all_gather")  # issue 29's collectives


def copy_bandwidth(comm: MPI.Comm, nbytes: int = 64 << 20, reps: int = 5) -> float:
    """The machine's copy bandwidth (GB/s): one core (rank 0, the others asleep, not spinning
    in MPI: with more ranks than cores a spinning rank would take the core from the copy)
    copying ``nbytes`` with ``np.copyto``, best of ``reps``; the same number on every rank."""
    best = float("inf")
    if comm.Get_rank() == 0:
        src = np.ones(nbytes // 8)
        dst = np.empty_like(src)
        np.copyto(dst, src)  # first touch
        for _ in range(reps):
            t0 = time.perf_counter()
            np.copyto(dst, src)
            best = min(best, time.perf_counter() - t0)
    done = comm.Ibarrier()
    while not done.Test():
        time.sleep(0.002)
    return comm.bcast(nbytes / best / 1e9 if comm.Get_rank() == 0 else None, root=0)


def shm_targets(rows: Sequence[Dict[str, Any]], copy_bw: float, ranks: int,
                mode: str = "back-to-back") -> List[dict]:
    """Issue 29's targets: large calls (≥ 16 MiB) at ≥ 2.5× raw MPI's bus bandwidth (2 ranks)
    and ≥ 40 % of the copy bandwidth; never slower than raw MPI (from 64 KiB)."""
    idx = _index(rows)
    out: List[dict] = []
    for op in SHM_OPS:
        pairs = [(s, idx[(MPITENSOR, op, mode, s)], idx[(MPI4PY, op, mode, s)])
                 for s in sorted({r["size"] for r in rows})
                 if (MPITENSOR, op, mode, s) in idx and (MPI4PY, op, mode, s) in idx]
        big = [(paired_ratio(r, m), m["busbw_GBps"] / copy_bw, s) for s, m, r in pairs
               if s >= 16 << 20]
        if big:
            ratio = statistics.median(b[0] for b in big)
            frac = statistics.median(b[1] for b in big)
            if ranks == 2:
                out.append({"target": f"{op} bus bandwidth ≥ 2.5× raw MPI, ≥ 16 MiB",
                            "value": ratio, "measured": f"median {ratio:.2f}× over "
                            f"{len(big)} sizes", "met": ratio >= 2.5})
            out.append({"target": f"{op} bus bandwidth ≥ 40 % of one core's copy, ≥ 16 MiB",
                        "value": frac, "measured": f"median {100 * frac:.0f} % of "
                        f"{copy_bw:.1f} GB/s", "met": frac >= 0.4})
        if pairs:
            worst = min((paired_ratio(r, m), s) for s, m, r in pairs)
            out.append({"target": f"{op} never slower than raw MPI (bandwidth ≥ 0.95×)",
                        "value": worst[0], "measured": f"worst {worst[0]:.2f}× at "
                        f"{B.format_size(worst[1])}", "met": worst[0] >= 0.95})
    if mode != "back-to-back":
        for t in out:
            t["target"] += f" [{mode} inputs]" if mode == "fresh" else f" [{mode}]"
    return out


def shm_table(rows: Sequence[Dict[str, Any]], op: str, copy_bw: float,
              mode: str = "back-to-back") -> str:
    """Bus bandwidth of mpitensor and raw MPI, their ratio, and each as a fraction of the
    copy bandwidth, size by size."""
    idx = _index(rows)
    lines = ["| size | mpitensor busbw GB/s | mpi4py busbw GB/s | mpitensor / mpi4py | "
             "mpitensor / copy | mpi4py / copy |", "|---|---|---|---|---|---|"]
    for s in sorted({r["size"] for r in rows if r["op"] == op and r["mode"] == mode}):
        m, r = idx.get((MPITENSOR, op, mode, s)), idx.get((MPI4PY, op, mode, s))
        if m is None or r is None:
            continue
        lines.append(f"| {B.format_size(s)} | {_fmt_bw(m['busbw_GBps'])} | "
                     f"{_fmt_bw(r['busbw_GBps'])} | {_fmt_ratio(paired_ratio(r, m))} | "
                     f"{100 * m['busbw_GBps'] / copy_bw:.0f} % | "
                     f"{100 * r['busbw_GBps'] / copy_bw:.0f} % |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------- report
def _fmt_us(x: Optional[float]) -> str:
    if x is None:
        return "–"
    return f"{x:.2f}" if x < 100 else f"{x:,.0f}"


def _fmt_ratio(x: Optional[float]) -> str:
    return "–" if x is None else (f"{x:.2f}×" if x < 100 else f"{x:,.0f}×")


def _fmt_bw(x: Optional[float]) -> str:
    return "–" if x is None else (f"{x:.3f}" if x < 10 else f"{x:.2f}")


def op_table(rows: Sequence[Dict[str, Any]], op: str, mode: str, impls: Sequence[str]) -> str:
    """One markdown table: latency and bus bandwidth per library, with the ratios."""
    idx = _index(rows)
    sizes = sorted({r["size"] for r in rows if r["op"] == op and r["mode"] == mode})
    have_gloo = GLOO in impls
    head = ["size", "mpi4py µs", "mpitensor µs"]
    head += ["gloo µs"] if have_gloo else []
    head += ["mpitensor / mpi4py"] + (["gloo / mpitensor"] if have_gloo else [])
    head += ["mpi4py busbw GB/s", "mpitensor busbw GB/s"]
    head += ["gloo busbw GB/s"] if have_gloo else []
    head += ["BW mpitensor / mpi4py"] + (["BW mpitensor / gloo"] if have_gloo else [])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def ratio(a: Optional[Dict[str, Any]], b: Optional[Dict[str, Any]]) -> Optional[float]:
        return paired_ratio(a, b) if a and b else None

    for s in sizes:
        r = {name: idx.get((name, op, mode, s)) for name in (MPI4PY, MPITENSOR, GLOO)}
        lat = {k: (v["latency_us"] if v else None) for k, v in r.items()}
        bw = {k: (v["busbw_GBps"] if v else None) for k, v in r.items()}
        nbytes = next(x["bytes"] for x in r.values() if x)
        label = B.format_size(s) + ("" if nbytes == s else f" ({nbytes} B)")
        cells = [label, _fmt_us(lat[MPI4PY]), _fmt_us(lat[MPITENSOR])]
        cells += [_fmt_us(lat[GLOO])] if have_gloo else []
        cells += [_fmt_ratio(ratio(r[MPITENSOR], r[MPI4PY]))]
        cells += [_fmt_ratio(ratio(r[GLOO], r[MPITENSOR]))] if have_gloo else []
        cells += [_fmt_bw(bw[MPI4PY]), _fmt_bw(bw[MPITENSOR])]
        cells += [_fmt_bw(bw[GLOO])] if have_gloo else []
        cells += [_fmt_ratio(ratio(r[MPI4PY], r[MPITENSOR]))]  # bandwidth: inverse
        cells += [_fmt_ratio(ratio(r[GLOO], r[MPITENSOR]))] if have_gloo else []
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def pickle_table(rows: Sequence[Dict[str, Any]], mode: str) -> str:
    """The pickle reference rows next to the buffer path and mpitensor."""
    idx = _index(rows)
    lines = ["| op | size | mpi4py-pickle µs | mpi4py buffer µs | mpitensor µs | "
             "pickle / mpitensor |", "|---|---|---|---|---|---|"]
    for r in rows:
        if r["impl"] != PICKLE or r["mode"] != mode:
            continue
        key = (r["op"], mode, r["size"])
        buf, mt = idx.get((MPI4PY, *key)), idx.get((MPITENSOR, *key))
        lines.append(
            f"| {r['op']} | {B.format_size(r['size'])} | {_fmt_us(r['latency_us'])} | "
            f"{_fmt_us(buf['latency_us'] if buf else None)} | "
            f"{_fmt_us(mt['latency_us'] if mt else None)} | "
            f"{_fmt_ratio(paired_ratio(r, mt) if mt else None)} |")
    return "\n".join(lines)


HAND_BEGIN = "<!-- by hand: "  # then an anchor name and " -->"
HAND_END = "<!-- end by hand -->"


def hand_sections(text: str) -> Dict[str, List[str]]:
    """The sections of an earlier report written by hand, by anchor: each between a line
    ``<!-- by hand: ANCHOR -->`` and a line ``<!-- end by hand -->`` (markers included), in
    the order they came. A section left open runs to the end of the text."""
    got: Dict[str, List[str]] = {}
    anchor, block = None, []
    for line in text.splitlines():
        if anchor is None and line.startswith(HAND_BEGIN) and line.endswith(" -->"):
            anchor, block = line[len(HAND_BEGIN):-4].strip(), [line]
        elif anchor is not None:
            block.append(line)
            if line.strip() == HAND_END:
                got.setdefault(anchor, []).append("\n".join(block))
                anchor = None
    if anchor is not None:
        got.setdefault(anchor, []).append("\n".join(block + [HAND_END]))
    return got


def _hand(kept: Dict[str, List[str]], anchor: str) -> List[str]:
    """The lines that put back the hand-written sections of ``anchor`` (and forget them)."""
    return [line for block in kept.pop(anchor, []) for line in (block, "")]


def write_markdown(path: Path, rows: Sequence[Dict[str, Any]], meta: Dict[str, Any],
                   targets: List[dict], png: Optional[Path]) -> None:
    """Write docs/benchmarks-collectives.md, keeping the sections of the earlier file that
    were written by hand (``hand_sections``) where their anchors say: ``targets`` (after the
    targets), ``copy`` (after the tables against the copy bandwidth); any other anchor, or
    ``copy`` in a run without those tables, at the end."""
    kept = hand_sections(path.read_text()) if path.exists() else {}
    impls = sorted({r["impl"] for r in rows})
    modes = [m for m in B.MODES if any(r["mode"] == m for r in rows)]
    ops = [op for op in B.OPS if any(r["op"] == op for r in rows)]
    m = meta["machine"]
    out = ["# Benchmarks: mpitensor against raw mpi4py and torch.distributed (gloo)", "",
           "Generated by `benchmarks/compare_collectives.py`; do not edit by hand (rerun it), "
           "except between the markers `<!-- by hand: ANCHOR -->` and `<!-- end by hand -->`, "
           "which a rerun keeps. "
           "The three libraries run in the same job, interleaved repetition by repetition, "
           "so every ratio compares numbers taken under the same machine load. "
           "See `benchmarks/README.md` for the method.", ""]
    if meta.get("shared_machine_note"):
        out += [f"> {meta['shared_machine_note']}", ""]
    out += ["## Setup", "",
            f"- Date: {meta['date']}",
            f"- Command: `{meta['command']}`",
            f"- Ranks: {meta['ranks']} (one node); dtype {meta['dtype']}; mpitensor given "
            f"`{meta['array']}` objects",
            f"- Machine: {m.get('nproc')} cores (`nproc`), {m.get('cpu')}; "
            f"load average {meta.get('load_before', '?')} before, "
            f"{meta.get('load_after', '?')} after",
            f"- MPI: {m.get('mpi_library')}",
            f"- Versions: Python {m.get('python')}, mpi4py {m.get('mpi4py')}, "
            f"NumPy {m.get('numpy')}, mpitensor {m.get('mpitensor')}, "
            f"torch {meta.get('torch') or 'not installed'}",
            f"- Sweep: {B.format_size(meta['sizes'][0])} to {B.format_size(meta['sizes'][-1])} "
            f"(×{meta['factor']}), {meta['reps']} repetitions per size (median of the slowest "
            f"rank), about {meta['rep_time'] * 1e3:g} ms per repetition, p2p window "
            f"{meta['window']}; modes: {', '.join(modes)}; total time "
            f"{meta.get('elapsed_s', 0):.0f} s", ""]
    if meta.get("notes"):
        out += [f"- Note: {note}" for note in meta["notes"]] + [""]
    out += [f"## Targets ({meta['ranks']} ranks, back-to-back unless the target says)", "",
            "| target | measured | status |", "|---|---|---|"]
    for t in targets:
        out.append(f"| {t['target']} | {t['measured']} | {'MET' if t['met'] else 'NOT MET'} |")
    if not targets:
        out.append("| (no target could be evaluated from this sweep) | – | – |")
    out += ["", "Reference, measured earlier on this machine with raw MPICH: all_reduce "
            "3.6 µs against gloo's 285 µs at 4 B; 2.0 ms against 5.4 ms at 4 MiB.", ""]
    if png is not None:
        rel = os.path.relpath(png, path.parent)
        out += [f"![latency against message size]({rel})", ""]
    out += _hand(kept, "targets")
    copy_bw = meta.get("copy_GBps")
    if copy_bw and any(r["op"] in SHM_OPS for r in rows):
        out += ["## Against the machine's copy bandwidth (issue 29)", "",
                f"One core copying 64 MiB (`np.copyto`, best of 5, in this run): "
                f"{copy_bw:.2f} GB/s. mpitensor as configured "
                f"(`MPITENSOR_SHM_COLLECTIVES={meta.get('shm_setting', 'auto')}`; the "
                f"world group's measured thresholds: {meta.get('shm_thresholds')}, its "
                f"engine's path: {meta.get('shm_path')}); bus bandwidth, back to back.", ""]
        for op in SHM_OPS:
            if any(r["op"] == op for r in rows):
                out += [f"### {LABELS[op]}", "", shm_table(rows, op, copy_bw), ""]
        out += _hand(kept, "copy")
    out += ["## Reading the tables", "",
            "- *µs*: latency of one call (p2p latency: half the ping-pong round trip; p2p "
            "bandwidth: time per message of a window of isends).",
            "- *busbw*: bus bandwidth as nccl-tests defines it (algbw = bytes / latency; "
            "all_reduce × 2(n−1)/n; all_gather, reduce_scatter, all_to_all × (n−1)/n; "
            "broadcast, reduce, p2p × 1). A bandwidth ratio is the same for algbw and busbw.",
            "- *Ratios* (here and in the targets) are paired: the median over repetitions of "
            "the ratio (or difference) between repetitions taken back to back, which cancels "
            "most of the load that comes and goes; they can differ a little from the ratio of "
            "the two median latencies shown.",
            "- *size*: the buffer each rank passes (all_gather: its output; reduce_scatter: its "
            "input), as in nccl-tests; rounded to whole elements.",
            "- *mpitensor / mpi4py* above 1 is mpitensor's overhead; *gloo / mpitensor* above 1 "
            "is how much faster mpitensor is than torch gloo.", ""]
    if any(r["impl"] == PICKLE for r in rows):
        out += ["## The pickle path (what the tensor API must never fall onto)", "",
                "mpi4py's lowercase methods pickle the array: `comm.send(arr)`/`comm.recv()` "
                "and `comm.allreduce(arr)`.", "", pickle_table(rows, "back-to-back"), ""]
    for mode in modes:
        title, summary = MODE_TITLES[mode]
        if summary:
            out += [f"<details><summary>{summary}</summary>", ""]
        out += [f"## Results: {title}", ""]
        for op in ops:
            out += [f"### {LABELS[op]}", "", op_table(rows, op, mode, impls), ""]
        if summary:
            out += ["</details>", ""]
    for anchor in list(kept):
        out += _hand(kept, anchor)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(out))


def write_plot(path: Path, rows: Sequence[Dict[str, Any]], mode: str = "back-to-back") -> bool:
    """Latency against size, log-log, one panel per op; False when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:
        return False
    ops = [op for op in B.OPS if any(r["op"] == op for r in rows)]
    cols = min(4, len(ops))
    nrows = -(-len(ops) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 3.4 * nrows), squeeze=False)
    style = {MPI4PY: ("tab:blue", "-", "o"), MPITENSOR: ("tab:orange", "-", "s"),
             GLOO: ("tab:green", "-", "^"), PICKLE: ("tab:red", ":", "x")}
    for ax, op in zip(axes.flat, ops):
        for impl, (color, ls, marker) in style.items():
            pts = sorted((r["size"], r["latency_us"]) for r in rows
                         if r["op"] == op and r["mode"] == mode and r["impl"] == impl)
            if pts:
                ax.plot(*zip(*pts), color=color, linestyle=ls, marker=marker, markersize=3,
                        label=impl)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(LABELS[op], fontsize=10)
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel("latency (µs)")
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(ops):]:
        ax.set_visible(False)
    n = rows[0]["ranks"] if rows else "?"
    fig.suptitle(f"Latency against message size, {n} ranks, {mode} (lower is better)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


# ---------------------------------------------------------------------------- command line
def build_parser() -> argparse.ArgumentParser:
    p = B._Parser(prog="compare_collectives.py",
                  description="Benchmark mpitensor against raw mpi4py and torch gloo in one run "
                              "(mpiexec -n 2 python benchmarks/compare_collectives.py).")
    p.add_argument("--ops", type=B._ops_arg, default=B.DEFAULT_OPS, metavar="OP[,OP...]",
                   help=f"operations (default all): {', '.join(B.OPS)}; 'p2p' = both p2p ones")
    p.add_argument("--min-bytes", type=B._size_arg, default=None, metavar="SIZE",
                   help="smallest size (default 4)")
    p.add_argument("--max-bytes", type=B._size_arg, default=None, metavar="SIZE",
                   help="largest size (default 64M; 4M with --quick)")
    p.add_argument("--factor", type=int, choices=(2, 4), default=None,
                   help="size step (default 2; 4 with --quick)")
    p.add_argument("--reps", type=B._positive_int, default=None,
                   help="repetitions per size (default 9; 5 with --quick)")
    p.add_argument("--iters", type=B._positive_int, default=None,
                   help="calls per repetition (default: about --rep-time seconds' worth)")
    p.add_argument("--warmup", type=B._non_negative_int, default=None,
                   help="warm-up calls (default by size, as in mpitensor.distributed.bench)")
    p.add_argument("--rep-time", type=B._positive_float, default=None, metavar="SECONDS",
                   help="target duration of one repetition (default 0.012; 0.006 with --quick)")
    p.add_argument("--window", type=B._positive_int, default=B.P2P_WINDOW,
                   help=f"isends in flight for p2p_bw (default {B.P2P_WINDOW})")
    p.add_argument("--mode", choices=("back-to-back", "barrier", "fresh", "both", "all"),
                   default="all",
                   help="timing mode (default all: back-to-back, barrier and fresh; both: the "
                        "first two; fresh: back to back on inputs each rank writes just before "
                        "each call, the writes' own time taken out)")
    p.add_argument("--dtype", choices=("float32", "float64", "int32", "int64"),
                   default="float32", help="element type (default float32)")
    p.add_argument("--array", choices=("tensor", "numpy"), default="tensor",
                   help="what mpitensor is given (default tensor)")
    p.add_argument("--pickle-max-bytes", type=B._size_arg, default=4096, metavar="SIZE",
                   help="largest size for the mpi4py pickle reference rows (default 4K)")
    p.add_argument("--no-gloo", action="store_true", help="skip torch.distributed even if "
                   "torch is installed")
    p.add_argument("--quick", action="store_true",
                   help="short sweep: 4 B to 4 MiB in steps of 4, 5 short repetitions")
    p.add_argument("--out-md", type=Path, default=ROOT / "docs" / "benchmarks-collectives.md",
                   help="markdown report (default docs/benchmarks-collectives.md; '' to skip)")
    p.add_argument("--out-png", type=Path, default=ROOT / "docs" / "img" / "collectives.png",
                   help="plot (default docs/img/collectives.png; '' to skip)")
    p.add_argument("--json", type=Path, default=None, help="write every row as JSON")
    return p


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    quick = args.quick
    defaults = {"min_bytes": 4, "max_bytes": (4 << 20) if quick else (64 << 20),
                "factor": 4 if quick else 2, "reps": 5 if quick else 9,
                "rep_time": 0.006 if quick else 0.012}
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.max_bytes < args.min_bytes:
        parser.error(f"--max-bytes ({args.max_bytes}) is smaller than --min-bytes "
                     f"({args.min_bytes})")
    for key in ("out_md", "out_png"):
        if getattr(args, key) is not None and str(getattr(args, key)) in ("", "."):
            setattr(args, key, None)
    args.modes = B.modes_of(args.mode)
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    import mpitensor.distributed as dist

    warnings.filterwarnings("ignore", category=FutureWarning, module=r"torch\..*")
    warnings.filterwarnings("ignore", category=UserWarning, module=r"torch\..*")
    dist.init_process_group("mpi")
    comm = MPI.COMM_WORLD.Dup()  # harness barriers and timing reductions
    raw = MPI.COMM_WORLD.Dup()  # the raw mpi4py library under test
    rank, n = comm.Get_rank(), comm.Get_size()

    def log(text: str) -> None:
        if rank == 0:
            print(text, flush=True)

    notes = []
    if n < 2 and any(op.startswith("p2p") for op in args.ops):
        args.ops = tuple(op for op in args.ops if not op.startswith("p2p"))
        notes.append("p2p skipped: it needs at least 2 ranks")
        log("note: " + notes[-1])
    apis: List[B.Api] = [Mpi4pyApi(raw, args.dtype), B.MpitensorApi(args.dtype, args.array)]
    torch_version = None
    gloo_api = None
    reason = "--no-gloo given" if args.no_gloo else torch_missing_reason()
    if reason:
        notes.append(f"torch.distributed (gloo) rows skipped: {reason}")
        log("note: " + notes[-1])
    else:
        import torch

        torch.set_num_threads(1)  # one core per rank, as the MPI ranks have
        torch_version = torch.__version__
        gloo_api = GlooApi(comm, args.dtype)
        apis.append(gloo_api)
    pickle_api = PickleApi(raw, args.dtype)
    load_before = _loadavg()
    copy_bw = copy_bandwidth(comm)
    log(f"# copy bandwidth (one core, np.copyto of 64 MiB): {copy_bw:.2f} GB/s")
    log(f"# {n} ranks, {args.dtype}; libraries: {', '.join(a.name for a in apis)}"
        f" (+ {PICKLE} up to {B.format_size(args.pickle_max_bytes)})")
    start = time.perf_counter()
    rows = run(comm, apis, pickle_api, args, log)
    elapsed = time.perf_counter() - start
    shm = getattr(dist.group.WORLD, "shm", None)  # what the world's cost model decided
    thresholds = getattr(shm, "thresholds", None if shm is None else str(shm))
    # the engine's path: reads of the peers' buffers (cross-memory attach) or the segment's
    shm_path = None if thresholds is None else "direct" if getattr(shm, "cma", False) \
        else "segment"
    if gloo_api is not None:
        gloo_api.close()
    if rank == 0:
        cmd = "mpiexec -n {} python {}".format(
            n, " ".join(shlex.quote(a) for a in [os.path.relpath(sys.argv[0], ROOT)]
                        + list(sys.argv[1:] if argv is None else argv)))
        meta = {"date": datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
                "command": cmd, "ranks": n, "dtype": args.dtype, "array": args.array,
                "sizes": B.sweep_sizes(args.min_bytes, args.max_bytes, args.factor),
                "factor": args.factor, "reps": args.reps, "rep_time": args.rep_time,
                "window": args.window, "machine": B.machine_info(), "torch": torch_version,
                "elapsed_s": elapsed, "load_before": load_before, "load_after": _loadavg(),
                "copy_GBps": copy_bw, "shm_setting": _config.shm_collectives(),
                "shm_thresholds": thresholds, "shm_path": shm_path,
                "notes": notes,
                "shared_machine_note": "Measured on a shared 2-core machine while other jobs "
                                       "ran: absolute numbers are noisy; the ratios, taken in "
                                       "the same run, are the meaningful part."}
        targets = evaluate_targets(rows) if n == 2 else []
        targets += shm_targets(rows, copy_bw, n)
        if "fresh" in args.modes:
            targets += shm_targets(rows, copy_bw, n, "fresh")
        png = None
        if args.out_png is not None:
            if write_plot(args.out_png, rows):
                png = args.out_png
            else:
                log("note: matplotlib is missing; no plot written (pip install matplotlib)")
        if args.out_md is not None:
            write_markdown(args.out_md, rows, meta, targets, png)
            log(f"wrote {args.out_md}")
        if png is not None:
            log(f"wrote {png}")
        if args.json is not None:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps({"meta": meta, "targets": targets, "rows": rows},
                                            indent=1) + "\n")
            log(f"wrote {args.json}")
        for t in targets:
            log(f"{'MET    ' if t['met'] else 'NOT MET'}  {t['target']}: {t['measured']}")
    comm.Barrier()
    raw.Free()
    comm.Free()
    dist.destroy_process_group()
    return 0


def _loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


if __name__ == "__main__":
    sys.exit(main())
