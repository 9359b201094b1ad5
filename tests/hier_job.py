"""The MPI job of tests/test_hierarchical.py and benchmarks/hierarchical.py (run on a cluster
of network-namespace hosts, ``hostfiles/netns_cluster.py``).

``python hier_job.py check even|uneven``: hierarchical all_reduce (MPITENSOR_HIERARCHICAL=on
in the job's environment; ``uneven``: 3 ranks on 2 hosts, the leaders' scheme) against the
exact reduction and against raw MPI's, for several dtypes, ops and sizes; every rank's result
bitwise equal; all_gather_into_tensor and reduce_scatter_tensor likewise. Prints ``CHECK
rank R ok N`` (N: the all_reduce calls that went the hierarchical way) or raises.

``python hier_job.py bytes MIB CALLS [all_gather|reduce_scatter]``: the bytes each node's link
(``eth0``, in its namespace) sends during ``CALLS`` all_reduces of ``MIB`` MiB of float64 (or
all_gather_into_tensor calls into that much, reduce_scatter_tensor calls from that much),
flat (a group made with MPITENSOR_HIERARCHICAL=off) and hierarchical (the world group, made
with it on), and during a window of barriers alone; local rank 0 of each node prints ``BYTES
host flat hier idle``.

``python hier_job.py state``: one all_reduce on the world group; each rank prints ``STATE
rank R flat`` or ``STATE rank R MODE CROSSOVER MODEL_TERMS CALLS``.

``python hier_job.py time SIZES REPS``: median seconds of flat and hierarchical all_reduce at
each size (bytes, comma-separated), measured alternately; rank 0 prints ``TIME size flat
hier``. With ``auto`` (MPITENSOR_HIERARCHICAL=auto in the job's environment) the world group
chooses by its cost model, whose crossover rank 0 prints as ``MODEL ...``.
"""

from __future__ import annotations

import os
import socket
import sys
import time

import numpy as np
from mpi4py import MPI

import mpitensor
import mpitensor.distributed as dist
from mpitensor.distributed import ReduceOp

_U = {np.dtype(np.float32): 2.0 ** -24, np.dtype(np.float64): 2.0 ** -53}


def _data(rank: int, n: int, dt: np.dtype, seed: int) -> np.ndarray:
    rng = np.random.default_rng(1000 * seed + rank)
    if dt.kind == "f":
        return (rng.standard_normal(n) * 10.0 ** rng.integers(-3, 4, n)).astype(dt)
    if dt.kind == "c":
        return (rng.standard_normal(n) + 1j * rng.standard_normal(n)).astype(dt)
    info = np.iinfo(dt)
    lo, hi = max(info.min, -3), min(info.max, 4)
    return rng.integers(lo, hi, n, endpoint=False).astype(dt)


def _exact(parts: np.ndarray, op: ReduceOp) -> np.ndarray:
    if op is ReduceOp.SUM:
        wide = np.clongdouble if parts.dtype.kind == "c" else (
            np.longdouble if parts.dtype.kind == "f" else parts.dtype)
        return parts.astype(wide).sum(axis=0)
    fn = {ReduceOp.MAX: np.maximum, ReduceOp.MIN: np.minimum, ReduceOp.PRODUCT: np.multiply,
          ReduceOp.BAND: np.bitwise_and, ReduceOp.BOR: np.bitwise_or,
          ReduceOp.BXOR: np.bitwise_xor}[op]
    return fn.reduce(parts, axis=0)


def _bound(parts: np.ndarray) -> np.ndarray:
    """Any order of the n - 1 additions of n addends lies within gamma_{n-1} * sum |x_i| of
    the exact sum (Higham, Accuracy and Stability, 4.2): for floats and complex parts."""
    n = parts.shape[0]
    u = _U[np.dtype(parts.real.dtype)]
    gamma = (n - 1) * u / (1 - (n - 1) * u)
    if parts.dtype.kind == "c":
        gamma *= np.sqrt(2.0)  # each component separately, as a magnitude
    gamma += (n - 1) * np.finfo(np.longdouble).epsneg  # the reference's own rounding
    return gamma * np.abs(parts.astype(np.clongdouble if parts.dtype.kind == "c"
                                        else np.longdouble)).sum(axis=0)


def _one(g, comm: MPI.Comm, dt: np.dtype, op: ReduceOp, n: int, seed: int, how: str) -> None:
    rank, size = comm.rank, comm.size
    parts = np.stack([_data(r, n, dt, seed) for r in range(size)])
    mine = parts[rank].copy()
    flat = parts[rank].copy()
    comm.Allreduce(MPI.IN_PLACE, flat, op={ReduceOp.SUM: MPI.SUM, ReduceOp.MAX: MPI.MAX,
                                          ReduceOp.MIN: MPI.MIN, ReduceOp.PRODUCT: MPI.PROD,
                                          ReduceOp.BAND: MPI.BAND, ReduceOp.BOR: MPI.BOR,
                                          ReduceOp.BXOR: MPI.BXOR}[op])
    if how == "tensor":
        t = mpitensor.from_numpy(mine)
        dist.all_reduce(t, op=op, group=g)
    elif how == "strided":  # a non-contiguous view: the general path stages it
        wide = np.zeros(2 * n, dt)
        wide[::2] = mine
        dist.all_reduce(wide[::2], op=op, group=g)
        assert not wide[1::2].any(), "the gaps of a strided buffer were written"
        mine = wide[::2].copy()
    elif how == "async":
        work = dist.all_reduce(mine, op=op, group=g, async_op=True)
        work.wait()
    elif how.startswith("into"):  # the group's all_reduce out of place: the input kept
        src = mine if how == "into" else np.zeros(2 * n, dt)
        if how != "into":  # a strided input and output: the general path
            src[::2] = mine
            src = src[::2]
        out = np.zeros((n, 2), dt)[:, 0] if how != "into" else np.empty_like(mine)
        g.all_reduce_into(out, src, op)
        assert np.array_equal(src, parts[rank]), "the input of all_reduce_into changed"
        mine = np.ascontiguousarray(out)
    else:
        dist.all_reduce(mine, op=op, group=g)
    what = f"{dt} {op} n={n} {how}"
    exact = _exact(parts, op)
    if dt.kind in "fc" and op is ReduceOp.SUM:
        err = np.abs(mine - exact)
        assert (err <= _bound(parts)).all(), f"{what}: off the exact sum by {err.max()}"
        # both within the bound of the exact sum: within twice of each other
        assert (np.abs(mine - flat) <= 2 * _bound(parts)).all(), f"{what}: off MPI's"
    else:  # integers, and MAX/MIN/PRODUCT whose result does not depend on the order here
        assert np.array_equal(mine, exact.astype(dt)), f"{what}: not the exact result"
        assert np.array_equal(mine, flat), f"{what}: not MPI's"
    everyone = comm.allgather(mine.tobytes())
    assert all(b == everyone[0] for b in everyone), f"{what}: ranks differ in their bits"


def _gather(g, comm: MPI.Comm, dt: np.dtype, b: int, seed: int, how: str) -> None:
    """all_gather_into_tensor: every rank's block, in group-rank order, on every rank."""
    parts = np.stack([_data(r, b, dt, seed) for r in range(comm.size)])
    mine = parts[comm.rank].copy()
    if how == "strided":  # a non-contiguous output: the general path stages it
        wide = np.zeros(2 * b * comm.size, dt)
        dist.all_gather_into_tensor(wide[::2], mine, group=g)
        assert not wide[1::2].any(), "the gaps of a strided output were written"
        out = wide[::2]
    elif how == "tensor":
        out_t = mpitensor.zeros(comm.size * b, dtype=mpitensor.from_numpy(mine).dtype)
        dist.all_gather_into_tensor(out_t, mpitensor.from_numpy(mine), group=g)
        out = out_t.numpy()
    else:
        out = np.zeros(comm.size * b, dt)
        dist.all_gather_into_tensor(out, mine, group=g)
    assert np.array_equal(out, parts.reshape(-1)), f"all_gather {dt} b={b} {how}"


def _scatter(g, comm: MPI.Comm, dt: np.dtype, op: ReduceOp, b: int, seed: int,
             how: str) -> None:
    """reduce_scatter_tensor: rank r's block of the reduction of every rank's input."""
    n, r = comm.size, comm.rank
    parts = np.stack([_data(q, n * b, dt, seed) for q in range(n)])
    if how == "strided":  # a non-contiguous output: the general path stages it
        wide = np.zeros(2 * b, dt)
        dist.reduce_scatter_tensor(wide[::2], parts[r].copy(), op=op, group=g)
        assert not wide[1::2].any(), "the gaps of a strided output were written"
        out = wide[::2]
    else:
        out = np.zeros(b, dt)
        dist.reduce_scatter_tensor(out, parts[r].copy(), op=op, group=g)
    mine = slice(r * b, (r + 1) * b)
    exact = _exact(parts, op)[mine]
    what = f"reduce_scatter {dt} {op} b={b} {how}"
    if dt.kind == "f" and op is ReduceOp.SUM:
        assert (np.abs(out - exact) <= _bound(parts)[mine]).all(), what
    else:
        assert np.array_equal(out, exact.astype(dt)), what


def check(even: bool) -> None:
    dist.init_process_group("mpi")
    g = dist.group.WORLD
    comm = MPI.COMM_WORLD
    cases = [(np.float64, ReduceOp.SUM), (np.float32, ReduceOp.SUM), (np.int64, ReduceOp.SUM),
             (np.int32, ReduceOp.MAX), (np.float64, ReduceOp.MIN), (np.int16, ReduceOp.PRODUCT),
             (np.uint8, ReduceOp.BXOR), (np.int32, ReduceOp.BOR), (np.complex128, ReduceOp.SUM)]
    seed = expected = 0
    for dt, op in cases:
        for n in (1, 2, 3, 4, 5, 7, 1000, 4099, (1 << 16) + 3):
            seed += 1
            _one(g, comm, np.dtype(dt), op, n, seed, "plain")
            expected += n >= 2 or not even  # the split needs an element per local rank
    for how in ("tensor", "strided", "async", "into", "into strided"):
        for n in (5, 40001):
            seed += 1
            _one(g, comm, np.dtype(np.float64), ReduceOp.SUM, n, seed, how)
            expected += 1
    gathers = 0
    for dt in (np.float64, np.int32, np.uint8):
        for b in (1, 3, 1000, 40001):
            seed += 1
            _gather(g, comm, np.dtype(dt), b, seed, "plain")
            gathers += 1
    for how in ("strided", "tensor"):
        seed += 1
        _gather(g, comm, np.dtype(np.float32), 777, seed, how)
        gathers += 1
    scatters = 0
    for dt, op in ((np.float64, ReduceOp.SUM), (np.int64, ReduceOp.SUM), (np.int32, ReduceOp.MAX),
                   (np.float32, ReduceOp.MIN)):
        for b in (1, 3, 1000, 40001):
            seed += 1
            _scatter(g, comm, np.dtype(dt), op, b, seed, "plain")
            scatters += 1
    seed += 1
    _scatter(g, comm, np.dtype(np.float64), ReduceOp.SUM, 777, seed, "strided")
    w = np.zeros(3)
    dist.reduce_scatter_tensor(w, np.full(3 * comm.size, comm.rank + 1.0), op=ReduceOp.AVG,
                               group=g)
    assert (w == (comm.size + 1) / 2).all(), w
    scatters += 2
    h = g.hier
    # all_gather and reduce_scatter take the split layout only: the leaders' stays flat
    assert h.gathers == (gathers if even else 0), (h.gathers, gathers)
    assert h.scatters == (scatters if even else 0), (h.scatters, scatters)
    ppn = MPI.COMM_WORLD.Split_type(MPI.COMM_TYPE_SHARED).size
    assert h is not None and h.nodes == 2 and h.ppn == ppn and h.even == even, vars(h)
    # the leaders' scheme (nodes of 2 and 1 ranks): every local rank 0 in the cross group
    assert (h.cross is not None) == (even or h.node.rank_ == 0), vars(h)
    calls = h.calls
    assert calls == expected, (calls, expected)
    # AVG: the hierarchical sum, divided as the flat path divides (exact here)
    x = np.full(64, comm.rank + 1.0)
    dist.all_reduce(x, op=ReduceOp.AVG, group=g)
    assert (x == (comm.size + 1) / 2).all() and h.calls == calls + 1
    # half precision (reduced in float32 by MPI) and bool (through a view) stay flat
    y = np.ones(64, np.float16)
    dist.all_reduce(y, group=g)
    z = np.full(64, comm.rank == 0)
    dist.all_reduce(z, op=ReduceOp.MAX, group=g)
    assert (y == comm.size).all() and z.all() and h.calls == calls + 1
    node, cross = h.node, h.cross
    dist.destroy_process_group()
    assert node.destroyed and (cross is None or cross.destroyed) and h.node is None
    sys.stdout.write(f"CHECK rank {comm.rank} ok {calls}\n")


def _eth0(direction: str) -> int:
    with open(f"/sys/class/net/eth0/statistics/{direction}_bytes") as f:
        return int(f.read())


def _window(comm: MPI.Comm, node: MPI.Comm, run) -> int:
    """Bytes this node's link sent while every rank ran ``run`` (read by local rank 0)."""
    comm.Barrier()
    before = _eth0("tx") if node.rank == 0 else 0
    comm.Barrier()
    run()
    comm.Barrier()
    return _eth0("tx") - before if node.rank == 0 else 0


def count_bytes(mib: float, calls: int, op: str) -> None:
    dist.init_process_group("mpi")
    comm = MPI.COMM_WORLD
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    hier = dist.group.WORLD
    buf = np.ones(int(mib * (1 << 20)) // 8)  # all_gather's output, reduce_scatter's input;
    block = np.ones(buf.size // comm.size)    # its share

    def call(g):
        if op == "all_gather":
            dist.all_gather_into_tensor(buf, block, group=g)
        elif op == "reduce_scatter":
            dist.reduce_scatter_tensor(block, buf, group=g)
        else:
            dist.all_reduce(buf, group=g)

    call(hier)  # warm-up: the sub-groups, MPI's connections
    os.environ["MPITENSOR_HIERARCHICAL"] = "off"  # read at a group's first call
    flat = dist.new_group(list(range(comm.size)))
    call(flat)
    assert hier.hier is not None and flat.hier is None

    def on(g):
        return lambda: [call(g) for _ in range(calls)]

    counts = {"flat": 0, "hier": 0, "idle": 0}
    for _ in range(2):  # alternated, so that any drift in the background shows in both
        counts["flat"] += _window(comm, node, on(flat))
        counts["hier"] += _window(comm, node, on(hier))
        counts["idle"] += _window(comm, node, lambda: None)
    if node.rank == 0:
        sys.stdout.write(f"BYTES {socket.gethostname()} {counts['flat']} {counts['hier']} "
                         f"{counts['idle']}\n")
    dist.destroy_process_group()


def timing(sizes: str, reps: int) -> None:
    dist.init_process_group("mpi")
    comm = MPI.COMM_WORLD
    world = dist.group.WORLD
    mode = os.environ.get("MPITENSOR_HIERARCHICAL", "auto")
    dist.all_reduce(np.ones(8), group=world)  # the world group's choice is made here
    os.environ["MPITENSOR_HIERARCHICAL"] = "off"  # and the flat group's at its first call
    flat = dist.new_group(list(range(comm.size)))
    for nbytes in (int(s) for s in sizes.split(",")):
        buf = np.ones(max(1, nbytes // 8))
        res = {}
        for g in (flat, world):
            dist.all_reduce(buf, group=g)
        assert flat.hier is None and (world.hier is not None or mode != "on")
        times: dict = {"flat": [], "hier": []}
        for _ in range(reps):
            for name, g in (("flat", flat), ("hier", world)):
                comm.Barrier()
                t0 = time.perf_counter()
                dist.all_reduce(buf, group=g)
                times[name].append(time.perf_counter() - t0)
        for name in times:
            res[name] = comm.allreduce(float(np.median(times[name])), op=MPI.MAX)
        if comm.rank == 0:
            sys.stdout.write(f"TIME {buf.nbytes} {res['flat']:.6e} {res['hier']:.6e}\n")
    h = world.hier
    if comm.rank == 0 and h is not None:
        a_f, b_f, a_h, b_h = h.model or (0.0, 0.0, 0.0, 0.0)
        cross = "never" if h.crossover >= 1 << 62 else f"{h.crossover} bytes"
        sys.stdout.write(f"MODEL mode={h.mode} crossover={cross}; flat "
                         f"{a_f * 1e6:.0f} us + {b_f * 1e9:.2f} ns/B, hierarchical "
                         f"{a_h * 1e6:.0f} us + {b_h * 1e9:.2f} ns/B\n")
    dist.destroy_process_group()


def state() -> None:
    """The world group's choice after one all_reduce, as the switches and the model made it."""
    dist.init_process_group("mpi")
    comm = MPI.COMM_WORLD
    x = np.full(256, comm.rank + 1.0)
    dist.all_reduce(x)
    assert (x == comm.size * (comm.size + 1) / 2).all()
    h = dist.group.WORLD.hier
    what = "flat" if h is None else f"{h.mode} {h.crossover} {len(h.model)} {h.calls}"
    sys.stdout.write(f"STATE rank {comm.rank} {what}\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    what = sys.argv[1]
    if what == "check":
        check(sys.argv[2] == "even")
    elif what == "state":
        state()
    elif what == "bytes":
        count_bytes(float(sys.argv[2]), int(sys.argv[3]), (sys.argv[4:] or ["all_reduce"])[0])
    else:
        timing(sys.argv[2], int(sys.argv[3]))
