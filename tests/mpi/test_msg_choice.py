"""Mid-size gathers and reduce-scatters that a group's board leaves to messages
(``backends/mpi/msg_choice.py``): the choice timed as the group is made, or forced.

With the choice forced to messages, all_gather_into_tensor and reduce_scatter_tensor take the
board to half the smallest probe, then the messages of gather_p2p and scatter_p2p; every
layout and dtype gives the concatenation (or the rank-order sum) of every rank's data, members
on the fast path and on the general one meet, and a member that passes another size raises on
every rank. Forced to the board, nothing changes. Timed, every member has the same answer and
a second group of the same ranks asks it instead of timing again.
"""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import mpitensor as mt
import mpitensor.distributed as dist
from mpitensor._base.config import OFF_BYTES
from mpitensor.distributed import _world
from mpitensor.distributed.backends.mpi import gather_p2p, msg_choice, scatter_p2p, shm_tiny
from mpitensor.distributed.health import watchdog as W
from mpitensor.errors import CollectiveMismatchError, PeerFailedError

from .broken import assert_unusable_world_untouched


def world():
    return dist.get_world_size(), dist.get_rank()


def smallest():
    """The smallest probe, as a group of this many ranks times it (whole elements a member)."""
    n, _ = world()
    return msg_choice.probe_sizes(n, 1 << 40)[0]


def data(rank, k, dtype=np.float32, salt=0):
    return ((np.arange(k) * 7 + 1000 * rank + salt) % 4093).astype(dtype)


def made(force, tag):
    """A new group of every rank with the choice ``force``d; skips where it has no board or
    does not time the choice (one rank, ranks that outnumber the cores, a large group)."""
    n, _ = world()
    msg_choice.force = force
    try:
        g = dist.new_group(list(range(n)), group_desc=f"msgs_{tag}")
    finally:
        msg_choice.force = None
    pg = _world._pg(g)
    crowded = bool(MPI.COMM_WORLD.allreduce(int(not W.may_spin()), op=MPI.MAX))
    if pg.tiny is None or not msg_choice.applies(pg, pg.tiny.cap, crowded):
        pytest.skip("no board here, or one whose ranks outnumber the cores: it keeps every size")
    pg.shm_min = pg.shm_ar_min = OFF_BYTES  # (the engine, which large calls ask first, left out)
    return g, pg


@pytest.fixture
def spied(monkeypatch):
    calls = []
    real_flat, real_sc = gather_p2p.start_flat, scatter_p2p.start

    def flat(g, s, o, t):
        calls.append(("ag", o.nbytes))
        return real_flat(g, s, o, t)

    def scatter(g, s, o, t, m):
        calls.append(("rs", s.nbytes))
        return real_sc(g, s, o, t, m)
    monkeypatch.setattr(gather_p2p, "start_flat", flat)
    monkeypatch.setattr(scatter_p2p, "start", scatter)
    return calls


@pytest.mark.mpi(min_size=2)
def test_forced_messages_take_the_sizes_past_half_the_smallest_probe(spied):
    n, me = world()
    g, pg = made("messages", "on")
    most = pg.tiny.most
    SMALL = smallest()
    half = SMALL // 2
    assert most[shm_tiny.GATHER] == most[shm_tiny.REDUCE_PART] == half
    assert pg.gather_msgs == (half, max(pg.pers_max, msg_choice.BEYOND))
    assert pg.board_most("all_gather") == pg.board_most("reduce_scatter") == half
    for nbytes in (half, SMALL, msg_choice.BEYOND, msg_choice.BEYOND + 4 * n):
        k = nbytes // 4 // n
        out = np.zeros(k * n, np.float32)
        dist.all_gather_into_tensor(out, data(me, k), group=g)
        np.testing.assert_array_equal(out, np.concatenate([data(r, k) for r in range(n)]))
        mine = np.zeros(k, np.float32)
        dist.reduce_scatter_tensor(mine, data(me, k * n), group=g)
        want = sum(data(r, k * n).astype(np.float64) for r in range(n)).reshape(n, k)[me]
        np.testing.assert_array_equal(mine, want.astype(np.float32))
    sizes = [(kind, nb) for kind, nb in spied]
    # the board's half; messages from there; past BEYOND, MPI's gather (scatter: messages)
    assert sizes == [("ag", SMALL), ("rs", SMALL), ("ag", msg_choice.BEYOND),
                     ("rs", msg_choice.BEYOND), ("rs", msg_choice.BEYOND + 4 * n)]
    dist.destroy_process_group(g)


@pytest.mark.mpi(min_size=2)
def test_forced_board_changes_nothing(spied):
    n, me = world()
    g, pg = made("board", "off")
    most = pg.tiny.most
    assert most == shm_tiny.limits(n, pg.tiny.cap, False)
    assert pg.gather_msgs == (0, 0)
    k = smallest() // 4 // n
    out = np.zeros(k * n, np.float32)
    dist.all_gather_into_tensor(out, data(me, k), group=g)
    np.testing.assert_array_equal(out, np.concatenate([data(r, k) for r in range(n)]))
    assert not spied
    dist.destroy_process_group(g)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64, np.uint8, np.float16])
def test_every_layout_and_dtype_on_the_messages(dtype):
    """Contiguous arrays, Tensors, a strided input on one rank only (the general path, which
    must send the same messages), the in-place idiom (the input is this rank's chunk of the
    output) and async calls waited later."""
    n, me = world()
    g, pg = made("messages", f"layouts_{np.dtype(dtype).name}")
    k = smallest() * 2 // np.dtype(dtype).itemsize // n
    want = np.concatenate([data(r, k, dtype) for r in range(n)])

    out = np.zeros(k * n, dtype)
    dist.all_gather_into_tensor(out, data(me, k, dtype), group=g)
    np.testing.assert_array_equal(out, want)

    t = mt.tensor(np.zeros(k * n, dtype))
    dist.all_gather_into_tensor(t, mt.tensor(data(me, k, dtype)), group=g)
    np.testing.assert_array_equal(t.numpy(), want)

    wide = np.zeros((k, 2), dtype)
    wide[:, 0] = data(me, k, dtype)
    inp = wide[:, 0] if me == 0 else data(me, k, dtype)  # (rank 0: strided, staged)
    out = np.zeros(k * n, dtype)
    dist.all_gather_into_tensor(out, inp, group=g)
    np.testing.assert_array_equal(out, want)

    out = np.zeros(k * n, dtype)
    out[me * k:(me + 1) * k] = data(me, k, dtype)
    dist.all_gather_into_tensor(out, out[me * k:(me + 1) * k], group=g)
    np.testing.assert_array_equal(out, want)

    outs = [np.zeros(k * n, dtype) for _ in range(3)]
    works = [dist.all_gather_into_tensor(o, data(me, k, dtype, salt=i), group=g, async_op=True)
             for i, o in enumerate(outs)]
    for i in (2, 0, 1):
        works[i].wait()
        np.testing.assert_array_equal(
            outs[i], np.concatenate([data(r, k, dtype, salt=i) for r in range(n)]))
    dist.destroy_process_group(g)


@pytest.mark.mpi(min_size=2)
def test_a_member_that_passes_another_size_raises_on_every_rank():
    """Rank 0 passes a size its board takes, the others one that takes messages."""
    n, me = world()
    g, pg = made("messages", "mismatch")
    k = (smallest() // 4 // n) if me else (smallest() // 8 // n)
    # (the rank whose call the board took learns it from the peer that found the mismatch)
    with pytest.raises((CollectiveMismatchError, PeerFailedError), match="byte count"):
        dist.all_gather_into_tensor(np.zeros(k * n, np.float32), data(me, k), group=g)
    assert_unusable_world_untouched(g)


@pytest.mark.mpi(min_size=2)
def test_the_timed_choice_is_alike_everywhere_and_asked_again(monkeypatch):
    n, me = world()
    g, pg = made(None, "timed")
    mine = (dict(pg.tiny.most), pg.gather_msgs)
    assert MPI.COMM_WORLD.allgather(mine) == [mine] * n
    lo, hi = pg.gather_msgs
    assert (lo, hi) == (0, 0) or (lo == pg.tiny.most[shm_tiny.GATHER] < hi)
    timed = []
    monkeypatch.setattr(msg_choice, "_time", lambda *a: timed.append(a) or None)
    g2, pg2 = made(None, "timed_again")
    assert not timed and (dict(pg2.tiny.most), pg2.gather_msgs) == mine
    dist.destroy_process_group(g2)
    dist.destroy_process_group(g)


def test_the_first_probe_from_which_messages_win_and_the_boards_limit():
    assert [msg_choice.first_win(w) for w in ([1, 1], [0, 1], [1, 0], [0, 0], [])] == [
        0, 1, 2, 2, 0]
    probes = [128 << 10, 512 << 10]
    assert msg_choice._limit(0, probes, 512 << 10) == 64 << 10
    assert msg_choice._limit(1, probes, 512 << 10) == 256 << 10
    assert msg_choice._limit(2, probes, 512 << 10) == 512 << 10
    assert msg_choice._limit(0, probes, 32 << 10) == 32 << 10  # (never above the board's own)
