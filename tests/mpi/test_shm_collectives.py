"""Node-local collectives through shared memory (``backends/mpi/shm_coll.py``) at 1-4 ranks.

Each test makes a group with ``MPITENSOR_SHM_COLLECTIVES=on`` and slots of a few KiB, so that
every call goes through the engine (at 2+ ranks) and most buffers stream through the segment
in several chunks; every result is compared, bitwise, with the reduction computed here in
rank order (``x0 op x1 op ... op x(p-1)``, the order the engine promises), on every rank.

Run: ``mpiexec -n N python -m pytest --with-mpi tests/mpi/test_shm_collectives.py``.
"""

from __future__ import annotations

import errno
import os
import time

import ml_dtypes
import numpy as np
import pytest

import mpitensor as mt
import mpitensor.distributed as dist
from mpitensor.distributed import ReduceOp
from mpitensor.distributed.backends.mpi import cma, shm_coll, shm_tiny
from mpitensor.distributed.backends.mpi.shm_pipe import Engine
from mpitensor.distributed.health import faults, watchdog
from mpitensor.errors import CollectiveMismatchError, MpiTensorError, PeerFailedError

CHUNK = 4096  # bytes per slot: a buffer of more than a few KiB takes several chunks
BF16 = np.dtype(ml_dtypes.bfloat16)
FLOATS = [np.float32, np.float64, np.float16, BF16, np.complex64]
INTS = [np.int32, np.int64, np.uint8, np.int8]
# sizes: one element, fewer than the ranks, not divisible by 2-4, more than one slot set
SIZES = [1, 3, 1001, 5 * CHUNK + 13]
_GROUPS: dict = {}


@pytest.fixture(params=["direct", "segment"])
def group(request, monkeypatch):
    """A group of every rank through the engine (made once per setting and path: groups are
    kept): ``direct``, where the kernel lets the ranks read each other's memory (cross-memory
    attach, see ``shm_direct``; else the segment's pipeline too), or ``segment``, the chunk
    pipeline through the shared slots."""
    path = request.param

    def make(setting: str = "on"):
        key = (setting, path)
        if key not in _GROUPS:
            monkeypatch.setenv("MPITENSOR_SHM_COLLECTIVES", setting)
            old = shm_coll.set_chunk(CHUNK)
            direct = shm_coll.set_direct(path == "direct")
            try:
                g = dist.new_group(list(range(dist.get_world_size())))
                _GROUPS[key] = g
            finally:
                shm_coll.set_chunk(old)
                shm_coll.set_direct(direct)
        return _GROUPS[key]
    old = shm_coll.set_chunk(CHUNK)
    yield make
    shm_coll.set_chunk(old)


def _data(rank: int, n: int, dtype) -> np.ndarray:
    """Rank ``rank``'s input: values that make every op's result depend on the order."""
    dt = np.dtype(dtype)
    i = np.arange(n)
    if dt == np.bool_:
        return (i * (rank + 3)) % (rank + 2) == 0
    if dt.kind in "iu":
        return ((i * 7 + rank * 13) % 11 + 1).astype(dt)
    x = np.sin(i * 0.37 + rank) * 3.3 + (rank + 1) / 7
    if dt.kind == "c":
        return (x + 1j * np.cos(i + rank)).astype(dt)
    return x.astype(dt)


_UF = {ReduceOp.SUM: np.add, ReduceOp.AVG: np.add, ReduceOp.PRODUCT: np.multiply,
       ReduceOp.MIN: np.minimum, ReduceOp.MAX: np.maximum, ReduceOp.BAND: np.bitwise_and,
       ReduceOp.BOR: np.bitwise_or, ReduceOp.BXOR: np.bitwise_xor}


def _expected(pieces: list, op) -> np.ndarray:
    """The rank-order reduction of ``pieces`` as the API defines it: bool SUM/PRODUCT are
    or/and; float16 and bfloat16 are reduced in float32 and rounded once; AVG divides the sum
    by the number of ranks."""
    dt = pieces[0].dtype
    if dt == np.bool_:
        f = {ReduceOp.SUM: np.logical_or, ReduceOp.PRODUCT: np.logical_and,
             ReduceOp.MIN: np.logical_and, ReduceOp.MAX: np.logical_or,
             ReduceOp.BAND: np.logical_and, ReduceOp.BOR: np.logical_or,
             ReduceOp.BXOR: np.logical_xor}[op]
    else:
        f = _UF[op]
    half = dt in (np.dtype(np.float16), BF16)
    acc = pieces[0].astype(np.float32) if half else pieces[0].copy()
    for x in pieces[1:]:
        acc = f(acc, x.astype(np.float32) if half else x)
    if op == ReduceOp.AVG:
        acc = acc / len(pieces)
    return acc.astype(dt)


def _cases():
    for dt in FLOATS:
        ops = [ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.AVG]
        if np.dtype(dt).kind != "c":
            ops += [ReduceOp.MIN, ReduceOp.MAX]
        for op in ops:
            yield dt, op
    for dt in INTS:
        for op in (ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.BAND,
                   ReduceOp.BOR, ReduceOp.BXOR):
            yield dt, op
    for op in (ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.MAX, ReduceOp.BXOR):
        yield np.bool_, op


CASES = list(_cases())


def _same(got: np.ndarray, want: np.ndarray, op=None) -> None:
    assert got.dtype == want.dtype
    if op == ReduceOp.PRODUCT and want.dtype.kind == "c":
        # NumPy multiplies complex numbers with or without fused multiply-adds depending on
        # the loop it picks for an array's length, so a product of other lengths than the
        # test's may round differently: each of the p-1 products is within sqrt(5) eps of the
        # exact one (normwise), twice that for the FMA form
        p = dist.get_world_size()
        bound = (p - 1) * 2 * np.sqrt(5) * np.finfo(want.dtype).eps * np.abs(want)
        assert (np.abs(got - want) <= bound).all(), (got[:8], want[:8])
        return
    assert got.tobytes() == want.tobytes(), (got[:8], want[:8])


def _kernel_lets_ranks_read_each_other() -> bool:
    """Asked here without the engine: can every rank read every other rank's memory?"""
    mark = np.array([os.getpid()], np.int64)
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, (os.getpid(), mark.ctypes.data))
    ok = cma.available()
    got = np.zeros(1, np.int64)
    for pid, addr in every:
        try:
            cma.Reader().read(pid, got.ctypes.data, addr, 8)
        except OSError:
            ok = False
        ok = ok and int(got[0]) == pid
    oks = [None] * dist.get_world_size()
    dist.all_gather_object(oks, ok)
    return all(oks)


def _through_engine(g) -> None:
    """The calls took the engine, on the path the group was made for."""
    if g.size() > 1:
        assert isinstance(g.shm, Engine), "the call did not take the shared-memory engine"
        want = g.shm_direct and _kernel_lets_ranks_read_each_other()
        assert g.shm.cma == want, "the engine took the other path"


@pytest.mark.parametrize("dtype,op", CASES, ids=[f"{np.dtype(d).name}-{o.name}"
                                                   for d, o in CASES])
def test_all_reduce_and_reduce_match_the_rank_order(group, dtype, op):
    g = group()
    me, p = dist.get_rank(), dist.get_world_size()
    for n in SIZES:
        want = _expected([_data(r, n, dtype) for r in range(p)], op)
        x = _data(me, n, dtype)
        dist.all_reduce(x, op=op, group=g)
        _same(x, want, op)
        y = _data(me, n, dtype)
        dist.reduce(y, dst=p - 1, op=op, group=g)
        _same(y, want if me == p - 1 else _data(me, n, dtype), op)
    _through_engine(g)


@pytest.mark.parametrize("dtype,op", CASES, ids=[f"{np.dtype(d).name}-{o.name}"
                                                   for d, o in CASES])
def test_reduce_scatter_both_forms(group, dtype, op):
    # (on the direct path each chunk of out first receives a peer's piece and then takes
    # the others in place, member 0 computing its own op the peer's: every case, every rank)
    g = group()
    me, p = dist.get_rank(), dist.get_world_size()
    for m in (1, 333, 3 * CHUNK + 5):
        full = [_data(r, m * p, dtype) for r in range(p)]
        want = _expected(full, op)[me * m:(me + 1) * m]
        out = np.zeros(m, dtype)
        dist.reduce_scatter_tensor(out, full[me].copy(), op=op, group=g)
        _same(out, want, op)
        out2 = np.zeros(m, dtype)
        dist.reduce_scatter(out2, [full[me][r * m:(r + 1) * m].copy() for r in range(p)], op=op,
                            group=g)
        _same(out2, want, op)
    _through_engine(g)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, BF16, np.int64, np.bool_,
                                   np.complex128, np.uint8])
def test_all_gather_both_forms_and_broadcast(group, dtype):
    g = group()
    me, p = dist.get_rank(), dist.get_world_size()
    for n in SIZES:
        mine = _data(me, n, dtype)
        out = np.zeros(n * p, dtype)
        dist.all_gather_into_tensor(out, mine, group=g)
        _same(out, np.concatenate([_data(r, n, dtype) for r in range(p)]))
        outs = [np.zeros((n,), dtype) for _ in range(p)]
        dist.all_gather(outs, mine, group=g)
        for r in range(p):
            _same(outs[r], _data(r, n, dtype))
        b = _data(me, n, dtype)
        dist.broadcast(b, src=p - 1, group=g)
        _same(b, _data(p - 1, n, dtype))
    _through_engine(g)


@pytest.mark.parametrize("dtype", [np.float32, np.uint8, np.complex128])
def test_all_gather_own_piece_streamed(group, monkeypatch, dtype):
    # the direct path copies this member's own piece with stores that bypass the cache from
    # shm_direct.STREAM_BYTES (lowered here to every size): the same bits, odd lengths too
    from mpitensor.distributed.backends.mpi import shm_direct

    monkeypatch.setattr(shm_direct, "STREAM_BYTES", 0)
    g = group()
    me, p = dist.get_rank(), dist.get_world_size()
    for n in SIZES:
        out = np.zeros(n * p, dtype)
        dist.all_gather_into_tensor(out, _data(me, n, dtype), group=g)
        _same(out, np.concatenate([_data(r, n, dtype) for r in range(p)]))
    _through_engine(g)


def test_layouts_tensors_async_and_in_place_idioms(group):
    g = group()
    me, p = dist.get_rank(), dist.get_world_size()
    n = 2 * CHUNK + 7
    # a strided (non-contiguous) buffer: staged, written back
    base = np.zeros((n, 2), np.float32)
    base[:, 0] = _data(me, n, np.float32)
    col = base[:, 0]
    dist.all_reduce(col, group=g)
    _same(np.ascontiguousarray(col), _expected([_data(r, n, np.float32) for r in range(p)],
                                               ReduceOp.SUM))
    assert not base[:, 1].any()
    # a Tensor, async: complete on wait, the result in place
    t = mt.tensor(_data(me, n, np.float64))
    work = dist.all_reduce(t, op=ReduceOp.MAX, group=g, async_op=True)
    work.wait()
    assert work.is_completed()
    _same(t.numpy(), _expected([_data(r, n, np.float64) for r in range(p)], ReduceOp.MAX))
    # all_gather_into_tensor with the input as this rank's chunk of the output
    out = np.zeros(n * p, np.int32)
    out[me * n:(me + 1) * n] = _data(me, n, np.int32)
    dist.all_gather_into_tensor(out, out[me * n:(me + 1) * n], group=g)
    _same(out, np.concatenate([_data(r, n, np.int32) for r in range(p)]))
    # reduce_scatter_tensor with the output as this rank's chunk of the input
    full = _data(me, n * p, np.float32)
    want = _expected([_data(r, n * p, np.float32) for r in range(p)], ReduceOp.SUM)
    dist.reduce_scatter_tensor(full[me * n:(me + 1) * n], full, group=g)
    _same(full[me * n:(me + 1) * n], want[me * n:(me + 1) * n])
    # a 2-D buffer keeps its shape
    m2 = _data(me, 6 * 7, np.int64).reshape(6, 7)
    dist.broadcast(m2, src=0, group=g)
    _same(m2, _data(0, 42, np.int64).reshape(6, 7))
    _through_engine(g)


def test_results_bitwise_equal_on_every_rank(group):
    g = group()
    me = dist.get_rank()
    x = _data(me, 4 * CHUNK + 1, np.float32) * np.float32(1e3)
    dist.all_reduce(x, group=g)
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, x.tobytes())
    assert all(e == every[0] for e in every)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("what", ["shape", "op"])
def test_a_mismatched_call_raises_on_every_rank(group, monkeypatch, what):
    """A rank passing another shape (or op) than its peers: the agreement check's error on
    every rank, as on the MPI path; the group is broken, the next group works."""
    monkeypatch.setenv("MPITENSOR_SHM_COLLECTIVES", "on")
    g = dist.new_group(list(range(dist.get_world_size())))
    me = dist.get_rank()
    dist.all_reduce(np.ones(100, np.float32), group=g)  # the engine is made
    x = np.ones(100 + (me == 0 and what == "shape"), np.float32)
    op = ReduceOp.MAX if me == 0 and what == "op" else ReduceOp.SUM
    with pytest.raises(CollectiveMismatchError, match="disagree on the"):
        dist.all_reduce(x, op=op, group=g)
    dist.destroy_process_group(g)


def test_switch_off_and_small_calls_stay_on_mpi(group):
    g = group("off")
    x = np.ones(100_000, np.float32)
    dist.all_reduce(x, group=g)
    assert (x == dist.get_world_size()).all()
    assert g.shm is None and g.shm_min > 1 << 60
    world = group("auto")
    if world.size() > 1:
        # (from the floor, or past the largest call its board takes: shm_tiny.make)
        assert world.shm_min == max(shm_coll.FLOOR, world.pers_max + 1)
        y = np.ones(4, np.float32)
        dist.all_reduce(y, group=world)  # below the floor: the engine is not even made
        assert world.shm is None


@pytest.mark.mpi(min_size=2)
def test_an_all_reduce_past_the_boards_own_asks_the_engine(monkeypatch):
    """``auto``: a group's board may keep smaller all-reduces than its other calls (a pair's:
    ``shm_tiny.PAIR_REDUCE_CAP``). An all_gather that the board takes makes no engine; the
    first all_reduce past the board's largest all_reduce asks for it, whatever the other
    kinds' caps, and the sum is right on every rank whichever path the calibration picks."""
    monkeypatch.setenv("MPITENSOR_SHM_COLLECTIVES", "auto")
    g = dist.new_group(list(range(dist.get_world_size())))
    me, p = dist.get_rank(), dist.get_world_size()
    board = g.tiny
    if board is None:
        pytest.skip("no board (its compiled module was not built)")
    most = board.most
    assert g.shm_ar_min == max(shm_coll.FLOOR, most[shm_tiny.REDUCE] + 1) <= g.shm_min
    n = g.shm_ar_min // 4 // p + 1  # each rank's part of an all_reduce just past the board's
    if n * p * 4 <= most[shm_tiny.GATHER]:  # an all_gather of that output: the board's
        out = np.zeros(n * p, np.float32)
        dist.all_gather_into_tensor(out, np.full(n, me, np.float32), group=g)
        np.testing.assert_array_equal(out, np.repeat(np.arange(p, dtype=np.float32), n))
        assert g.shm is None
    x = _data(me, n * p, np.float32)
    dist.all_reduce(x, group=g)
    assert isinstance(g.shm, Engine)
    pieces = [_data(r, n * p, np.float32) for r in range(p)]
    bound = (p - 1) * np.finfo(np.float32).eps * np.sum(np.abs(pieces), axis=0)
    assert (np.abs(x - _expected(pieces, ReduceOp.SUM)) <= bound).all()
    assert g.shm_ar_min >= g.shm.thresholds["reduce"]  # (no lower than its measured threshold)
    dist.destroy_process_group(g)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("where", ["threshold", "floor"])
def test_sizes_on_both_sides_of_the_crossover_raise_a_mismatch(monkeypatch, where):
    """Rank 0 passes a size the engine takes, the others one it leaves to MPI (below its
    threshold, or below the group's floor, where the call never asks the engine): a mismatch
    error on rank 0 within a few seconds, not the timeout, and an error on every other rank
    (the mismatch, or the group rank 0 broke); the group is broken, the next group works."""
    monkeypatch.setenv("MPITENSOR_SHM_COLLECTIVES", "on")
    g = dist.new_group(list(range(dist.get_world_size())), timeout=60.0)
    me = dist.get_rank()
    dist.all_reduce(np.ones(100, np.float32), group=g)  # the engine is made
    g.shm.thresholds = {k: 1 << 16 for k in g.shm.thresholds}
    if where == "floor":
        g.shm_min = g.shm_ar_min = 1 << 16
    x = np.ones((1 << 15) if me == 0 else 100, np.float32)  # 128 KiB on rank 0, else 400 B
    t0 = time.monotonic()
    with pytest.raises((CollectiveMismatchError, PeerFailedError)) as info:
        dist.all_reduce(x, group=g)
    assert time.monotonic() - t0 < 30
    if me == 0:
        assert info.type is CollectiveMismatchError
        assert "ranks disagree on the" in str(info.value)
    dist.destroy_process_group(g)
    y = np.ones(10, np.float32)
    dist.all_reduce(y, group=dist.new_group(list(range(dist.get_world_size()))))
    assert (y == dist.get_world_size()).all()


@pytest.mark.mpi(min_size=2)
def test_measured_thresholds_agree_on_every_rank(monkeypatch):
    """``auto``: the group's first large call makes the engine and times it against MPI;
    every rank ends with the same thresholds and the same measured ratios (each decides from
    the same reduced times), each threshold the floor or more, and a call of every kind
    gives the sum on every rank whichever path its size takes (MPI's may add in another
    order: within (p-1) eps of the sum of magnitudes)."""
    monkeypatch.setenv("MPITENSOR_SHM_COLLECTIVES", "auto")
    g = dist.new_group(list(range(dist.get_world_size())))
    me, p = dist.get_rank(), dist.get_world_size()
    k = -(-g.shm_min // 4)  # the group's first call that asks the engine
    x = _data(me, k, np.float32)
    dist.all_reduce(x, group=g)
    eng = g.shm
    assert isinstance(eng, Engine)
    mine = (sorted(eng.thresholds.items()), eng.calibration.tobytes())
    every = [None] * p
    dist.all_gather_object(every, mine)
    assert all(e == every[0] for e in every)
    assert eng.calibration.shape == (len(shm_coll._CAL_BYTES), len(shm_coll._KINDS))
    assert all(v >= shm_coll.FLOOR for v in eng.thresholds.values())
    pieces = [_data(r, k, np.float32) for r in range(p)]
    bound = (p - 1) * np.finfo(np.float32).eps * np.sum(np.abs(pieces), axis=0)
    assert (np.abs(x - _expected(pieces, ReduceOp.SUM)) <= bound).all()
    dist.destroy_process_group(g)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("late", [0, 1])
def test_a_mismatched_first_call_is_refused_before_the_calibration(monkeypatch, late):
    """``auto``: a group's first large call makes its engine and times it against MPI. A
    first call whose shape differs on rank 0 is refused on every rank before any of those
    timed calls (one rank that found it inside them would leave them while a peer still read
    its buffers: that peer failed with a bare EFAULT). Whichever rank comes late, and with
    the waits' own look at the agreement slots off (it may come too late: it runs on their
    slow tick only), so that the engine's setup must find it itself (a rank whose wait met
    the notice of a peer that found it first says so: PeerFailedError)."""
    monkeypatch.setenv("MPITENSOR_SHM_COLLECTIVES", "auto")
    timed = []
    monkeypatch.setattr(shm_coll, "_calibrate", lambda *a: timed.append(a) or dict.fromkeys(
        ("reduce", "scatter", "move"), 0))
    monkeypatch.setattr(watchdog, "fault_in_wait", lambda h, kind, seq, op, peer, since:
                        faults.in_wait(h, kind, seq, op, peer, since))
    g = dist.new_group(list(range(dist.get_world_size())))
    me, p = dist.get_rank(), dist.get_world_size()
    n = g.shm_min // 4 // p + 1  # out: past the group's floor, where the engine is made
    inp = np.ones(n, np.float32) if me == 0 else np.ones((1, n), np.float32)
    out = np.zeros(p * n, np.float32)
    if me == late:
        time.sleep(0.3)
    with pytest.raises((CollectiveMismatchError, PeerFailedError), match="disagree on the shape"):
        dist.all_gather_into_tensor(out, inp, group=g)
    assert timed == []
    dist.destroy_process_group(g)
    y = np.ones(10, np.float32)
    dist.all_reduce(y, group=dist.new_group(list(range(p))))
    assert (y == p).all()


def _direct_group(monkeypatch):
    """A group of every rank whose calls all take the engine, on its direct path if it can."""
    monkeypatch.setenv("MPITENSOR_SHM_COLLECTIVES", "on")
    direct = shm_coll.set_direct(True)
    try:
        return dist.new_group(list(range(dist.get_world_size())))
    finally:
        shm_coll.set_direct(direct)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("told", [True, False])
def test_a_read_that_fails_says_why_the_peer_left(monkeypatch, told):
    """Direct path: a peer's buffer that cannot be read (EFAULT, its process alive) means the
    peer left the call. Where it left for a mismatch this rank had not checked yet (here:
    its check skipped), the read's error is that mismatch; where nothing explains it, the
    bare read error after a moment, and the peers learn the group broke."""
    g = _direct_group(monkeypatch)
    me, p = dist.get_rank(), dist.get_world_size()
    dist.all_reduce(np.ones(1000, np.float32), group=g)  # the engine is made
    if not g.shm.cma:
        pytest.skip("cross-memory attach is not allowed here: no direct path")
    inp = np.ones((1, 1000) if me == 0 and told else 1000, np.float32)
    out = np.zeros(p * 1000, np.float32)
    if me == 1:
        class Refused:
            def read(self, pid, dst, src, nbytes):
                raise cma.CmaError(errno.EFAULT, "process_vm_readv failed: EFAULT (test)")
        monkeypatch.setattr(g.shm, "reader", Refused())
        if told:  # as if it had read before rank 0's mismatch check ended rank 0's call
            monkeypatch.setattr(g, "_fp_settle", lambda op, s: None)
    if told:
        with pytest.raises(CollectiveMismatchError, match="disagree on the shape"):
            dist.all_gather_into_tensor(out, inp, group=g)
    elif me == 1:
        t0 = time.monotonic()
        with pytest.raises(MpiTensorError, match=r"could not read rank \d+'s buffer") as info:
            dist.all_gather_into_tensor(out, inp, group=g)
        assert not isinstance(info.value, PeerFailedError)
        assert 0.9 < time.monotonic() - t0 < 30
    else:
        with pytest.raises(PeerFailedError, match="rank 1"):
            dist.all_gather_into_tensor(out, inp, group=g)
    dist.destroy_process_group(g)


@pytest.mark.mpi(min_size=2)
def test_no_write_lands_in_a_buffer_its_member_has_left(monkeypatch):
    """Direct path, all_reduce in place where members write their reduced parts into their
    peers' buffers (``shm_direct._write``): rank 1 leaves the call early (an error inside
    it) while the others are about to write into its buffer. Their writes are refused, they
    raise, and rank 1's buffer, which its caller has back, stays as it was: nothing lands in
    it later."""
    g = _direct_group(monkeypatch)
    me = dist.get_rank()
    dist.all_reduce(np.ones(1000, np.float32), group=g)  # the engine is made
    if not g.shm.puts:
        pytest.skip("members may not write into each other's memory here")
    from mpitensor.distributed.backends.mpi import shm_direct
    x = np.full(4096, 7.0, np.float32)
    if me == 1:
        def leave(*args, **kwargs):
            raise RuntimeError("test: rank 1 leaves the call")
        monkeypatch.setattr(shm_direct, "_reduce_part", leave)
        with pytest.raises(RuntimeError, match="rank 1 leaves"):
            dist.all_reduce(x, group=g)
        time.sleep(1.5)  # the others' writes would land meanwhile
        assert (x == 7.0).all()
    else:
        write = shm_direct._write

        def late(*args):
            time.sleep(0.3)  # rank 1 has left by now
            return write(*args)
        monkeypatch.setattr(shm_direct, "_write", late)
        with pytest.raises(PeerFailedError, match="rank 1 leaves the call"):
            dist.all_reduce(x, group=g)
    dist.destroy_process_group(g)
