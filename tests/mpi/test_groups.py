"""Process groups: new_group (disjoint, overlapping), rank translation, non-members, group=.

The groups come from :mod:`arrayimpl` (made once, in one order, on every rank); every
collective and point-to-point operation is also run with ``group=`` by the class matrices of
``test_cco_buf.py`` and ``test_p2p_buf.py``.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

import mpitensor.distributed as dist
from mpitensor.errors import MpiTensorError, NotAGroupMemberError

from . import arrayimpl as ai

R = dist.ReduceOp


def world():
    return dist.get_world_size(), dist.get_rank()


def named(name):
    """The arrayimpl group ``name`` and its global ranks (None where the world is too small)."""
    groups = ai._groups()
    if name not in groups:
        return None, []
    g = groups[name]
    return g, dist.get_process_group_ranks(g)


def test_world_group():
    n, me = world()
    assert dist.is_initialized()
    assert dist.group.WORLD is dist.GroupMember.WORLD
    assert dist.get_process_group_ranks(None) == list(range(n))
    assert dist.get_process_group_ranks(dist.group.WORLD) == list(range(n))
    assert dist.get_rank(dist.group.WORLD) == me
    assert dist.get_world_size(dist.group.WORLD) == n
    assert dist.get_backend() == "mpi"
    assert dist.get_global_rank(None, me) == me
    assert dist.get_group_rank(None, me) == me


@pytest.mark.parametrize("name", ai.GROUP_NAMES[1:])
def test_membership_and_translation(name):
    n, me = world()
    g, ranks = named(name)
    if g is None:
        pytest.skip(f"group {name!r} needs 2 ranks or more")
    expected = {"full": list(range(n)), "evens": list(range(0, n, 2)),
                "odds": list(range(1, n, 2)), "tail": list(range(1, n)),
                "ends": sorted({0, n - 1})}[name]
    assert ranks == expected  # sorted, whatever order new_group was given
    assert dist.get_backend(g) == "mpi"
    if me in ranks:
        assert dist.get_rank(g) == ranks.index(me)
        assert dist.get_world_size(g) == len(ranks)
        assert g.rank() == ranks.index(me) and g.size() == len(ranks)
    else:
        assert dist.get_rank(g) == -1
        assert dist.get_world_size(g) == -1
    # translation works the same from members and non-members
    for i, r in enumerate(ranks):
        assert dist.get_global_rank(g, i) == r
        assert dist.get_group_rank(g, r) == i
    for r in range(n):
        if r not in ranks:
            with pytest.raises(ValueError, match=rf"global_rank={r} is not a rank of"):
                dist.get_group_rank(g, r)
    with pytest.raises(ValueError, match=f"group_rank={len(ranks)} is out of range"):
        dist.get_global_rank(g, len(ranks))
    with pytest.raises(ValueError, match="out of range"):
        dist.get_global_rank(g, -1)
    with pytest.raises(TypeError, match="must be an int"):
        dist.get_group_rank(g, "0")


def test_new_group_bad_ranks():
    n, _ = world()
    with pytest.raises(ValueError, match=rf"ranks \[{n}\] are out of range for world size {n}"):
        dist.new_group([0, n])
    with pytest.raises(ValueError, match="out of range"):
        dist.new_group([-1])
    with pytest.raises(ValueError, match="duplicates"):
        dist.new_group([0, 0])
    with pytest.raises(ValueError, match="must not be empty"):
        dist.new_group([])
    with pytest.raises(TypeError, match="list of ints"):
        dist.new_group(["0"])
    with pytest.raises(TypeError, match="group must be a process group"):
        dist.all_reduce(np.ones(1), group=[0, 1])


@pytest.mark.mpi(min_size=2)
def test_disjoint_groups_reduce_independently():
    """Evens and odds all-reduce at the same time; each sees only its own members."""
    n, me = world()
    evens, eranks = named("evens")
    odds, oranks = named("odds")
    mine, ranks = (evens, eranks) if me % 2 == 0 else (odds, oranks)
    other = odds if me % 2 == 0 else evens
    assert dist.get_rank(other) == -1
    for kind in ai.kinds():
        x = ai.wrap(kind, np.full(3, me + 1, dtype=np.int64))
        dist.all_reduce(x, group=mine)
        ai.check(x, np.full(3, sum(r + 1 for r in ranks), dtype=np.int64), f"{kind}")
        out = [ai.wrap(kind, np.zeros(1, np.int32)) for _ in ranks]
        dist.all_gather(out, ai.wrap(kind, np.array([me], np.int32)), group=mine)
        assert [int(ai.host(o)[0]) for o in out] == ranks
        y = ai.wrap(kind, np.array([me * 10.0]))
        dist.broadcast(y, src=ranks[-1], group=mine)
        ai.check(y, np.array([ranks[-1] * 10.0]), "broadcast")
    dist.barrier(group=mine)


@pytest.mark.mpi(min_size=3)
def test_overlapping_groups():
    """Rank 2 is in evens and in tail: the groups take turns and stay apart."""
    n, me = world()
    evens, eranks = named("evens")
    tail, tranks = named("tail")
    for g, ranks, salt in ((evens, eranks, 100), (tail, tranks, 1000), (evens, eranks, 7)):
        if me not in ranks:
            continue
        x = np.array([me + salt], dtype=np.float64)
        dist.all_reduce(x, op=R.MAX, group=g)
        assert x[0] == max(ranks) + salt
        x = np.array([me + salt], dtype=np.float64)
        dist.all_reduce(x, op=R.SUM, group=g)
        assert x[0] == sum(ranks) + salt * len(ranks)
    both = me in eranks and me in tranks
    assert both == (me % 2 == 0 and me >= 2)


@pytest.mark.mpi(min_size=2)
def test_src_dst_are_global_ranks_in_a_group():
    """As in torch: src/dst are global ranks; group_src/group_dst are ranks inside the group."""
    n, me = world()
    tail, ranks = named("tail")  # global ranks 1..n-1; group rank i is global rank i + 1
    if me not in ranks:
        assert me == 0
        return
    gr = dist.get_rank(tail)
    last = ranks[-1]
    for kw in ({"src": last}, {"group_src": len(ranks) - 1}):
        x = np.array([me], dtype=np.int32)
        dist.broadcast(x, group=tail, **kw)
        assert x[0] == last, kw
    x = np.array([gr + 1], dtype=np.int32)
    dist.reduce(x, dst=ranks[0], group=tail)  # global rank 1 = group rank 0
    if gr == 0:
        assert x[0] == sum(range(1, len(ranks) + 1))
    x = np.array([me], dtype=np.int32)
    with pytest.raises(ValueError, match=r"src=0 is not a rank of .*global ranks"):
        dist.broadcast(x, src=0, group=tail)  # global 0 is not in tail
    with pytest.raises(ValueError, match=f"group_src={len(ranks)} is out of range"):
        dist.broadcast(x, group_src=len(ranks), group=tail)
    with pytest.raises(ValueError, match="not both"):
        dist.broadcast(x, src=last, group_src=0, group=tail)
    with pytest.raises(ValueError, match=f"dst={n} is out of range"):
        dist.reduce(x, dst=n, group=tail)
    if len(ranks) >= 2:
        # p2p inside the group: send to global rank vs group rank
        other = ranks[1] if gr == 0 else ranks[0]
        y = np.zeros(1, np.int32)
        if gr == 0:
            dist.send(np.array([me], np.int32), dst=other, group=tail)
            assert dist.recv(y, group_src=1, group=tail) == other
            assert y[0] == other
        elif gr == 1:
            assert dist.recv(y, src=other, group=tail) == other
            assert y[0] == other
            dist.send(np.array([me], np.int32), group_dst=0, group=tail)
        with pytest.raises(ValueError, match="dst=0 is not a rank of"):
            dist.send(y, dst=0, group=tail)


def _every_operation(g):
    """Every collective and p2p call of the API, as (name, thunk) pairs."""
    x = np.ones(2, np.float32)
    lst = [np.zeros(2, np.float32), np.zeros(2, np.float32)]
    return [
        ("broadcast", lambda: dist.broadcast(x, src=0, group=g)),
        ("all_reduce", lambda: dist.all_reduce(x, group=g)),
        ("all_reduce async", lambda: dist.all_reduce(x, group=g, async_op=True)),
        ("reduce", lambda: dist.reduce(x, dst=0, group=g)),
        ("all_gather", lambda: dist.all_gather(lst, x, group=g)),
        ("all_gather_into_tensor", lambda: dist.all_gather_into_tensor(x, x, group=g)),
        ("gather", lambda: dist.gather(x, None, dst=0, group=g)),
        ("scatter", lambda: dist.scatter(x, None, src=0, group=g)),
        ("reduce_scatter", lambda: dist.reduce_scatter(x, lst, group=g)),
        ("reduce_scatter_tensor", lambda: dist.reduce_scatter_tensor(x, x, group=g)),
        ("all_to_all", lambda: dist.all_to_all(lst, lst, group=g)),
        ("all_to_all_single", lambda: dist.all_to_all_single(x, x, group=g)),
        ("barrier", lambda: dist.barrier(group=g)),
        ("send", lambda: dist.send(x, dst=0, group=g)),
        ("recv", lambda: dist.recv(x, src=0, group=g)),
        ("isend", lambda: dist.isend(x, dst=0, group=g)),
        ("irecv", lambda: dist.irecv(x, group=g)),
        ("batch_isend_irecv", lambda: dist.batch_isend_irecv(
            [dist.P2POp(dist.isend, x, 0, group=g)])),
        ("broadcast_object_list", lambda: dist.broadcast_object_list([1], src=0, group=g)),
        ("all_gather_object", lambda: dist.all_gather_object([None], 1, group=g)),
        ("gather_object", lambda: dist.gather_object(1, None, dst=0, group=g)),
        ("scatter_object_list", lambda: dist.scatter_object_list([None], None, src=0,
                                                                 group=g)),
        ("send_object", lambda: dist.send_object(1, 0, group=g)),
        ("recv_object", lambda: dist.recv_object(0, group=g)),
        ("send_object_list", lambda: dist.send_object_list([1], dst=0, group=g)),
        ("recv_object_list", lambda: dist.recv_object_list([None], src=0, group=g)),
    ]


@pytest.mark.mpi(min_size=2)
def test_non_member_operations_raise():
    """Every operation on a group this rank is not in raises NotAGroupMemberError, locally."""
    n, me = world()
    tail, ranks = named("tail")  # rank 0 is the one non-member
    if me != 0:
        return
    assert dist.get_rank(tail) == -1
    for name, thunk in _every_operation(tail):
        with pytest.raises(NotAGroupMemberError, match=r"rank 0: .*not a member") as info:
            thunk()
        assert isinstance(info.value, MpiTensorError), name
        assert isinstance(info.value, ValueError), name
        assert "get_rank(group) >= 0" in str(info.value), name


def test_destroy_sub_group_keeps_world():
    n, me = world()
    g = dist.new_group(list(range(n)))
    x = np.array([1.0])
    dist.all_reduce(x, group=g)
    assert x[0] == n
    dist.destroy_process_group(g)
    assert dist.is_initialized()
    with pytest.raises(MpiTensorError, match="which was destroyed"):
        dist.all_reduce(x, group=g)  # raised locally on every rank: no traffic, no waiting
    dist.all_reduce(x)
    assert x[0] == n * n


def test_numpy_integer_ranks():
    """Ranks given as NumPy integers work like ints (as they do in torch)."""
    n, me = world()
    x = np.array([me], dtype=np.int64)
    dist.broadcast(x, src=np.int64(n - 1))
    assert x[0] == n - 1
    assert dist.get_global_rank(None, np.int32(0)) == 0
    if n > 1 and me < 2:
        peer = np.int32(1 - me)
        y = np.zeros(1, np.int64)
        if me == 0:
            dist.send(np.array([5]), dst=peer)
        else:
            assert dist.recv(y, src=peer) == 0 and y[0] == 5


def test_a_dead_groups_late_notice_never_breaks_a_new_group():
    """A failure notice that reaches a rank after it destroyed the group stays unmatched in
    MPI's queue, and MPICH gives the next communicators the same context ids: a later group
    must not read it as its own (it did: every call on the new group raised PeerFailedError
    naming the old failure)."""
    from mpitensor.errors import PeerFailedError

    n, me = dist.get_world_size(), dist.get_rank()
    if n < 2:
        pytest.skip("needs 2 ranks")
    for _ in range(3):
        g = dist.new_group(list(range(n)))
        if me == n - 1:
            dist.destroy_process_group(g)  # gone before the others' notices arrive
        dist.barrier()
        if me != n - 1:
            # a bad call on one rank: it tells every member that the group is unusable
            with pytest.raises(ValueError):
                dist.all_reduce(np.zeros(3, np.float64), op="no such op", group=g)
            dist.destroy_process_group(g)
        dist.barrier()
        fresh = dist.new_group(list(range(n)))
        a = np.full(4, me + 1.0)
        if me != n - 1:
            time.sleep(0.05)  # the last rank waits, and so reads what its group has received
        try:
            dist.all_reduce(a, group=fresh)
        except PeerFailedError as exc:  # pragma: no cover - the failure this test guards
            pytest.fail(f"the new group took a dead group's notice: {exc}")
        assert (a == n * (n + 1) / 2).all()
        dist.destroy_process_group(fresh)
