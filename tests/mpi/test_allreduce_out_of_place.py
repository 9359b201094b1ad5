"""The MPI group's all_reduce out of place (``group.all_reduce_into``) at 1-4 ranks, and the
redistribution of Partial DTensors that uses it.

Every call runs on three groups: through the shared-memory engine's direct path (peers'
buffers read where they lie, where the kernel allows it), through its segment's chunk
pipeline (slots of 4 KiB: most buffers take several chunks), and through MPI
(``MPITENSOR_SHM_COLLECTIVES=off``, ``Iallreduce(sendbuf, recvbuf)``). Results are compared
bitwise with the same computation on whole arrays: the in-place ``all_reduce`` of a copy on
the same group (the same algorithm), and, where the order is the API's (the engine's
rank order, integers, bool, min/max), with the rank-order reduction computed here. (Complex
products only within their rounding bound: NumPy's complex multiply rounds with or without
fused multiply-adds depending on the loop it picks, which in place differs.)

Run: ``mpiexec -n N python -m pytest --with-mpi tests/mpi/test_allreduce_out_of_place.py``.
"""

from __future__ import annotations

import datetime
import time

import numpy as np
import pytest

import mpitensor as mt
import mpitensor.distributed as dist
from mpitensor.distributed import ReduceOp
from mpitensor.distributed.backends.mpi import shm_coll
from mpitensor.distributed.backends.mpi.collectives import Collectives
from mpitensor.distributed.backends.mpi.shm_pipe import Engine
from mpitensor.distributed.device_mesh import DeviceMesh
from mpitensor.distributed.tensor import DTensor, Partial, Replicate, Shard
from mpitensor.errors import CollectiveMismatchError, DistributedTimeoutError, PeerFailedError

from . import arrayimpl as ai
from .test_shm_collectives import CASES, CHUNK, _data, _expected, _same

PATHS = ("direct", "segment", "mpi")
SIZES = [3, 1001, 5 * CHUNK + 13]  # fewer than the ranks, odd, several chunks
_GROUPS: dict = {}


def _make(path: str, monkeypatch, timeout=None):
    """A group of every rank whose large calls take ``path`` (see the module docstring)."""
    monkeypatch.setenv("MPITENSOR_SHM_COLLECTIVES", "off" if path == "mpi" else "on")
    old = shm_coll.set_chunk(CHUNK)
    direct = shm_coll.set_direct(path == "direct")
    try:
        kw = {} if timeout is None else {"timeout": datetime.timedelta(seconds=timeout)}
        return dist.new_group(list(range(dist.get_world_size())), **kw)
    finally:
        shm_coll.set_chunk(old)
        shm_coll.set_direct(direct)


@pytest.fixture(params=PATHS)
def group(request, monkeypatch):
    """``(path, its group)``, the group made once per path and kept for the module."""
    if request.param not in _GROUPS:
        _GROUPS[request.param] = _make(request.param, monkeypatch)
    return request.param, _GROUPS[request.param]


def _path_taken(g, path: str) -> None:
    if g.size() > 1 and path != "mpi":
        assert isinstance(g.shm, Engine), "the call did not take the shared-memory engine"
    if path == "mpi":
        assert g.shm is None


def _bits(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a).tobytes()


def _in_place(g, x: np.ndarray, op) -> np.ndarray:
    y = x.copy()
    dist.all_reduce(y, op=op, group=g)
    return y


def _garbage(shape, dtype) -> np.ndarray:
    out = np.empty(shape, dtype)
    out.view(np.uint8)[...] = 0xA5  # what an uninitialised buffer might hold
    return out


@pytest.mark.parametrize("dtype,op", CASES, ids=[f"{np.dtype(d).name}-{o.name}"
                                                   for d, o in CASES])
def test_every_dtype_and_op_as_the_in_place_call(group, dtype, op):
    """Bitwise the in-place all_reduce's result on the same group; the rank-order reduction
    where its order is the API's; the input left as it was, bit for bit."""
    path, group = group
    me, p = dist.get_rank(), dist.get_world_size()
    exact = (np.dtype(dtype).kind in "iub" or op in (ReduceOp.MIN, ReduceOp.MAX)
             or group.shm_min < 1 << 60)  # the engine reduces in rank order
    for n in SIZES:
        x = _data(me, n, dtype)
        before = _bits(x)
        out = _garbage(n, dtype)
        group.all_reduce_into(out, x, op)
        assert _bits(x) == before, "the input changed"
        assert out.dtype == x.dtype and out.shape == x.shape
        _same(out, _in_place(group, x, op), op)
        if exact:
            _same(out, _expected([_data(r, n, dtype) for r in range(p)], op), op)
    _path_taken(group, path)


def test_layouts_tensors_and_async(group):
    """Tensors, async_op, strided input and output (staged), 2-D and 0-d arrays, a read-only
    input, an empty one: each the in-place call's result, the input unchanged."""
    _, group = group
    me = dist.get_rank()
    n = 2 * CHUNK + 7
    # Tensors, async: the output in place once waited for
    t_in = mt.tensor(_data(me, n, np.float64))
    t_out = mt.zeros(n, dtype=mt.float64)
    work = group.all_reduce_into(t_out, t_in, ReduceOp.MAX, async_op=True)
    work.wait()
    assert work.is_completed()
    assert _bits(t_out.numpy()) == _bits(_in_place(group, _data(me, n, np.float64),
                                                   ReduceOp.MAX))
    assert _bits(t_in.numpy()) == _bits(_data(me, n, np.float64))
    # strided input and output (every other element): staged, written back; the elements
    # between them untouched
    src = np.zeros((n, 2), np.float32)
    src[:, 0] = _data(me, n, np.float32)
    dst = np.full((n, 2), -7.0, np.float32)
    group.all_reduce_into(dst[:, 1], src[:, 0], ReduceOp.SUM)
    assert _bits(dst[:, 1]) == _bits(_in_place(group, _data(me, n, np.float32), ReduceOp.SUM))
    assert (dst[:, 0] == -7.0).all() and not src[:, 1].any()
    assert _bits(src[:, 0]) == _bits(_data(me, n, np.float32))
    # 2-D, read-only input
    m2 = _data(me, 6 * 700, np.int64).reshape(6, 700)
    m2.flags.writeable = False
    o2 = _garbage((6, 700), np.int64)
    group.all_reduce_into(o2, m2, ReduceOp.BXOR)
    assert _bits(o2) == _bits(_in_place(group, m2, ReduceOp.BXOR))
    # 0-d and empty
    z = np.array(me + 1.5)
    oz = np.array(0.0)
    group.all_reduce_into(oz, z, ReduceOp.SUM)
    assert oz == _in_place(group, z, ReduceOp.SUM)
    e = np.zeros((0, 3), np.float32)
    group.all_reduce_into(np.zeros((0, 3), np.float32), e, ReduceOp.SUM)


def test_aliasing(group):
    """The output the input itself (or a view of the same elements): in place. Two columns
    of one array (bounds that overlap, elements that do not): apart. An output that overlaps
    the input otherwise: ValueError on every rank before any traffic; the group goes on."""
    _, group = group
    me = dist.get_rank()
    n = 3 * CHUNK + 1
    for same in (lambda a: a, lambda a: a[:], lambda a: mt.from_numpy(a)):
        x = _data(me, n, np.float32)
        want = _in_place(group, x, ReduceOp.SUM)
        group.all_reduce_into(same(x), x, ReduceOp.SUM)
        assert _bits(x) == _bits(want)
    both = np.zeros((n, 2), np.float32)
    both[:, 0] = _data(me, n, np.float32)
    group.all_reduce_into(both[:, 1], both[:, 0], ReduceOp.SUM)
    assert _bits(both[:, 1]) == _bits(_in_place(group, _data(me, n, np.float32), ReduceOp.SUM))
    assert _bits(both[:, 0]) == _bits(_data(me, n, np.float32))
    buf = np.zeros(n + 1, np.float32)
    seq = group.seq
    with pytest.raises(ValueError, match="overlap without being the same buffer"):
        group.all_reduce_into(buf[1:], buf[:-1], ReduceOp.SUM)
    assert group.seq == seq + 1  # counted alike on every rank
    with pytest.raises(ValueError, match="needs the input's shape"):
        group.all_reduce_into(np.zeros(4), np.zeros((2, 2)), ReduceOp.SUM)
    y = _data(me, 10, np.float64)
    out = np.zeros(10)
    group.all_reduce_into(out, y, ReduceOp.SUM)  # the group still works
    assert _bits(out) == _bits(_in_place(group, y, ReduceOp.SUM))


def test_relation_of_two_buffers():
    """all_reduce_into's (and gather_p2p's) test of how two buffers' memory meets, NumPy's
    disjoint arrays answered first, without the general test."""
    from mpitensor.distributed.backends.mpi.all_reduce_into import APART, PARTIAL, SAME, relation
    a, b = np.zeros(8), np.zeros(8)
    both = np.zeros((8, 2))
    assert relation(a, b) == APART and relation(a, a) == SAME and relation(a[:], a) == SAME
    assert relation(both[:, 0], both[:, 1]) == APART  # bounds overlap, elements do not
    assert relation(a[1:], a[:-1]) == PARTIAL and relation(a[::2], a) == PARTIAL
    assert relation(a, [0.0] * 8) is None and relation("x", a) is None


@pytest.mark.parametrize("path", ["direct", "segment"])
def test_in_place_and_out_of_place_members_in_one_call(path, monkeypatch):
    """Through the engine, members may mix the two forms in one call: the same result."""
    if path not in _GROUPS:
        _GROUPS[path] = _make(path, monkeypatch)
    g = _GROUPS[path]
    me, p = dist.get_rank(), dist.get_world_size()
    n = 4 * CHUNK + 3
    want = _expected([_data(r, n, np.float32) for r in range(p)], ReduceOp.SUM)
    x = _data(me, n, np.float32)
    if me % 2:
        dist.all_reduce(x, group=g)
        got = x
    else:
        got = np.empty_like(x)
        g.all_reduce_into(got, x, ReduceOp.SUM)
    assert _bits(got) == _bits(want)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("what", ["shape", "op"])
def test_a_mismatched_call_raises_on_every_rank(path, what, monkeypatch):
    """A rank passing another shape (or op): the agreement check's error on every rank (the
    fingerprint beside the data: 64 KiB and more), as for all_reduce in place."""
    g = _make(path, monkeypatch)
    me = dist.get_rank()
    n = 1 << 15  # 128 KiB of float32
    g.all_reduce_into(np.zeros(n, np.float32), np.ones(n, np.float32), ReduceOp.SUM)
    x = np.ones(n + (me == 0 and what == "shape"), np.float32)
    op = ReduceOp.MAX if me == 0 and what == "op" else ReduceOp.SUM
    with pytest.raises((CollectiveMismatchError, PeerFailedError)) as info:
        g.all_reduce_into(np.zeros_like(x), x, op)
    if me == 0:
        assert info.type is CollectiveMismatchError
    dist.barrier()
    dist.destroy_process_group(g)


@pytest.mark.mpi(min_size=2)
def test_debug_mode_checks_the_arguments_first(monkeypatch):
    """Debug mode: the ranks' arguments agree before any traffic (the engine is never
    taken), and a rank with another shape gets CollectiveMismatchError on every rank."""
    with ai.debug_mode(True):
        g = _make("direct", monkeypatch)
        me, p = dist.get_rank(), dist.get_world_size()
        x = _data(me, 1000, np.float32)
        out = np.zeros_like(x)
        g.all_reduce_into(out, x, ReduceOp.SUM)
        assert _bits(out) == _bits(_in_place(g, x, ReduceOp.SUM))
        assert g.shm is None
        y = np.ones(10 + (me == p - 1), np.float32)
        with pytest.raises(CollectiveMismatchError, match="different shape"):
            g.all_reduce_into(np.zeros_like(y), y, ReduceOp.SUM)
        dist.barrier()
        dist.destroy_process_group(g)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("path", PATHS)
def test_a_rank_alone_times_out(path, monkeypatch):
    """Rank 0 enters the call alone: DistributedTimeoutError within the group's timeout
    naming all_reduce, and the group is broken on every rank (their next call raises)."""
    with ai.debug_mode(False):
        g = _make(path, monkeypatch, timeout=0.6)
        me = dist.get_rank()
        n = 1 << 15
        g.all_reduce_into(np.zeros(n, np.float32), np.ones(n, np.float32), ReduceOp.SUM)
        if me == 0:
            t0 = time.monotonic()
            with pytest.raises(DistributedTimeoutError, match="all_reduce"):
                g.all_reduce_into(np.zeros(n, np.float32), np.ones(n, np.float32),
                                  ReduceOp.SUM)
            assert time.monotonic() - t0 < 10
        dist.barrier()
        with pytest.raises(PeerFailedError):
            g.all_reduce_into(np.zeros(4), np.ones(4), ReduceOp.SUM)
        dist.barrier()
        dist.destroy_process_group(g)


# ---------------------------------------------------------------------------- DTensor
def _mesh(path: str, monkeypatch) -> DeviceMesh:
    """A 1-D mesh over the group of ``path`` (a mesh of the world in order would take the
    world group, made with the switch's default)."""
    if path not in _GROUPS:
        _GROUPS[path] = _make(path, monkeypatch)
    return DeviceMesh.from_group(_GROUPS[path], "cpu")


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("op", ["sum", "avg", "max", "min", "product"])
def test_partial_keeps_its_terms(path, op, monkeypatch):
    """Partial -> Replicate and Partial -> Shard(0): the terms stay as they were, bit for
    bit; the result is the reduction of the terms on the whole arrays (the in-place
    all_reduce of a copy on the mesh's group; for Shard(0), its rows)."""
    mesh = _mesh(path, monkeypatch)
    me, p = dist.get_rank(), dist.get_world_size()
    rows, cols = 8 * p, 3 * CHUNK // 8 + 5
    term = _data(me, rows * cols, np.float64).reshape(rows, cols)
    part = DTensor.from_local(mt.tensor(term.copy()), mesh, [Partial(op)])
    whole = _in_place(mesh.get_group(0), term, ReduceOp.members[op.upper()])
    rep = part.redistribute(mesh, [Replicate()])
    assert _bits(part.to_local().numpy()) == _bits(term)
    assert _bits(rep.to_local().numpy()) == _bits(whole)
    if path != "mpi" or op in ("max", "min"):  # the rank order
        want = _expected([_data(r, rows * cols, np.float64) for r in range(p)],
                         ReduceOp.members[op.upper()]).reshape(rows, cols)
        assert _bits(rep.to_local().numpy()) == _bits(want)
    sh = part.redistribute(mesh, [Shard(0)])  # reduce_scatter: its own order on MPI
    assert _bits(part.to_local().numpy()) == _bits(term)
    mine = whole[me * 8:(me + 1) * 8]
    if path != "mpi" or op in ("max", "min"):
        assert _bits(sh.to_local().numpy()) == _bits(mine)
    else:  # MPI's orders: each within (p-1) u of the exact sum of magnitudes (product:
        # of the exact product), so two of them within twice that, (p-1) eps
        mags = [np.abs(_data(r, rows * cols, np.float64)).reshape(rows, cols)[me * 8:me * 8 + 8]
                for r in range(p)]
        size = np.prod(mags, axis=0) if op == "product" else sum(mags)
        bound = (p - 1) * np.finfo(np.float64).eps * size
        assert (np.abs(sh.to_local().numpy() - mine) <= bound).all()
    _path_taken(mesh.get_group(0), path)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("op", ["sum", "avg"])
def test_backward_through_partial_to_replicate(path, op, monkeypatch):
    """d/d(term) of sum(w * reduce(terms)): w for sum, w / ranks for avg, on every rank; the
    forward's value that of the whole computation."""
    mesh = _mesh(path, monkeypatch)
    me, p = dist.get_rank(), dist.get_world_size()
    shape = (4 * p, 2 * CHUNK // 8 + 1)
    term = mt.tensor(_data(me, shape[0] * shape[1], np.float64).reshape(shape),
                     requires_grad=True)
    w = _data(p + 1, shape[0] * shape[1], np.float64).reshape(shape)  # the same everywhere
    part = DTensor.from_local(term, mesh, [Partial(op)])
    rep = part.redistribute(mesh, [Replicate()])
    loss = (rep.to_local() * mt.tensor(w)).sum()
    loss.backward()
    scale = 1.0 if op == "sum" else 1.0 / p
    np.testing.assert_array_equal(term.grad.numpy(), w * scale)
    whole = _in_place(mesh.get_group(0), term.detach().numpy(),
                      ReduceOp.members[op.upper()])
    assert _bits(rep.to_local().detach().numpy()) == _bits(whole)
    assert _bits(term.detach().numpy()) == _bits(
        _data(me, shape[0] * shape[1], np.float64).reshape(shape))


def test_a_group_without_the_out_of_place_call_reduces_a_copy(monkeypatch):
    """A group class without ``all_reduce_into`` (NCCL's): Partial -> Replicate reduces a
    copy of the terms in place, the same values, the terms kept."""
    mesh = _mesh("direct", monkeypatch)
    me = dist.get_rank()
    term = _data(me, 8 * CHUNK + 3, np.float64)
    whole = _in_place(mesh.get_group(0), term, ReduceOp.SUM)
    monkeypatch.delattr(Collectives, "all_reduce_into")
    assert not hasattr(mesh.get_group(0), "all_reduce_into")
    part = DTensor.from_local(mt.tensor(term.copy()), mesh, [Partial()])
    rep = part.redistribute(mesh, [Replicate()])
    assert _bits(rep.to_local().numpy()) == _bits(whole)
    assert _bits(part.to_local().numpy()) == _bits(term)
