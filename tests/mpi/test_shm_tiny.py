"""Small collectives through the shared board (``backends/mpi/shm_tiny.py``), at 1-4 ranks.

Each result is compared with the same computation on the full data in NumPy, reduced in rank
order; reductions must be bitwise the same on every rank. Mismatched calls must end in an error
on every rank, never in a wrong number or a hang.
"""

from __future__ import annotations

import glob
import time

import numpy as np
import pytest
from mpi4py import MPI

import mpitensor as mt
import mpitensor.distributed as dist
from mpitensor.distributed import _world
from mpitensor.distributed.backends.mpi import shm_tiny
from mpitensor.errors import CollectiveMismatchError, PeerFailedError

R = dist.ReduceOp
INTS = (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64)
FLOATS = (np.float32, np.float64)


def world():
    return dist.get_world_size(), dist.get_rank()


def board_group(tag, monkeypatch=None, setting=None):
    """A new group of every rank; skips where it has no board (one rank, no compiled module)."""
    n, _ = world()
    if monkeypatch is not None and setting is not None:
        monkeypatch.setenv("MPITENSOR_SHM_COLLECTIVES", setting)
    g = dist.new_group(list(range(n)), group_desc=f"tiny_{tag}")
    pg = _world._pg(g)
    if n > 1 and shm_tiny._tiny is None:
        pytest.skip("the board's compiled module was not built (no C compiler at install)")
    if pg.tiny is None:
        pytest.skip("one rank: no board")
    if pg.shm_min <= max(pg.tiny.most.values()):
        pytest.skip("MPITENSOR_SHM_COLLECTIVES=on: the engine takes calls of every size")
    return g


def values(dtype, count, rank):
    """Rank ``rank``'s data: different on every rank, exact in every dtype."""
    rng = np.random.default_rng(1000 + rank)
    if np.issubdtype(dtype, np.floating):
        return rng.standard_normal(count).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(max(info.min, -100), min(info.max, 100), count, endpoint=True).astype(dtype)


def in_rank_order(op, arrays):
    fn = {R.SUM: np.add, R.PRODUCT: np.multiply, R.MIN: np.minimum, R.MAX: np.maximum,
          R.BAND: np.bitwise_and, R.BOR: np.bitwise_or, R.BXOR: np.bitwise_xor}[op]
    acc = arrays[0].copy()
    with np.errstate(over="ignore"):
        for a in arrays[1:]:
            acc = fn(acc, a).astype(acc.dtype)
    return acc


def sum_as_mpi_may(x, ins, exact):
    """``x`` is the sum of ``ins``: in rank order, bit for bit, where ``exact`` (the board's);
    else within what summing them in any order may change (MPI's order is its own)."""
    err = np.abs(x - in_rank_order(R.SUM, ins))
    bound = 0 if exact else len(ins) * np.finfo(x.dtype).eps * np.sum(np.abs(ins), axis=0)
    assert (err <= bound).all(), float(np.max(err - bound))


def same_bits_everywhere(arr):
    """Every rank holds these bytes."""
    b = np.frombuffer(arr.tobytes(), np.uint8)
    everyone = np.empty((dist.get_world_size(), b.size), np.uint8)
    MPI.COMM_WORLD.Allgather(b, everyone)
    assert (everyone == everyone[0]).all()


def test_groups_of_one_machine_get_a_board():
    from mpitensor._base import config

    n, _ = world()
    pg = _world._pg(None)
    if n == 1 or config.shm_collectives() == "off":
        assert pg.tiny is None
    elif shm_tiny._tiny is not None:
        assert pg.tiny is not None and isinstance(pg.pers or pg._new_pers(), shm_tiny.Cache)
        from mpitensor.distributed.health import watchdog

        # where ranks outnumber cores a take yields in C, else it spins first
        spin = watchdog.may_spin()
        assert (pg.tiny.c.spins, pg.tiny.c.yields) == (
            (shm_tiny.SPINS_FIRST, 0) if spin else (0, shm_tiny.YIELDS))


def test_the_switch_off_makes_no_board(monkeypatch):
    n, _ = world()
    g = dist.new_group(list(range(n)), group_desc="tiny_off") if n > 1 else None
    monkeypatch.setenv("MPITENSOR_SHM_COLLECTIVES", "off")
    h = dist.new_group(list(range(n)), group_desc="tiny_off2")
    assert _world._pg(h).tiny is None
    x = np.ones(4, np.float32)
    dist.all_reduce(x, group=h)
    assert (x == n).all()
    if g is not None:
        dist.destroy_process_group(g)
    dist.destroy_process_group(h)


def test_the_segment_leaves_no_file():
    before = set(glob.glob("/dev/shm/mpitensor-tiny-*"))
    g = board_group("files")
    dist.barrier()
    assert set(glob.glob("/dev/shm/mpitensor-tiny-*")) <= before
    dist.destroy_process_group(g)


@pytest.mark.parametrize("dtype", INTS + FLOATS)
@pytest.mark.parametrize("op", [R.SUM, R.PRODUCT, R.MIN, R.MAX, R.BAND, R.BOR, R.BXOR])
def test_all_reduce_every_dtype_and_op(dtype, op):
    n, me = world()
    if op in (R.BAND, R.BOR, R.BXOR) and dtype in FLOATS:
        pytest.skip("bitwise reductions take integers")
    g = dist.group.WORLD
    for count in (1, 7, 4096 // np.dtype(dtype).itemsize,
                  shm_tiny.cap(n) // np.dtype(dtype).itemsize):
        x = values(dtype, count, me)
        dist.all_reduce(x, op=op, group=g)
        expect = in_rank_order(op, [values(dtype, count, r) for r in range(n)])
        np.testing.assert_array_equal(x, expect)
        same_bits_everywhere(x)


@pytest.mark.parametrize("dtype", FLOATS)
def test_all_reduce_avg_and_nan(dtype):
    n, me = world()
    x = values(dtype, 9, me)
    dist.all_reduce(x, op=R.AVG)
    expect = in_rank_order(R.SUM, [values(dtype, 9, r) for r in range(n)]) / dtype(n)
    np.testing.assert_array_equal(x, expect.astype(dtype))
    same_bits_everywhere(x)
    if _world._pg(None).tiny is None:
        return  # MPI's MIN and MAX of a NaN depend on the order of its steps (MPICH: not
        # even the same on every rank), so the rest holds on the board only
    for op in (R.MIN, R.MAX):  # NaN wins, as NumPy's minimum and maximum
        y = np.array([1.0, np.nan if me == n - 1 else 2.0, -1.0], dtype)
        dist.all_reduce(y, op=op)
        assert np.isnan(y[1]) and not np.isnan(y[0]) and not np.isnan(y[2])
        same_bits_everywhere(y)


@pytest.mark.parametrize("dtype", INTS + FLOATS)
@pytest.mark.parametrize("op", [R.SUM, R.PRODUCT, R.MIN, R.MAX, R.BAND, R.BOR, R.BXOR])
def test_reduce_to_each_root_every_dtype_and_op(dtype, op):
    """The root gets the reduction in rank order (the board's, bitwise as all_reduce gives
    it); every other rank's buffer is left as it was."""
    n, me = world()
    if op in (R.BAND, R.BOR, R.BXOR) and dtype in FLOATS:
        pytest.skip("bitwise reductions take integers")
    size = dtype(0).itemsize
    for count in (1, 7, 4096 // size, shm_tiny.cap(n) // size):
        expect = in_rank_order(op, [values(dtype, count, r) for r in range(n)])
        for root in range(n):
            x = values(dtype, count, me)
            dist.reduce(x, dst=root, op=op)
            np.testing.assert_array_equal(x, expect if me == root else values(dtype, count, me))
        y = values(dtype, count, me)
        dist.all_reduce(y, op=op)
        np.testing.assert_array_equal(y, expect)


def test_reduce_through_both_paths_async_and_tensors():
    """The fast path (contiguous arrays) and the general one (a strided view, a Tensor of
    float16) on different ranks take the same call; async reduces past the board's entries,
    waited for in reverse order; AVG divides on the root."""
    n, me = world()
    for root in range(n):
        base = values(np.float64, 2 * 33, me)
        x = base[::2] if me % 2 else base[::2].copy()  # odd ranks: not contiguous
        dist.reduce(x, dst=root)
        if me == root:
            np.testing.assert_array_equal(
                x, in_rank_order(R.SUM, [values(np.float64, 66, r)[::2] for r in range(n)]))
        t = mt.full((3,), float(me + 1), dtype=mt.float16)
        dist.reduce(t, dst=root, op=R.AVG)
        want = (n + 1) / 2 if me == root else me + 1
        assert t.tolist() == [want] * 3
    works, checks = [], []
    for i in range(2 * shm_tiny.SLOTS + 3):  # (two sizes, each to every root)
        root, count = i % n, 6 if i // n % 2 else 1024
        x = np.full(count, me + i, np.int64)
        works.append(dist.reduce(x, dst=root, async_op=True))
        checks.append((x, np.full(count, sum(r + i for r in range(n)) if me == root
                                  else me + i)))
    for w in reversed(works):
        w.wait()
    for got, want in checks:
        np.testing.assert_array_equal(got, want)
    pg = _world._pg(None)
    if pg.tiny is not None and pg.shm_min > pg.pers_max:  # (not "on": the engine's)
        assert {key[2] for key in pg.pers.rd} == set(range(n)), "the reduces took MPI's path"


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("how", ["root", "operation", "size"])
def test_a_reduce_that_does_not_match_raises_on_every_rank(how):
    """Every rank naming itself the root, or the last rank calling all_reduce where the others
    reduce, or passing more than the board takes: CollectiveMismatchError (or the broken
    group, on a rank that reads the notice first) on every rank, never a silent return."""
    n, me = world()
    g = board_group(f"reduce_{how}")
    most = _world._pg(g).tiny.most[shm_tiny.ROOTED]
    x = np.ones(most // 2 if how == "size" and me == n - 1 else 2048, np.float32)
    with pytest.raises((CollectiveMismatchError, PeerFailedError)) as err:
        if how == "operation" and me == n - 1:
            dist.all_reduce(x, group=g)
        else:
            dist.reduce(x, dst=me if how == "root" else 0, group=g)
    if how == "root":
        assert "root" in str(err.value) or "unusable" in str(err.value)
    dist.destroy_process_group(g)


@pytest.mark.parametrize("dtype", (np.float32, np.int64, np.uint8))
def test_gather_scatter_and_broadcast(dtype):
    n, me = world()
    count = max(1, 4096 // np.dtype(dtype).itemsize // n // 2)
    out = np.zeros(count * n, dtype)
    dist.all_gather_into_tensor(out, values(dtype, count, me))
    np.testing.assert_array_equal(out, np.concatenate([values(dtype, count, r)
                                                       for r in range(n)]))
    outs = [np.zeros(count, dtype) for _ in range(n)]
    dist.all_gather(outs, values(dtype, count, me))
    for r in range(n):
        np.testing.assert_array_equal(outs[r], values(dtype, count, r))
    part = np.zeros(count, dtype)
    dist.reduce_scatter_tensor(part, values(dtype, count * n, me))
    whole = in_rank_order(R.SUM, [values(dtype, count * n, r) for r in range(n)])
    np.testing.assert_array_equal(part, whole[me * count:(me + 1) * count])
    for root in range(n):
        b = values(dtype, count, me)
        dist.broadcast(b, src=root)
        np.testing.assert_array_equal(b, values(dtype, count, root))


def test_tensors_and_out_of_place_calls():
    n, me = world()
    t = mt.full((2, 3), float(me + 1))
    dist.all_reduce(t)
    assert t.tolist() == [[n * (n + 1) / 2] * 3] * 2
    out = mt.zeros(n * 2)
    dist.all_gather_into_tensor(out, mt.tensor([me, -me], dtype=mt.float32))
    assert out.tolist() == [v for r in range(n) for v in (r, -r)]
    # the input a view of the output (in place, as FSDP gathers): posted before it is written
    buf = np.zeros(n * 3, np.float32)
    buf[me * 3:(me + 1) * 3] = me + 0.5
    dist.all_gather_into_tensor(buf, buf[me * 3:(me + 1) * 3])
    np.testing.assert_array_equal(buf, np.repeat(np.arange(n) + 0.5, 3).astype(np.float32))


def test_more_async_calls_than_entries_waited_in_any_order():
    """Many async calls of several kinds posted before any wait (past the board's entries:
    a post then waits for room, reading this rank's own earlier calls meanwhile), blocking and
    large calls between them, waited for last to first."""
    n, me = world()
    works, checks = [], []
    for i in range(3 * shm_tiny.SLOTS + 1):
        x = np.full(5, float(me + i), np.float64)
        works.append(dist.all_reduce(x, async_op=True))
        checks.append((x, np.full(5, float(sum(r + i for r in range(n))))))
        out = np.zeros(2 * n, np.int32)
        works.append(dist.all_gather_into_tensor(out, np.array([me, i], np.int32),
                                                 async_op=True))
        checks.append((out, np.array([v for r in range(n) for v in (r, i)], np.int32)))
        if i % 5 == 0:
            y = np.ones(3, np.float32)
            dist.all_reduce(y)  # blocking, between them: reads the earlier ones first
            checks.append((y, np.full(3, float(n), np.float32)))
        if i % 7 == 0:
            big = np.full(1 << 16, float(me), np.float32)  # past the board: MPI or the engine
            works.append(dist.all_reduce(big, async_op=True))
            checks.append((big, np.full(1 << 16, float(sum(range(n))), np.float32)))
    for w in reversed(works):
        w.wait()
    for got, want in checks:
        np.testing.assert_array_equal(got, want)


@pytest.mark.mpi(min_size=2)
def test_a_dtype_mismatch_raises_on_every_rank():
    """float32 on rank 0, int32 elsewhere, the same byte count: the entries differ."""
    n, me = world()
    g = board_group("dtype")
    x = np.ones(4, np.float32 if me == 0 else np.int32)
    with pytest.raises(CollectiveMismatchError, match="dtype"):
        dist.all_reduce(x, group=g)
    with pytest.raises(PeerFailedError, match="unusable"):
        dist.all_reduce(np.ones(1), group=g)
    dist.destroy_process_group(g)


@pytest.mark.mpi(min_size=3)
def test_a_dtype_mismatch_is_named_while_a_member_is_late():
    """As above, rank 1 posting 0.3 s late: rank 0, whose reading of the entries in rank order
    stops at rank 1's, still names the mismatch it can see in rank 2's entry, not the
    PeerFailedError of rank 2's notice (rank 2 saw it first). Seen in a CI run at 4 ranks on
    2 cores; rank 1 gets the mismatch too, or the broken group where it reads the notice first."""
    n, me = world()
    g = board_group("dtype_late")
    x = np.ones(4, np.float32 if me == 0 else np.int32)
    if me == 1:
        time.sleep(0.3)
        with pytest.raises((CollectiveMismatchError, PeerFailedError)):
            dist.all_reduce(x, group=g)
    else:
        with pytest.raises(CollectiveMismatchError, match="dtype"):
            dist.all_reduce(x, group=g)
    with pytest.raises(PeerFailedError, match="unusable"):
        dist.all_reduce(np.ones(1), group=g)
    dist.destroy_process_group(g)


@pytest.mark.mpi(min_size=2)
def test_sizes_on_both_sides_of_the_board_raise_instead_of_hanging():
    """The last rank passes more than the board takes (its call goes to MPI): within the
    watchdog's slow tick, every rank raises, none waits out the timeout."""
    n, me = world()
    g = board_group("sides")
    # twice the board's largest all_reduce: MPI's; 64 B: the board's
    most = _world._pg(g).tiny.most[shm_tiny.REDUCE]
    x = np.ones(most // 2 if me == n - 1 else 16, np.float32)
    with pytest.raises((CollectiveMismatchError, PeerFailedError), match="small one"):
        dist.all_reduce(x, group=g)
    dist.destroy_process_group(g)


@pytest.mark.mpi(min_size=2)
def test_a_root_mismatch_raises():
    n, me = world()
    g = board_group("root")
    x = np.ones(4, np.float32)
    dist.all_reduce(x, group=g)  # (the group's first small call makes its cache)
    if not _world._pg(g).tiny.bcast:
        pytest.skip("ranks outnumber cores: broadcasts stay on MPI, which leaves a root "
                    "mismatch undefined")
    with pytest.raises(CollectiveMismatchError, match="root"):
        dist.broadcast(x, src=me, group=g)
    dist.destroy_process_group(g)


@pytest.mark.mpi(min_size=2)
def test_a_rank_late_by_a_second_is_waited_for():
    """A member that comes late is waited for within the group's timeout (its bounded wait
    yields the core), and the result is right."""
    import time

    n, me = world()
    if me == 0:
        time.sleep(1.0)
    x = np.full(3, me + 1, np.int64)
    dist.all_reduce(x)
    assert (x == n * (n + 1) // 2).all()


def test_bool_half_and_complex_values():
    """bool (logical reductions), float16 and bfloat16 (staged in float32) and complex (which
    the board leaves to MPI) are right whichever path takes them."""
    import ml_dtypes

    n, me = world()
    ops = {R.SUM: np.logical_or, R.MAX: np.logical_or, R.BOR: np.logical_or,
           R.PRODUCT: np.logical_and, R.MIN: np.logical_and, R.BAND: np.logical_and}
    for op, fn in ops.items():
        x = np.array([True, me == 0, False, me % 2 == 1])
        dist.all_reduce(x, op=op)
        want = np.array([True, True, False, n > 1]) if fn is np.logical_or else \
            np.array([True, n == 1, False, False])
        np.testing.assert_array_equal(x, want)
        assert set(x.view(np.uint8).tolist()) <= {0, 1}
    for dt in (np.float16, ml_dtypes.bfloat16):
        x = np.array([1.5, me], dt)
        dist.all_reduce(x)
        np.testing.assert_array_equal(x.astype(np.float32), [1.5 * n, sum(range(n))])
    z = np.array([1 + 2j, me], np.complex64)
    dist.all_reduce(z)
    np.testing.assert_array_equal(z, [n * (1 + 2j), sum(range(n))])


@pytest.mark.mpi(min_size=2)
def test_async_calls_behind_a_mismatch_raise_in_wait():
    """Two async calls posted, the first mismatched (float32 on rank 0, int32 elsewhere):
    waiting for the second reads the first, which raises; the first's own wait then raises
    too, and the group refuses further calls. No wrong number comes out of either."""
    n, me = world()
    g = board_group("asyncmis")
    a = dist.all_reduce(np.ones(2, np.float32 if me == 0 else np.int32), group=g, async_op=True)
    y = np.ones(3, np.float32)
    b = dist.all_reduce(y, group=g, async_op=True)
    with pytest.raises(CollectiveMismatchError, match="dtype"):
        b.wait()
    with pytest.raises((CollectiveMismatchError, PeerFailedError)):
        a.wait()
    with pytest.raises(PeerFailedError, match="unusable"):
        dist.all_reduce(np.ones(1), group=g)
    dist.destroy_process_group(g)


def test_async_calls_past_the_entries_without_a_blocking_call():
    """DDP's pattern: more async small all_reduces in a row than the board has entries (each
    of its own size, as buckets are: one persistent request each), then every wait. A member
    must not overwrite its own entry before reading the call it holds."""
    n, me = world()
    xs = [np.full(1 + i, float(me + i)) for i in range(3 * shm_tiny.SLOTS + 3)]
    if me == 0:  # posts them all, then waits: its peers read each call as soon as it is there
        works = [dist.all_reduce(x, async_op=True) for x in xs]
        for w in works:
            w.wait()
    else:
        for x in xs:
            dist.all_reduce(x, async_op=True).wait()
    for i, x in enumerate(xs):
        np.testing.assert_array_equal(x, np.full(1 + i, float(sum(r + i for r in range(n)))))


def test_blocking_calls_make_no_buffers_of_their_own():
    """A board call's own buffers (what an async call copies through) are made at its first
    such use: blocking calls of every kind, up to the cap, run from and into the caller's
    arrays. (Made with every call, they grew a 4-rank job of random calls by 11-14 MiB.)"""
    n, me = world()
    g = board_group("lazy")
    pg = _world._pg(g)
    tri = n * (n + 1) / 2
    for nb in (64, 4096, pg.tiny.cap // 2, pg.tiny.cap):
        k = nb // 4 // n * n
        # (a pair's board keeps smaller all-reduces than its other calls: PAIR_REDUCE_CAP)
        x = np.full(min(nb, pg.tiny.most[shm_tiny.REDUCE]) // 4, 1.0 + me, np.float32)
        dist.all_reduce(x, group=g)
        assert (x == tri).all()
        out = np.zeros(k, np.float32)
        dist.all_gather_into_tensor(out, np.full(k // n, float(me), np.float32), group=g)
        assert (out == np.repeat(np.arange(n, dtype=np.float32), k // n)).all()
        part = np.zeros(k // n, np.float32)
        dist.reduce_scatter_tensor(part, np.full(k, 1.0 + me, np.float32), group=g)
        assert (part == tri).all()
        y = np.full(k, float(me), np.float32)
        dist.broadcast(y, src=n - 1, group=g)
        assert (y == n - 1).all()
    kinds = (pg.pers.ar, pg.pers.ag, pg.pers.rs, pg.pers.bc)
    made = [c for kind in kinds for c in kind.values() if isinstance(c, shm_tiny._Made)]
    assert len(made) >= 12 and all(c.bufs is None for c in made), [c.bufs for c in made]
    w = dist.all_reduce(x, group=g, async_op=True)  # async: through the call's own buffers
    w.wait()
    assert (x == n * tri).all()
    assert sum(c.bufs is not None for c in pg.pers.ar.values()) == 1
    dist.destroy_process_group(g)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("kind", ["all_reduce", "broadcast", "all_gather_into_tensor",
                                  "all_gather", "reduce_scatter_tensor", "reduce"])
def test_the_agreement_check_sees_calls_on_the_board(kind):
    """check_bytes 0 (``MPITENSOR_CHECK_BYTES=0``: every call checked), one rank passes
    another shape of the same bytes and dtype: the board compares bytes, the agreement check
    shapes, and a blocking call on the board must settle it (CollectiveMismatchError on every
    rank, not a silent success)."""
    n, me = world()
    g = board_group(f"agree_{kind}")
    g.check_bytes = 0
    shape = (4,) if me == 0 else (2, 2)
    x = np.ones(shape, np.float32)
    calls = {
        "all_reduce": lambda: dist.all_reduce(x, group=g),
        "reduce": lambda: dist.reduce(x, dst=0, group=g),
        "broadcast": lambda: dist.broadcast(x, src=0, group=g),
        "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(
            np.zeros(4 * n, np.float32), x, group=g),
        "all_gather": lambda: dist.all_gather([np.zeros(shape, np.float32) for _ in range(n)],
                                              x, group=g),
        "reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(
            np.zeros(shape, np.float32), np.ones((n * 4,) if me == 0 else (n * 2, 2),
                                                  np.float32), group=g),
    }
    with pytest.raises(CollectiveMismatchError, match="shape"):
        calls[kind]()
    dist.destroy_process_group(g)


@pytest.mark.mpi(min_size=2)
def test_broadcasts_past_the_crowded_floor_come_to_the_board_at_any_load():
    """Broadcasts of 16 KiB come to the board even where ranks outnumber cores (small ones
    stay on MPI there): their values, and a root mismatch raised on every rank (MPI's tree
    would leave it undefined)."""
    n, me = world()
    g = board_group("bcast_big")
    board = _world._pg(g).tiny
    nb = 2 * shm_tiny.BCAST_CROWDED
    if nb > board.cap:
        pytest.skip("a group too large for broadcasts of this size on its board")
    for root in range(n):
        x = values(np.float32, nb // 4, me)
        dist.broadcast(x, src=root, group=g)
        np.testing.assert_array_equal(x, values(np.float32, nb // 4, root))
    assert board.bcast_min <= nb
    with pytest.raises(CollectiveMismatchError, match="root"):
        dist.broadcast(np.ones(nb // 4, np.float32), src=me, group=g)
    dist.destroy_process_group(g)


@pytest.mark.mpi(min_size=2)
def test_each_kind_at_its_largest_board_call_and_one_element_past():
    """Each kind of call at the largest size its board takes (``shm_tiny.limits``: an
    all_gather's output may be NARROW entries where ranks outnumber cores) and one element
    past it, where the call takes another path: the same values either way, bitwise the same
    on every rank; the paths past the board (scatter_p2p, gather_p2p) take over from there;
    and the engine is never asked for a call the board takes (a member still timing the
    engine within a call took a faster member's board post of it for a mismatch)."""
    from mpitensor.distributed.backends.mpi import gather_p2p, scatter_p2p

    n, me = world()
    g = board_group("largest")
    pg = _world._pg(g)
    most = pg.tiny.most
    assert pg.pers_max == max(most.values())
    # (the gathers its timing left to messages start where the board's stop: msg_choice.py)
    lo, hi = pg.gather_msgs
    assert most[shm_tiny.GATHER] == (pg.pers_max if hi == 0 else lo)
    assert pg.shm_min > pg.pers_max
    assert scatter_p2p.takes(pg, most[shm_tiny.REDUCE_PART] + 4 * n, np.dtype(np.float32),
                             MPI.SUM) == (most[shm_tiny.REDUCE_PART] + 4 * n >= scatter_p2p.LEAST)
    assert not scatter_p2p.takes(pg, most[shm_tiny.REDUCE_PART], np.dtype(np.float32), MPI.SUM)
    assert not gather_p2p.takes(pg, most[shm_tiny.GATHER])
    for extra in (0, 1):  # (past the board, MPI's all_reduce sums in an order of its own)
        k = most[shm_tiny.REDUCE] // 4 + extra
        x = values(np.float32, k, me)
        dist.all_reduce(x, group=g)
        sum_as_mpi_may(x, [values(np.float32, k, r) for r in range(n)], exact=extra == 0)
        if extra == 0:
            same_bits_everywhere(x)
        k = most[shm_tiny.ROOTED] // 4 + extra
        x = values(np.float32, k, me)
        dist.reduce(x, dst=n - 1, group=g)
        if me == n - 1:
            sum_as_mpi_may(x, [values(np.float32, k, r) for r in range(n)], exact=extra == 0)
        else:
            np.testing.assert_array_equal(x, values(np.float32, k, me))
        k = most[shm_tiny.BCAST] // 4 + extra
        y = values(np.float32, k, me)
        dist.broadcast(y, src=n - 1, group=g)
        np.testing.assert_array_equal(y, values(np.float32, k, n - 1))
        part = most[shm_tiny.GATHER] // 4 // n + extra
        out = np.zeros(part * n, np.float32)
        dist.all_gather_into_tensor(out, values(np.float32, part, me), group=g)
        np.testing.assert_array_equal(out, np.concatenate([values(np.float32, part, r)
                                                           for r in range(n)]))
        part = most[shm_tiny.REDUCE_PART] // 4 // n + extra
        mine = np.zeros(part, np.float32)
        dist.reduce_scatter_tensor(mine, values(np.float32, part * n, me), group=g)
        whole = in_rank_order(R.SUM, [values(np.float32, part * n, r) for r in range(n)])
        np.testing.assert_array_equal(mine, whole[me * part:(me + 1) * part])
    assert pg.shm in (None, False) or pg.shm_min > pg.pers_max
    dist.destroy_process_group(g)


@pytest.mark.mpi(min_size=2)
def test_a_short_dev_shm_gets_a_smaller_board(monkeypatch):
    """Where /dev/shm cannot hold the board's segment (a container's 64 MiB, with 1 MiB
    entries on a crowded node), the group gets a board of CAP-byte entries, not none; its
    calls past that go to MPI and give the same values."""
    from mpitensor.distributed.backends.mpi import shm

    n, me = world()
    real = shm.create
    small = shm_tiny.segment_bytes(n, shm_tiny.CAP)
    monkeypatch.setattr(shm, "create", lambda prefix, nbytes: (
        None if prefix == "mpitensor-tiny-" and nbytes > small else real(prefix, nbytes)))
    g = board_group("short")
    pg = _world._pg(g)
    assert pg.tiny.cap == min(shm_tiny.CAP, shm_tiny.cap(n, not shm_tiny.W.may_spin()))
    for k in (16, shm_tiny.CAP // 8, shm_tiny.CAP // 2):  # (the last past the board: MPI's)
        x = values(np.float64, k, me)
        dist.all_reduce(x, group=g)
        sum_as_mpi_may(x, [values(np.float64, k, r) for r in range(n)], exact=k * 8 <= pg.tiny.cap)
    dist.destroy_process_group(g)
