"""Small collectives on persistent MPI-4 requests (``backends/mpi/persistent.py``, issue 29).

Each scenario runs under ``mpiexec`` (1 to 4 ranks) with a hard timeout; every rank asserts
its own values and prints ``OK <rank>``, and the test asserts that each rank did, that the job
ended cleanly and that MPICH printed nothing (it warns of every persistent request left
unfreed at finalize).

The scenarios run with ``MPITENSOR_SHM_COLLECTIVES=off``: on a one-machine group the small
calls' board (``shm_tiny.py``, tested in ``tests/mpi/test_shm_tiny.py``) would take most of these
calls. The persistent path is compared bit for bit with the plain one (the same call with the
group's ``pers_max`` set to -1 on every rank: the non-blocking call): MPICH builds both from
the same schedule, so even float sums in any order agree to the bit. Exact-integer data also
checks the values against NumPy.
"""

from __future__ import annotations

import re
import sys
import textwrap
from pathlib import Path

import pytest

from .launch import mpiexec_run

TIMEOUT = 240

PRELUDE = """
import os, sys
import numpy as np
import mpitensor as torch
import mpitensor.distributed as dist
from mpitensor.distributed._collectives import _pg
from mpitensor.distributed.backends.mpi import persistent as P
from mpitensor.errors import DistributedTimeoutError, PeerFailedError
R = dist.ReduceOp
"""

# ------------------------------------------------------------------ values, both paths
VALUES = """
dist.init_process_group("mpi")
g = _pg(None)
r, n = dist.get_rank(), dist.get_world_size()
assert g.pers_max == P.CEILING > 0
rng = np.random.default_rng(1234 + r)


def plain(fn):
    # the same call on the non-blocking path (every rank alike)
    g.pers_max = -1
    try:
        return fn()
    finally:
        del g.pers_max


def same(a, b, what):
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape, (what, a.dtype, b.dtype, a.shape, b.shape)
    assert a.tobytes() == b.tobytes(), (what, a, b)


def data(dt, shape, exact):
    if dt == "bool":
        return torch.tensor(rng.integers(0, 2, shape).astype(bool))
    if exact or dt.startswith(("int", "uint")):
        x = rng.integers(1, 4, shape)
    else:
        x = rng.standard_normal(shape)
        if dt.startswith("complex"):
            x = x + 1j * rng.standard_normal(shape)
    return torch.tensor(x).to(getattr(torch, dt))


DTYPES = ["bool", "int8", "int32", "int64", "uint8", "float16", "bfloat16", "float32",
          "float64", "complex64", "complex128"]
OPS = {"bool": [R.SUM, R.MAX, R.MIN, R.PRODUCT], "float": [R.SUM, R.MAX, R.MIN, R.AVG],
       "complex": [R.SUM, R.PRODUCT, R.AVG], "int": [R.SUM, R.MAX, R.MIN, R.BAND, R.BXOR]}


def ops_for(dt):
    return OPS["bool" if dt == "bool" else "complex" if dt.startswith("complex")
               else "float" if dt.startswith(("float", "bfloat")) else "int"]


checked = 0
for dt in DTYPES:
    for shape in [(1,), (5,), (2, 3), (3, 1, 2)]:
        for op in ops_for(dt):
            for exact in (False, True):
                x = data(dt, shape, exact)
                a, b = x.clone(), x.clone()
                dist.all_reduce(a, op)
                plain(lambda: dist.all_reduce(b, op))
                same(a.numpy(), b.numpy(), ("all_reduce", dt, shape, op))
                nc = torch.zeros(shape[0], 2 * int(np.prod(shape[1:]))).to(x.dtype)[:, ::2]
                nc.copy_(x.reshape(shape[0], -1))  # non-contiguous: the general path
                dist.all_reduce(nc, op)
                same(nc.numpy().reshape(shape), a.numpy(), ("general", dt, shape, op))
                checked += 2
        # every member's piece, gathered
        x = data(dt, shape, True)
        out = torch.empty((n * shape[0],) + shape[1:], dtype=x.dtype)
        dist.all_gather_into_tensor(out, x)
        ref = torch.empty((n * shape[0],) + shape[1:], dtype=x.dtype)
        plain(lambda: dist.all_gather_into_tensor(ref, x))
        same(out.numpy(), ref.numpy(), ("all_gather_into_tensor", dt, shape))
        every = [torch.empty(shape, dtype=x.dtype) for _ in range(n)]
        dist.all_gather(every, x)
        for k in range(n):
            same(every[k].numpy(), out.numpy()[k * shape[0]:(k + 1) * shape[0]],
                 ("all_gather", dt, shape, k))
        mine = out.numpy()[r * shape[0]:(r + 1) * shape[0]]
        same(mine, x.numpy(), ("own piece", dt, shape))
        # broadcast from every root
        for root in range(n):
            y = data(dt, shape, False)
            z = y.clone()
            dist.broadcast(y, root)
            plain(lambda: dist.broadcast(z, root))
            same(y.numpy(), z.numpy(), ("broadcast", dt, shape, root))
            if r == root:
                same(y.numpy(), z.numpy(), "root keeps its own")
        # reduce_scatter_tensor
        for op in ops_for(dt):
            inp = data(dt, (n * shape[0],) + shape[1:], False)
            o1 = torch.empty(shape, dtype=x.dtype)
            o2 = torch.empty(shape, dtype=x.dtype)
            dist.reduce_scatter_tensor(o1, inp, op)
            plain(lambda: dist.reduce_scatter_tensor(o2, inp, op))
            same(o1.numpy(), o2.numpy(), ("reduce_scatter_tensor", dt, shape, op))
            checked += 1

# exact integers against NumPy, NumPy arrays in, the in-place chunk idiom of the gather
x = np.arange(6, dtype=np.float64) + r
dist.all_reduce(x)
assert np.array_equal(x, n * np.arange(6) + n * (n - 1) / 2), x
big = np.zeros(4 * n, np.int32)
chunk = big[4 * r:4 * r + 4]
chunk[:] = r + 1
dist.all_gather_into_tensor(big, chunk)
assert np.array_equal(big, np.repeat(np.arange(1, n + 1), 4)), big
inp = np.tile(np.arange(3, dtype=np.int64), n) * (r + 1)
o = np.empty(3, np.int64)
dist.reduce_scatter_tensor(o, inp)
assert np.array_equal(o, np.arange(3) * n * (n + 1) // 2), o
assert checked > 500
kinds = g.pers.ar, g.pers.ag, g.pers.rs, g.pers.bc
assert all(len(k) <= P.CAP for k in kinds), [len(k) for k in kinds]
if n > 1:
    assert all(kinds), [len(k) for k in kinds]
os.write(1, f"OK {r}\\n".encode())  # one write: the ranks share a pipe
if "--destroy" in sys.argv:
    dist.destroy_process_group()
    assert g.pers is None
"""

# ------------------------------------------------------------------ many keys, groups, async
MIXED = """
if "--reduction" in sys.argv:  # the agreement check of groups across machines (Checked)
    from mpitensor.distributed.health import fingerprint as F
    F.NodeCheck.create = classmethod(lambda cls, comm: None)
dist.init_process_group("mpi")
g = _pg(None)
r, n = dist.get_rank(), dist.get_world_size()
assert (g.health.fp_node is None) == ("--reduction" in sys.argv)
sub_ranks = list(range(max(1, n - 1)))
sub = dist.new_group(sub_ranks)
odd = dist.new_group([k for k in range(n) if k % 2]) if n > 1 else None


def keys(d):
    return [k >> 32 for k in d]


for rnd in range(2):
    # more shapes than the cache holds, in a row: the oldest made go first, alike everywhere
    for count in range(1, 3 * P.CAP + 2):
        x = torch.full((count,), float(r + 1))
        dist.all_reduce(x)
        assert x.tolist() == [n * (n + 1) / 2] * count, (count, x)
        assert len(g.pers.ar) <= P.CAP
        if count % 7 == 0:  # a large call (the non-blocking path) in between
            y = np.ones(P.CEILING // 4 * 3, np.float32)
            dist.all_reduce(y)
            assert (y == n).all()
        if r in sub_ranks and count % 5 == 0:  # a sub-group's own requests
            s = np.full(count, float(r), np.float64)
            dist.all_reduce(s, group=sub)
            assert (s == sum(sub_ranks)).all(), s
        if odd is not None and r % 2 and count % 3 == 0:
            o = np.full(2, r, np.int64)
            dist.broadcast(o, src=1, group=odd)
            assert (o == 1).all()
    seen = [None] * n
    dist.all_gather_object(seen, keys(g.pers.ar))
    assert all(s == seen[0] for s in seen), seen
    assert keys(g.pers.ar) == list(range(4 * (2 * P.CAP + 2), 4 * (3 * P.CAP + 2), 4)), \\
        keys(g.pers.ar)

# async: several works on the same request before any wait, then in another order
works, ts = [], []
for i in range(5):
    t = torch.full((3,), float(r + i))
    ts.append(t)
    works.append(dist.all_reduce(t, async_op=True))
for i, w in reversed(list(enumerate(works))):
    w.wait()
    assert ts[i].tolist() == [n * i + n * (n - 1) / 2] * 3, (i, ts[i])
assert all(w.is_completed() for w in works)
t = torch.full((2,), float(r))
w = dist.all_reduce(t, async_op=True)
w.wait()
u = torch.empty(2 * n)
w2 = dist.all_gather_into_tensor(u, torch.full((2,), float(r)), async_op=True)
b = torch.full((4,), float(r))
w3 = dist.broadcast(b, 0, async_op=True)
w2.wait()
w3.wait()
assert u.tolist() == [float(k) for k in range(n) for _ in range(2)], u
assert b.tolist() == [0.0] * 4 and t.tolist() == [n * (n - 1) / 2] * 2
# one rank async, the others blocking: the same request everywhere
z = torch.full((3,), 1.0)
if r == 0:
    dist.all_reduce(z, async_op=True).wait()
else:
    dist.all_reduce(z)
assert z.tolist() == [float(n)] * 3
# one rank non-contiguous (general path), the others contiguous (fast path)
m = np.zeros((3, 2)) + 1
v = m[:, 0] if r == 0 else np.ones(3)
dist.all_reduce(v)
assert (v == n).all(), v
# all_reduce out of place on one rank (all_reduce_into.py), in place on the others
src = np.full(5, float(r + 1))
dst = np.empty(5)
if r == 0:
    g.all_reduce_into(dst, src)
else:
    dst[:] = src
    dist.all_reduce(dst)
assert (dst == n * (n + 1) / 2).all() and (src == r + 1).all(), (dst, src)
if r in sub_ranks:
    dist.destroy_process_group(sub)
os.write(1, f"OK {r}\\n".encode())  # one write: the ranks share a pipe
"""

# ------------------------------------------------------------------ a peer that never arrives
SKIP = """
dist.init_process_group("mpi", timeout=3.0)
r = dist.get_rank()
x = np.ones(4)
dist.all_reduce(x)
try:
    if r != 1:
        dist.all_reduce(x)          # rank 1 never arrives
    else:
        import time
        time.sleep(9)
except (DistributedTimeoutError, PeerFailedError) as exc:
    os.write(1, f"CAUGHT {r} {type(exc).__name__}: {exc}\\n".encode())
    os._exit(3)
"""


def _run(tmp_path: Path, body: str, n: int, *args: str, env: dict | None = None):
    script = tmp_path / "scenario.py"
    script.write_text(PRELUDE + textwrap.dedent(body))
    # the persistent requests themselves: no small calls' board (shm_tiny.py, which takes the
    # calls it computes on a one-machine group and has tests of its own)
    full = {"MPITENSOR_DEBUG": "0", "MPITENSOR_ABORT_ON_EXCEPTION": "1",
            "MPITENSOR_SHM_COLLECTIVES": "off"}
    full.update(env or {})
    return mpiexec_run(n, [sys.executable, str(script), *args], timeout=TIMEOUT, env=full,
                       cwd=tmp_path)


def _clean(res, n: int) -> None:
    assert not res.timed_out, res.output[-6000:]
    assert res.returncode == 0, res.output[-6000:]
    for r in range(n):
        assert re.search(rf"^OK {r}$", res.output, re.M), (r, res.output[-6000:])
    assert "MPICH" not in res.output and "Traceback" not in res.output, res.output[-6000:]


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_values_match_the_plain_path(tmp_path, n):
    _clean(_run(tmp_path, VALUES, n), n)


@pytest.mark.parametrize("env", [{"MPITENSOR_CHECK_BYTES": "0"}, {"MPITENSOR_DEBUG": "1"},
                                 {"MPITENSOR_MPI_ALGORITHMS": "off"}],
                         ids=["checked", "debug", "algorithms-off"])
def test_values_with_checks_debug_and_mpich_defaults(tmp_path, env):
    """Every call checked (slots wrap the persistent request), debug mode (the general path
    only) and MPICH's own algorithms: the same values, and the group freed cleanly."""
    _clean(_run(tmp_path, VALUES, 2, "--destroy", env=env), 2)


@pytest.mark.parametrize("n", [2, 3, 4])
def test_eviction_groups_and_async(tmp_path, n):
    _clean(_run(tmp_path, MIXED, n), n)


@pytest.mark.parametrize("check", ["slots", "reduction"])
def test_every_call_checked(tmp_path, check):
    """MPITENSOR_CHECK_BYTES=0 with the async and sub-group mix: the agreement check of one
    machine (shared slots) and the reduction of groups across machines, which wraps the
    persistent request."""
    args = ("--reduction",) if check == "reduction" else ()
    _clean(_run(tmp_path, MIXED, 3, *args, env={"MPITENSOR_CHECK_BYTES": "0"}), 3)


def test_a_peer_that_never_arrives_times_out(tmp_path):
    res = _run(tmp_path, SKIP, 3)
    assert not res.timed_out, res.output[-6000:]
    assert res.returncode != 0
    # the first rank to time out breaks the group: the other, waiting in the same call,
    # hears it (PeerFailedError) and may end the job before the first one prints
    caught = re.findall(r"^CAUGHT [02] (\w+): rank [02]: all_reduce \(#2 on WORLD\) (.*)$",
                        res.output, re.M)
    assert caught, res.output[-6000:]
    for kind, msg in caught:
        assert kind in ("DistributedTimeoutError", "PeerFailedError"), (kind, msg)
        assert re.search(r"did not complete within (the timeout of )?3 s", msg), msg
        assert re.search(r"(?i)ranks that had not arrived: \[1\]", msg), msg
