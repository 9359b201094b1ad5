"""The board's two shortcuts (``backends/mpi/shm_tiny.py``, ``_tiny.c``), at 1-4 ranks.

* A post of at least ``Board.nt_min`` bytes copies its data with non-temporal stores
  (``copy_in``): every size around the 64-byte step and the threshold, from unaligned sources,
  in every kind of call, must give the bytes a plain copy gives.
* A blocking call whose kind, size, root, dtype and op took the fast path onto the board
  before takes the group's lane (``_tiny.Lane``, ``SmallCalls._to_lane``): broadcast,
  all_reduce, reduce, all_gather_into_tensor and reduce_scatter_tensor, in C. It must keep
  every check of the fast path it skips (debug mode, the agreement check, a fault notice, a
  non-contiguous, read-only or overlapping buffer, another dtype or op of the same size, async
  calls, a root or op that differs between ranks), count the call in the group's history as
  the fast path does, and never give a number another path would not.
"""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import mpitensor as mt
import mpitensor.distributed as dist
from mpitensor.distributed import _world
from mpitensor.distributed.backends.mpi import persistent, shm_tiny
from mpitensor.distributed.backends.mpi.shm_tiny import _tiny
from mpitensor.distributed.health.state import MASK
from mpitensor.errors import CollectiveMismatchError, PeerFailedError

from .arrayimpl import debug_mode
from .test_shm_tiny import board_group, world

SIZES = (1, 63, 64, 65, 1000, 2047, 2048, 2049, 3001, 4095, 4096)


def data(nbytes, rank, salt=0):
    """Rank ``rank``'s bytes, at an odd address (a view one byte into a larger buffer)."""
    rng = np.random.default_rng(7000 + 31 * rank + salt)
    buf = rng.integers(0, 256, nbytes + 1, dtype=np.uint8)
    return buf[1:]


@pytest.mark.parametrize("nt_min", ["default", "never", "always"])
def test_every_kind_and_size_gives_the_same_bytes_whichever_copy_posts_it(nt_min):
    n, me = world()
    g = board_group(f"nt_{nt_min}")
    c = _world._pg(g).tiny.c
    assert c.nt_min in (2048, shm_tiny.NEVER)  # (as the group's timing chose)
    c.nt_min = {"default": c.nt_min, "never": 1 << 30, "always": 0}[nt_min]
    for nb in SIZES:
        for root in range(n):
            x = data(nb, me)
            dist.broadcast(x, src=root, group=g)
            np.testing.assert_array_equal(x, data(nb, root))
        x = data(nb, me)
        dist.all_reduce(x, group=g)  # uint8: wraps, as MPI's does
        want = sum(data(nb, r).astype(np.int64) for r in range(n)) % 256
        np.testing.assert_array_equal(x, want.astype(np.uint8))
        part = max(1, nb // n)
        if part * n <= _world._pg(g).tiny.cap:
            out = np.zeros(part * n + 1, np.uint8)[1:]
            dist.all_gather_into_tensor(out, data(part, me, 1), group=g)
            np.testing.assert_array_equal(out, np.concatenate([data(part, r, 1)
                                                               for r in range(n)]))
            got = np.zeros(part + 1, np.uint8)[1:]
            dist.reduce_scatter_tensor(got, data(part * n, me, 2), group=g)
            whole = sum(data(part * n, r, 2).astype(np.int64) for r in range(n)) % 256
            np.testing.assert_array_equal(got, whole[me * part:(me + 1) * part])
    dist.destroy_process_group(g)


def test_the_copy_is_chosen_alike_on_every_rank_from_calls_timed_there(monkeypatch):
    n, me = world()
    g = board_group("choice")
    b = _world._pg(g).tiny
    from mpitensor.distributed.health import watchdog
    if not watchdog.may_spin():  # ranks outnumber cores: nothing timed, plain copies
        assert b.copy_times is None and b.c.nt_min == shm_tiny.NEVER
        assert b.bcast_times is None and b.c.nt_bcast == _tiny.NT_BCAST
    else:
        plain, streamed = b.copy_times
        assert 0 < plain < 1e-3 and 0 < streamed < 1e-3  # seconds a call of 4 KiB
        assert b.c.nt_min == (2048 if streamed < 0.9 * plain else shm_tiny.NEVER)
        plain, streamed = b.bcast_times  # a broadcast of 16 KiB
        assert 0 < plain < 1e-3 and 0 < streamed < 1e-3
        assert b.c.nt_bcast == (_tiny.NT_BCAST if streamed < 0.9 * plain else shm_tiny.NEVER)
    everyone = MPI.COMM_WORLD.allgather((b.c.nt_min, b.c.nt_bcast, b.copy_times, b.bcast_times))
    assert everyone == [everyone[0]] * n
    # the same ranks again: the times of the first decide (no new timing)
    monkeypatch.setattr(shm_tiny, "_time_copies", lambda *a: pytest.fail("timed again"))
    again = board_group("choice2")
    b2 = _world._pg(again).tiny
    assert (b2.c.nt_min, b2.c.nt_bcast, b2.copy_times, b2.bcast_times) == (
        b.c.nt_min, b.c.nt_bcast, b.copy_times, b.bcast_times)
    dist.destroy_process_group(again)
    dist.destroy_process_group(g)


def lane_group(tag):
    """A board group whose broadcasts go on the board, its lane filled for 16 bytes from
    every root; skips where broadcasts stay on MPI (ranks outnumber cores)."""
    n, me = world()
    g = board_group(tag)
    pg = _world._pg(g)
    x = np.ones(4, np.float32)
    dist.all_reduce(x, group=g)  # (the group's first small call makes its cache)
    if not pg.tiny.bcast:
        pytest.skip("ranks outnumber cores: broadcasts stay on MPI (no lane)")
    for root in range(n):
        dist.broadcast(np.full(4, float(me), np.float32), src=root, group=g)
    assert pg.lane is not None and pg.lane.used == n + 1  # (and the all_reduce)
    return g, pg


def test_calls_on_the_lane_skip_no_check_of_the_fast_path():
    n, me = world()
    g, pg = lane_group("checks")
    seq = pg.seq
    for root in range(n):  # 16 bytes each: on the lane
        y = np.full(4, float(me), np.float32)
        dist.broadcast(y, src=root, group=g)
        np.testing.assert_array_equal(y, np.full(4, float(root), np.float32))
    assert pg.seq == seq + n
    s, op, dtype, shape = pg.history[pg.seq & MASK]  # what a stall report names
    assert (s, op, dtype, shape) == (pg.seq, "broadcast", np.dtype(np.float32), (4,))
    # 16 bytes too, but strided: the general path stages it
    z = np.zeros(8, np.float32)
    z[::2] = me
    dist.broadcast(z[::2], src=n - 1, group=g)
    np.testing.assert_array_equal(z, np.tile([n - 1, 0], 4).astype(np.float32))
    # a Tensor, a read-only root buffer, another dtype of 16 bytes, an async call
    t = mt.full((4,), float(me))
    dist.broadcast(t, src=0, group=g)
    assert t.tolist() == [0.0] * 4
    ro = np.full(2, me + 10, np.int64)
    if me == 0:
        ro.flags.writeable = False
    dist.broadcast(ro, src=0, group=g)
    assert ro.tolist() == [10, 10]
    a = np.full(4, float(me), np.float32)
    w = dist.broadcast(a, src=n - 1, group=g, async_op=True)
    w.wait()
    np.testing.assert_array_equal(a, np.full(4, float(n - 1), np.float32))
    dist.destroy_process_group(g)
    assert pg.lane is None


@pytest.mark.mpi(min_size=2)
def test_a_root_mismatch_on_the_lane_raises():
    """Every root's broadcast of this size is on the lane: each rank naming itself the root
    must still end in an error on every rank."""
    _, me = world()
    g, _ = lane_group("root")
    with pytest.raises(CollectiveMismatchError, match="root"):
        dist.broadcast(np.ones(4, np.float32), src=me, group=g)
    dist.destroy_process_group(g)


@pytest.mark.mpi(min_size=2)
def test_debug_mode_and_the_agreement_check_see_calls_the_lane_took_before():
    """float32 on rank 0, int32 elsewhere, 16 bytes: the board moves bytes alike; debug mode
    and the agreement check (check_bytes 0) compare the dtypes, lane or not."""
    _, me = world()
    g, _ = lane_group("debug")
    x = np.ones(4, np.float32 if me == 0 else np.int32)
    with debug_mode(True):
        with pytest.raises(CollectiveMismatchError, match="dtype"):
            dist.broadcast(x, src=0, group=g)
    dist.destroy_process_group(g)
    g, _ = lane_group("agree")
    g.check_bytes = 0
    with pytest.raises(CollectiveMismatchError, match="dtype"):
        dist.broadcast(x, src=0, group=g)
    dist.destroy_process_group(g)


def test_the_lane_stays_small():
    n, me = world()
    g, pg = lane_group("small")
    for k in range(1, 2 * _tiny.LANE_SLOTS + 1):
        x = np.full(k, me, np.int8)
        dist.broadcast(x, src=0, group=g)
        assert (x == 0).all()
        assert 0 < pg.lane.used <= _tiny.LANE_SLOTS // 2
    dist.destroy_process_group(g)


def test_calls_the_cache_let_go_are_collected():
    """A board call and its compiled spec refer to each other; once the cache lets the call
    go (more sizes than it keeps), the collector must free both with the call's buffers (a
    spec the collector could not see kept every call ever made: 70 MiB over 10,000 calls of
    random sizes at 4 ranks)."""
    import gc

    n, me = world()
    g = board_group("collect")
    for k in range(1, 4 * persistent.CAP):
        x = np.full(k * 16, float(me), np.float32)
        dist.all_reduce(x, group=g)
        assert x[0] == sum(range(n))
    gc.collect()
    alive = [o for o in gc.get_objects() if type(o) is shm_tiny.Call and o.board.g is _world._pg(g)]
    assert len(alive) <= persistent.CAP
    dist.destroy_process_group(g)


# ---------------------------------------------------------------- every kind on the lane
def _calls(g, me, n, dtype, k):
    """One blocking call of each kind on ``g``, each rank's data ``me``-dependent, ``k``
    elements a rank (reduce and broadcast to every root): the results, in order."""
    got = []
    for root in range(n):
        x = np.arange(k, dtype=dtype) + me
        dist.broadcast(x, src=root, group=g)
        got.append(x)
        y = np.arange(k, dtype=dtype) * (me + 1)
        dist.reduce(y, dst=root, group=g)
        got.append(y if me == root else None)
    for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX):
        z = np.arange(k, dtype=dtype) * (me + 1)
        dist.all_reduce(z, op=op, group=g)
        got.append(z)
    out = np.zeros(k * n, dtype)
    dist.all_gather_into_tensor(out, np.full(k, me, dtype), group=g)
    got.append(out)
    part = np.zeros(k, dtype)
    dist.reduce_scatter_tensor(part, np.arange(k * n, dtype=dtype) + me, group=g)
    got.append(part)
    return got


def _want(me, n, dtype, k):
    a, tri = np.arange(k, dtype=dtype), n * (n + 1) // 2
    want = []
    for root in range(n):
        want += [a + root, a * tri if me == root else None]
    want += [a * tri, a * n, np.repeat(np.arange(n, dtype=dtype), k),
             (np.arange(k * n, dtype=dtype) * n + sum(range(n)))[me * k:(me + 1) * k]]
    return want


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.uint8])
def test_every_kind_takes_the_lane_the_second_time_and_gives_the_same(dtype, monkeypatch):
    """The first call of each kind, size, root, dtype and op takes the Python fast path and
    puts its board call on the lane; the second takes the lane (no Python fast path: nothing
    added), counts itself as the fast path does and gives the same numbers."""
    n, me = world()
    g = board_group(f"kinds_{np.dtype(dtype).name}")
    pg = _world._pg(g)
    k = 3
    first = _calls(g, me, n, dtype, k)
    if pg.lane is None:
        pytest.skip("no lane: the group's notices come by message")
    added = []
    monkeypatch.setattr(pg, "_to_lane", lambda *a: added.append(a[0]))
    seq = pg.seq
    second = _calls(g, me, n, dtype, k)
    calls = 2 * n + 4
    assert pg.seq == seq + calls
    for got, again, want in zip(first, second, _want(me, n, dtype, k)):
        if want is None:
            continue
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(again, want)
    board_bcast = pg.tiny.bcast  # (ranks outnumber cores: broadcasts stay on MPI)
    assert added == [] if board_bcast else set(added) <= {shm_tiny.BCAST}
    s, op, dt, shape = pg.history[pg.seq & MASK]  # the last: the reduce_scatter, by its input
    assert (s, op, dt, shape) == (pg.seq, "reduce_scatter_tensor", np.dtype(dtype), (k * n,))
    dist.destroy_process_group(g)


def test_calls_the_lane_leaves_to_the_fast_path():
    """Each of these passes what the lane must not take: it leaves them to the Python paths,
    which give the same numbers (or raise), and the lane's calls go on as before."""
    n, me = world()
    g = board_group("leaves")
    k = 4
    _calls(g, me, n, np.float32, k)  # every kind of 16 bytes on the lane
    # an all_gather in place (the input a view of the output: they overlap)
    out = np.zeros(k * n, np.float32)
    out[me * k:(me + 1) * k] = me
    dist.all_gather_into_tensor(out, out[me * k:(me + 1) * k], group=g)
    np.testing.assert_array_equal(out, np.repeat(np.arange(n, dtype=np.float32), k))
    # another dtype of the same bytes; Tensors; a 0-d input; strided buffers
    x = np.full(k, me, np.int32)
    dist.all_reduce(x, group=g)
    assert x.tolist() == [sum(range(n))] * k
    t = mt.full((k,), float(me + 1))
    dist.all_reduce(t, group=g)
    assert t.tolist() == [n * (n + 1) / 2] * k
    z = np.zeros(2 * k, np.float32)
    z[::2] = me + 1
    dist.all_reduce(z[::2], group=g)
    assert z[::2].tolist() == [n * (n + 1) / 2] * k and z[1::2].tolist() == [0] * k
    # a read-only output, on every rank alike: the fast path's error, nothing posted
    ro = np.zeros(k * n, np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="writ|read-only"):
        dist.all_gather_into_tensor(ro, np.ones(k, np.float32), group=g)
    # async calls
    a = np.full(k, float(me), np.float32)
    dist.all_reduce(a, group=g, async_op=True).wait()
    assert a.tolist() == [sum(range(n))] * k
    for got, want in zip(_calls(g, me, n, np.float32, k), _want(me, n, np.float32, k)):
        if want is not None:
            np.testing.assert_array_equal(got, want)
    dist.destroy_process_group(g)


def _reduction(kind, g, n, k, op):
    if kind == "all_reduce":
        dist.all_reduce(np.ones(k, np.float32), op=op, group=g)
    elif kind == "reduce":
        dist.reduce(np.ones(k, np.float32), 0, op=op, group=g)
    else:
        dist.reduce_scatter_tensor(np.zeros(k, np.float32), np.ones(k * n, np.float32), op=op,
                                   group=g)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("kind", ["all_reduce", "reduce", "reduce_scatter_tensor"])
def test_an_op_that_differs_on_the_lane_raises(kind):
    """Both ops of the size went on the lane; rank 0 then passes SUM, the others MAX: the
    board's words differ, an error on every rank (not a number)."""
    n, me = world()
    g = board_group(f"op_{kind}")
    k = 4
    for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.SUM, dist.ReduceOp.MAX):
        _reduction(kind, g, n, k, op)
    with pytest.raises((CollectiveMismatchError, PeerFailedError)):
        _reduction(kind, g, n, k, dist.ReduceOp.SUM if me == 0 else dist.ReduceOp.MAX)
    dist.destroy_process_group(g)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("check", ["debug", "agreement"])
def test_the_checks_see_every_kind_the_lane_took_before(check):
    """16 bytes, on the lane in every kind; then a shape that differs on rank 0 (the board
    compares bytes): debug mode, or the agreement check of every size, raise on every rank."""
    n, me = world()
    g = board_group(f"checks_{check}")
    k = 4
    _calls(g, me, n, np.float32, k)
    shape = (k,) if me == 0 else (2, k // 2)
    calls = [lambda: dist.all_reduce(np.ones(shape, np.float32), group=g),
             lambda: dist.reduce(np.ones(shape, np.float32), 0, group=g),
             lambda: dist.broadcast(np.ones(shape, np.float32), 0, group=g)]
    for call in calls:
        if check == "debug":
            with debug_mode(True):
                with pytest.raises((CollectiveMismatchError, PeerFailedError), match="shape|broke"):
                    call()
        else:
            g.check_bytes = 0
            with pytest.raises((CollectiveMismatchError, PeerFailedError), match="shape|broke"):
                call()
        dist.destroy_process_group(g)
        g = board_group(f"checks_{check}_{len(calls)}")
        _calls(g, me, n, np.float32, k)
    dist.destroy_process_group(g)


@pytest.mark.mpi(min_size=2)
def test_a_group_whose_ranks_are_not_the_worlds_keeps_its_roots_off_the_lane():
    """The ranks reversed: a root is a global rank, which the lane does not translate, so
    broadcasts and reduces take the Python path (and the right root); the others the lane."""
    n, me = world()
    g = dist.new_group(list(reversed(range(n))), group_desc="lane_reversed")
    pg = _world._pg(g)
    if pg.tiny is None or shm_tiny._tiny is None:
        pytest.skip("no board")
    k = 4
    for _ in range(2):
        got = _calls(g, me, n, np.float32, k)
        for x, want in zip(got, _want(me, n, np.float32, k)):
            if want is not None:
                np.testing.assert_array_equal(x, want)
    dist.destroy_process_group(g)
