"""The always-on agreement check of large collectives (``_fingerprint``, issue 11 §6).

Every collective whose buffer holds ``MPITENSOR_CHECK_BYTES`` bytes or more (64 KiB by default)
checks, beside its data, that every rank made the same call. Each mismatch below returns wrong
numbers without a word when nothing checks (the data moves: same byte count, or a different
reduction); here every rank must raise CollectiveMismatchError, and the group must refuse every
later call. Each case runs on a group of its own, since a mismatch leaves it unusable.

Every test runs with both mechanisms: the shared slots of a group on one machine (what these
ranks get) and the reduction that groups spanning machines use (forced here by making the
slots unavailable while the group is created).
"""

from __future__ import annotations

import glob
import time

import numpy as np
import pytest

import mpitensor as mt
import mpitensor.distributed as dist
from mpitensor._base.config import OFF_BYTES
from mpitensor.distributed import _world
from mpitensor.distributed.health import fingerprint as _fingerprint
from mpitensor.errors import CollectiveMismatchError, PeerFailedError

R = dist.ReduceOp
BIG = 1 << 14  # float32 elements: 64 KiB, checked by default
MECHANISM = "slots"


@pytest.fixture(autouse=True, params=["slots", "reduction"])
def mechanism(request, monkeypatch):
    """Which check the groups made by ``fresh`` use (every rank runs the same parameter)."""
    global MECHANISM
    MECHANISM = request.param
    if request.param == "reduction":
        monkeypatch.setattr(_fingerprint.NodeCheck, "create", classmethod(lambda cls, c: None))
    return request.param


def world():
    return dist.get_world_size(), dist.get_rank()


def fresh(tag):
    """A new group of every rank. Its shared board (``shm_tiny``), where it has one, takes
    calls of at most 4 KiB only: the calls of BIG elements these tests make take MPI's path and
    its agreement check, what this file is about (the board checks the calls it takes
    itself: tests/mpi/test_shm_tiny.py)."""
    n, _ = world()
    g = dist.new_group(list(range(n)), group_desc=f"agree_{tag}")
    if n > 1:
        assert (g.fp_node is not None) == (MECHANISM == "slots")
    board = _world._pg(g).tiny
    if board is not None:  # (the paths past the board keep their sizes: board_most)
        board.most = dict.fromkeys(board.most, 4096)
    return g


def expect_mismatch(g, call, match):
    """``call(g)`` raises CollectiveMismatchError naming ``match`` on every rank; the group then
    refuses any call at once."""
    with pytest.raises(CollectiveMismatchError, match=match) as info:
        call(g)
    assert "MPITENSOR_DEBUG=1" in str(info.value)
    with pytest.raises(PeerFailedError, match="unusable"):
        dist.all_reduce(np.ones(1), group=g)
    return info.value


def test_default_threshold_is_64_kib():
    assert dist.group.WORLD.check_bytes == 64 * 1024


@pytest.mark.mpi(min_size=2)
def test_dtype_mismatch_with_the_same_byte_count():
    """float32 on rank 0, int32 elsewhere: MPI moves the bytes and sums garbage."""
    _, me = world()
    g = fresh("dtype")
    x = np.ones(BIG, np.float32 if me == 0 else np.int32)
    err = expect_mismatch(g, lambda g: dist.all_reduce(x, group=g), "dtype")
    # (the agreement check's words, or the board's where it takes calls of this size)
    assert "this rank passed call #1, all_reduce, 65536 bytes, " in str(err)
    assert "op SUM" in str(err)
    dist.destroy_process_group(g)


@pytest.mark.mpi(min_size=2)
def test_reduction_mismatch():
    """MAX on rank 0, SUM elsewhere: every rank gets a number, none of them right."""
    _, me = world()
    g = fresh("reduce")
    x = mt.ones(BIG)
    expect_mismatch(g, lambda g: dist.all_reduce(x, op=R.MAX if me == 0 else R.SUM, group=g),
                    "reduction")
    dist.destroy_process_group(g)


@pytest.mark.mpi(min_size=2)
def test_root_mismatch():
    _, me = world()
    g = fresh("root")
    x = np.zeros(BIG, np.float32)
    expect_mismatch(g, lambda g: dist.broadcast(x, src=0 if me == 0 else 1, group=g), "root")
    dist.destroy_process_group(g)


@pytest.mark.mpi(min_size=2)
def test_shape_mismatch_with_the_same_byte_count():
    _, me = world()
    g = fresh("shape")
    x = np.ones((128, 128) if me == 0 else (BIG,), np.float32)
    expect_mismatch(g, lambda g: dist.all_reduce(x, group=g), "shape")
    dist.destroy_process_group(g)


@pytest.mark.mpi(min_size=2)
def test_size_mismatch():
    _, me = world()
    g = fresh("size")
    x = np.ones(BIG * (1 if me == 0 else 2), np.float32)
    err = expect_mismatch(g, lambda g: dist.all_reduce(x, group=g), "byte count")
    assert "byte count from 65536 to 131072" in str(err)
    dist.destroy_process_group(g)


@pytest.mark.mpi(min_size=2)
def test_operation_mismatch():
    """all_reduce on rank 0, broadcast elsewhere, on buffers of the same size."""
    _, me = world()
    g = fresh("op")
    x = np.ones(BIG, np.float32)

    def call(g):
        if me == 0:
            dist.all_reduce(x, group=g)
        else:
            dist.broadcast(x, src=0, group=g)

    expect_mismatch(g, call, "operation")
    dist.destroy_process_group(g)


@pytest.mark.mpi(min_size=2)
def test_extra_small_call_on_one_rank_shifts_the_call_numbers():
    """Rank 0 makes a small (unchecked) all_reduce first: its large call is #2, the others'
    #1, and rank 0's small call was matched against their large one. The call number in the
    fingerprint says so at the large call."""
    _, me = world()
    g = fresh("seq")
    x = np.ones(BIG, np.float32)

    def call(g):
        if me == 0:
            try:  # matched against the others' large all_reduce: a truncation error or garbage
                dist.all_reduce(np.ones(4, np.float32), group=g)
            except Exception:
                pass
        dist.all_reduce(x, group=g)

    if me != 0:  # (through shared memory the small call is checked too: its byte count)
        board = _world._pg(g).tiny  # (it takes both calls: it sees their byte counts)
        both = g.shm_min <= 4 * 4 or (board is not None and BIG * 4 <= min(board.most.values()))
        expect_mismatch(g, call, "call number|byte count" if both else "call number")
    else:  # rank 0 may have failed at its first call already; either way it cannot go on
        with pytest.raises((CollectiveMismatchError, PeerFailedError)):
            call(g)
        with pytest.raises(PeerFailedError):
            dist.all_reduce(np.ones(1), group=g)
    dist.destroy_process_group(g)


@pytest.mark.mpi(min_size=2)
def test_async_mismatch_raises_in_wait():
    _, me = world()
    g = fresh("async")
    x = np.ones(BIG, np.float32 if me == 0 else np.int32)
    work = dist.all_reduce(x, group=g, async_op=True)
    with pytest.raises(CollectiveMismatchError, match="dtype"):
        work.wait()
    dist.destroy_process_group(g)


@pytest.mark.mpi(min_size=2)
def test_small_calls_are_checked_at_threshold_zero():
    """MPITENSOR_CHECK_BYTES=0 checks every call (here set on the group, on every rank)."""
    _, me = world()
    g = fresh("zero")
    g.check_bytes = 0
    x = np.ones(3, np.float64 if me == 0 else np.int64)
    expect_mismatch(g, lambda g: dist.all_reduce(x, group=g), "dtype")
    dist.destroy_process_group(g)


def test_matching_calls_of_every_checked_op_give_the_right_numbers():
    """With every call checked, each operation (fast and general paths, blocking and async)
    still returns its exact result."""
    n, me = world()
    g = fresh("ok")
    g.check_bytes = 0
    k = 2 * n
    a = np.full(k, me + 1.0)
    dist.all_reduce(a, group=g)
    np.testing.assert_array_equal(a, np.full(k, n * (n + 1) / 2))
    b = mt.full((k,), float(me + 1))  # a Tensor; AVG takes the general path
    dist.all_reduce(b, op=R.AVG, group=g)
    np.testing.assert_allclose(b.numpy(), np.full(k, (n + 1) / 2))
    c = np.full(k, float(me))
    dist.broadcast(c, src=n - 1, group=g)
    np.testing.assert_array_equal(c, np.full(k, n - 1.0))
    d = np.full(k, me + 1.0)
    dist.reduce(d, dst=0, op=R.MAX, group=g)
    if me == 0:
        np.testing.assert_array_equal(d, np.full(k, float(n)))
    out = np.zeros(k * n)
    dist.all_gather_into_tensor(out, np.full(k, float(me)), group=g)
    np.testing.assert_array_equal(out, np.repeat(np.arange(n, dtype=float), k))
    lst = [np.zeros(k) for _ in range(n)]
    dist.all_gather(lst, np.full(k, float(me)), group=g)
    for r in range(n):
        np.testing.assert_array_equal(lst[r], np.full(k, float(r)))
    rs = np.zeros(k)
    dist.reduce_scatter_tensor(rs, np.ones(k * n), group=g)
    np.testing.assert_array_equal(rs, np.full(k, float(n)))
    rl = np.zeros(k)
    dist.reduce_scatter(rl, [np.full(k, float(r)) for r in range(n)], group=g)
    np.testing.assert_array_equal(rl, np.full(k, float(n * me)))
    got = np.zeros(k)
    dist.scatter(got, [np.full(k, float(r)) for r in range(n)] if me == 0 else None, src=0,
                 group=g)
    np.testing.assert_array_equal(got, np.full(k, float(me)))
    gl = [np.zeros(k) for _ in range(n)] if me == 0 else None
    dist.gather(np.full(k, float(me)), gl, dst=0, group=g)
    if me == 0:
        for r in range(n):
            np.testing.assert_array_equal(gl[r], np.full(k, float(r)))
    a2a = np.zeros(n * 2)
    dist.all_to_all_single(a2a, np.arange(n * 2, dtype=float) + 100 * me, group=g)
    np.testing.assert_array_equal(a2a, np.array([100 * r + 2 * me + j for r in range(n)
                                                 for j in range(2)], dtype=float))
    works = [dist.all_reduce(np.full(k, float(i)), group=g, async_op=True) for i in range(3)]
    for w in works:
        w.wait()
    dist.destroy_process_group(g)


def test_more_async_calls_in_flight_than_the_pool_holds():
    """A DDP-like burst of async large all_reduces (more than the persistent-request pool, or
    the ring of shared slots, holds): slots are reused in order and every result is right."""
    n, _ = world()
    g = fresh("burst")
    g.check_bytes = 0
    bufs = [np.full(64, float(i)) for i in range(3 * _fingerprint.RING)]
    works = [dist.all_reduce(b, group=g, async_op=True) for b in bufs]
    for i, (b, w) in enumerate(zip(bufs, works)):
        w.wait()
        np.testing.assert_array_equal(b, np.full(64, float(i * n)))
    dist.destroy_process_group(g)


def test_check_off():
    """``off`` (OFF_BYTES): nothing is checked, calls still work."""
    n, _ = world()
    g = fresh("off")
    g.check_bytes = OFF_BYTES
    x = np.ones(BIG, np.float32)
    dist.all_reduce(x, group=g)
    assert x[0] == n
    dist.destroy_process_group(g)


@pytest.mark.mpi(min_size=2)
def test_every_rank_claiming_the_root():
    """Each rank broadcasts from itself: MPI waits for ever (nobody receives), and no rank
    returns; the slots show the disagreement at once."""
    _, me = world()
    g = fresh("roots")
    g.timeout = 60.0
    x = np.full(BIG, float(me), np.float32)
    t0 = time.monotonic()
    expect_mismatch(g, lambda g: dist.broadcast(x, src=me, group=g), "root")
    assert time.monotonic() - t0 < 30  # not the group's timeout
    dist.destroy_process_group(g)


@pytest.mark.mpi(min_size=2)
def test_every_rank_claiming_the_root_async():
    """The same, async: the wait looks at the slots while it polls."""
    _, me = world()
    g = fresh("roots_async")
    g.timeout = 60.0
    x = np.full(BIG, float(me), np.float32)
    t0 = time.monotonic()
    expect_mismatch(g, lambda g: dist.broadcast(x, src=me, group=g, async_op=True).wait(),
                    "root")
    assert time.monotonic() - t0 < 30
    dist.destroy_process_group(g)


@pytest.mark.mpi(min_size=2)
def test_a_late_member_is_waited_for():
    """The root's broadcast is done before the others even call it: its check waits for
    their fingerprints instead of calling the match good (or bad) too early."""
    n, me = world()
    g = fresh("late")
    for i in range(3):
        x = np.full(BIG, 7.0 + i if me == 0 else -1.0, np.float32)
        if me != 0:
            time.sleep(0.2)
        dist.broadcast(x, src=0, group=g)
        assert (x == 7.0 + i).all()
    dist.destroy_process_group(g)


@pytest.mark.mpi(min_size=2)
def test_a_late_member_that_disagrees():
    """The root is done and waiting for the others' fingerprints; the last rank comes late,
    with another dtype of the same byte count: every rank raises."""
    n, me = world()
    g = fresh("late_bad")
    x = np.ones(BIG, np.int32 if me == n - 1 else np.float32)
    if me == n - 1:
        time.sleep(0.3)
    expect_mismatch(g, lambda g: dist.broadcast(x, src=0, group=g), "dtype")
    dist.destroy_process_group(g)


@pytest.mark.mpi(min_size=2)
def test_mpi_error_is_explained_by_the_mismatch():
    """Different byte counts in a broadcast: MPICH's own error on the receivers names an
    internal scheduler; the mismatch, with both byte counts, is raised instead."""
    _, me = world()
    g = fresh("mpi_error")
    x = np.ones(BIG * (1 if me == 0 else 2), np.float32)
    err = expect_mismatch(g, lambda g: dist.broadcast(x, src=0, group=g), "byte count")
    assert "from 65536 to 131072" in str(err)
    dist.destroy_process_group(g)


def test_slot_segment_leaves_no_file():
    """The slots' shared-memory file is unlinked as soon as every member has mapped it."""
    n, me = world()
    before = set(glob.glob("/dev/shm/mpitensor-check-*"))
    g = fresh("files")
    dist.barrier()
    if me == 0:
        assert set(glob.glob("/dev/shm/mpitensor-check-*")) <= before
    dist.destroy_process_group(g)
