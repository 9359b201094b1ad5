"""all_gather into a list, as messages straight into the entries (``backends/mpi/gather_p2p.py``).

Every layout a torch program gives ``dist.all_gather`` (separate arrays, one buffer's pieces,
the input among the entries, entries that are not contiguous, Tensors), async calls waited in
any order, and mismatches: each result is compared with the concatenation of every rank's
data, and a mismatch must raise on every rank.
"""

from __future__ import annotations

import numpy as np
import pytest

import mpitensor as mt
import mpitensor.distributed as dist
from mpitensor._base.config import OFF_BYTES
from mpitensor.distributed import _world
from mpitensor.distributed.backends.mpi import gather_p2p
from mpitensor.errors import CollectiveMismatchError

from .broken import assert_unusable_world_untouched

#: elements per member: 192 KiB of float32, past every board's cap in all
K = 3 << 14


def world():
    return dist.get_world_size(), dist.get_rank()


def data(rank, k=K, dtype=np.float32, salt=0):
    return ((np.arange(k) * 7 + 1000 * rank + salt) % 4093).astype(dtype)


G = None


@pytest.fixture(autouse=True)
def group():
    """A group of every rank whose list gathers of K elements take this path: the engine
    (shm_coll.py), which a gather of this size may ask first, is left out."""
    global G
    n, _ = world()
    if n < 2 or n > gather_p2p.MOST:
        pytest.skip("one rank, or more than gather_p2p.MOST: MPI's own gather")
    if G is None:
        G = dist.new_group(list(range(n)), group_desc="gp2p")
        _world._pg(G).shm_min = OFF_BYTES
    if not gather_p2p.takes(_world._pg(G), K * 4 * n):
        pytest.skip("the group spans machines, or MPITENSOR_SHM_COLLECTIVES=off kept it from "
                    "asking: MPI's own gather")
    return G


def test_the_gather_takes_this_path_and_smaller_ones_do_not(group, monkeypatch):
    n, me = world()
    starts = []
    real = gather_p2p.start
    monkeypatch.setattr(gather_p2p, "start", lambda *a: starts.append(a[1].size) or real(*a))
    for k in (K, 16):
        outs = [np.zeros(k, np.float32) for _ in range(n)]
        dist.all_gather(outs, data(me, k), group=group)
        for r in range(n):
            np.testing.assert_array_equal(outs[r], data(r, k))
    assert starts == [K]


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64, np.uint8, np.float16])
def test_separate_arrays_receive_every_part(group, dtype):
    n, me = world()
    k = K * 4 // np.dtype(dtype).itemsize
    outs = [np.full(k, 255, dtype) for _ in range(n)]
    dist.all_gather(outs, data(me, k, dtype), group=group)
    for r in range(n):
        np.testing.assert_array_equal(outs[r], data(r, k, dtype))


def test_layouts_of_the_list(group):
    """One buffer's pieces, the input among the entries (torch's in-place idiom), entries
    that are columns of a matrix, and Tensors."""
    n, me = world()
    whole = np.zeros((n, K), np.float32)
    dist.all_gather(list(whole), data(me), group=group)
    np.testing.assert_array_equal(whole, np.stack([data(r) for r in range(n)]))

    outs = [np.zeros(K, np.float32) for _ in range(n)]
    outs[me][:] = data(me, salt=3)
    dist.all_gather(outs, outs[me], group=group)
    for r in range(n):
        np.testing.assert_array_equal(outs[r], data(r, salt=3))

    cols = np.zeros((K, 2 * n), np.float32)
    entries = [cols[:, 2 * r] for r in range(n)]  # strided: staged, then copied back
    dist.all_gather(entries, data(me, salt=5), group=group)
    for r in range(n):
        np.testing.assert_array_equal(cols[:, 2 * r], data(r, salt=5))
        assert not cols[:, 2 * r + 1].any()

    ts = [mt.zeros(K) for _ in range(n)]
    dist.all_gather(ts, mt.tensor(data(me, salt=9)), group=group)
    for r in range(n):
        np.testing.assert_array_equal(ts[r].numpy(), data(r, salt=9))


def test_an_input_that_is_another_members_entry(group):
    """The input is the entry a peer's part lands in: it is sent as it was before."""
    n, me = world()
    outs = [np.zeros(K, np.float32) for _ in range(n)]
    other = (me + 1) % n
    outs[other][:] = data(me, salt=11)
    dist.all_gather(outs, outs[other], group=group)
    for r in range(n):
        np.testing.assert_array_equal(outs[r], data(r, salt=11))


def test_async_calls_waited_in_any_order(group):
    n, me = world()
    lists = [[np.zeros(K, np.float32) for _ in range(n)] for _ in range(4)]
    works = [dist.all_gather(lst, data(me, salt=i), group=group, async_op=True)
             for i, lst in enumerate(lists)]
    for w in reversed(works):
        w.wait()
    for i, lst in enumerate(lists):
        for r in range(n):
            np.testing.assert_array_equal(lst[r], data(r, salt=i))


def test_user_messages_never_meet_the_gathers_messages(group):
    """A p2p message of the user's, with the tag and the size of the gather's, sent before
    and received after it, arrives intact where the user receives it."""
    n, me = world()
    tag = _world._pg(group).health.tag_base
    peer = (me + 1) % n
    work = dist.isend(np.full(K, 42.0 + me, np.float32), peer, group=group, tag=tag)
    outs = [np.zeros(K, np.float32) for _ in range(n)]
    dist.all_gather(outs, data(me), group=group)
    got = np.zeros(K, np.float32)
    dist.recv(got, (me - 1) % n, group=group, tag=tag)
    work.wait()
    assert (got == 42.0 + (me - 1) % n).all()
    for r in range(n):
        np.testing.assert_array_equal(outs[r], data(r))


@pytest.mark.parametrize("what", ["size", "dtype"])
def test_a_mismatch_raises_on_every_rank(what):
    n, me = world()
    g = dist.new_group(list(range(n)), group_desc=f"gp2p_{what}")
    _world._pg(g).shm_min = OFF_BYTES
    assert gather_p2p.takes(_world._pg(g), 2 * K * 4 * n)
    k, dtype = K, np.float32
    if me == 0:
        k, dtype = (2 * K, np.float32) if what == "size" else (K, np.int32)
    outs = [np.zeros(k, dtype) for _ in range(n)]
    with pytest.raises(CollectiveMismatchError, match="byte count" if what == "size"
                       else "dtype"):
        dist.all_gather(outs, data(me, k, dtype), group=g)
    assert_unusable_world_untouched(g)


@pytest.mark.mpi(min_size=3)
def test_a_group_of_some_ranks():
    """Group ranks are not the world's: each entry holds the part of the group's member of
    that rank, in the fast path and the general one (Tensors of another dtype: float16)."""
    n, me = world()
    members = [0, n - 1]
    g = dist.new_group(members)  # collective over the world: every rank makes it
    if me in members:
        _world._pg(g).shm_min = OFF_BYTES
        assert gather_p2p.takes(_world._pg(g), K * 4 * 2)
        outs = [np.zeros(K, np.float32) for _ in members]
        dist.all_gather(outs, data(me), group=g)
        for i, r in enumerate(members):
            np.testing.assert_array_equal(outs[i], data(r))
        ts = [mt.zeros(2 * K, dtype=mt.float16) for _ in members]
        dist.all_gather(ts, mt.tensor(data(me, 2 * K, np.float16)), group=g)
        for i, r in enumerate(members):
            np.testing.assert_array_equal(ts[i].numpy(), data(r, 2 * K, np.float16))
        dist.destroy_process_group(g)
