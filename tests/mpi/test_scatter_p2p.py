"""reduce_scatter as messages, reduced in rank order (``backends/mpi/scatter_p2p.py``).

Every form a torch program calls (``reduce_scatter_tensor``, ``reduce_scatter`` with a list,
Tensors, the in-place idiom whose output is the input's own part), every op and dtype family,
async calls waited in any order beside gathers that share the messages' tag, members whose
arguments take different paths, and mismatches. Each result is compared, bit for bit, with the
parts reduced in rank order by NumPy.
"""

from __future__ import annotations

import numpy as np
import pytest

import mpitensor as mt
import mpitensor.distributed as dist
from mpitensor._base.config import OFF_BYTES
from mpitensor.distributed import _world
from mpitensor.distributed.backends.mpi import scatter_p2p
from mpitensor.errors import CollectiveMismatchError

from .broken import assert_unusable_world_untouched

#: elements of output per member: 192 KiB of float32, an input past every board's cap
K = 3 << 14
OPS = {"SUM": np.add, "PRODUCT": np.multiply, "MIN": np.minimum, "MAX": np.maximum,
       "BAND": np.bitwise_and, "BOR": np.bitwise_or, "BXOR": np.bitwise_xor}


def world():
    return dist.get_world_size(), dist.get_rank()


def data(rank, k, dtype=np.float32, salt=0, small=False):
    x = (np.arange(k) * 7 + 1000 * rank + salt) % (3 if small else 4093)
    if np.dtype(dtype).kind in "fc":
        x = x / 8 + (1j * (x % 5) if np.dtype(dtype).kind == "c" else 0)
    return (x + (1 if small else 0)).astype(dtype)


def expected(me, k, dtype, f, salt=0, small=False, via=None):
    """Member ``me``'s part of every rank's input, reduced in rank order (in ``via``'s dtype
    where the plan widens, then narrowed once)."""
    n, _ = world()
    parts = [data(r, k * n, dtype, salt, small)[me * k:(me + 1) * k] for r in range(n)]
    if via is not None:
        parts = [p.astype(via) for p in parts]
    acc = f(parts[0], parts[1])
    for p in parts[2:]:
        acc = f(acc, p)
    return acc.astype(dtype)


G = None


@pytest.fixture(autouse=True)
def group():
    """A group of every rank whose reduce-scatters of K elements a member take this path: the
    engine (shm_coll.py), which calls of this size may ask first, is left out."""
    global G
    n, _ = world()
    if n < 2 or n > scatter_p2p.MOST:
        pytest.skip("one rank, or more than scatter_p2p.MOST: MPI's own reduce-scatter")
    if G is None:
        G = dist.new_group(list(range(n)), group_desc="sp2p")
        _world._pg(G).shm_min = OFF_BYTES
    from mpi4py import MPI
    if not scatter_p2p.takes(_world._pg(G), K * 4 * n, np.dtype(np.float32), MPI.SUM):
        pytest.skip("the group spans machines: MPI's own reduce-scatter")
    return G


def test_the_call_takes_this_path_and_smaller_ones_do_not(group, monkeypatch):
    n, me = world()
    starts = []
    real = scatter_p2p.start
    monkeypatch.setattr(scatter_p2p, "start", lambda *a: starts.append(a[1].size) or real(*a))
    for k in (K, 16):
        out = np.zeros(k, np.float32)
        dist.reduce_scatter_tensor(out, data(me, k * n), group=group)
        np.testing.assert_array_equal(out, expected(me, k, np.float32, np.add))
    assert starts == [K * n]


@pytest.mark.parametrize("dtype, op", [
    (np.float32, "SUM"), (np.float64, "SUM"), (np.float32, "PRODUCT"), (np.float64, "MIN"),
    (np.float32, "MAX"), (np.int64, "SUM"), (np.int32, "PRODUCT"), (np.int16, "MIN"),
    (np.uint8, "BAND"), (np.uint8, "BOR"), (np.int64, "BXOR"), (np.complex64, "SUM"),
    (np.complex128, "PRODUCT")])
def test_every_op_and_dtype_family(group, dtype, op):
    n, me = world()
    k = K * 4 // np.dtype(dtype).itemsize
    small = op == "PRODUCT"
    out = np.zeros(k, dtype)
    dist.reduce_scatter_tensor(out, data(me, k * n, dtype, small=small),
                               op=getattr(dist.ReduceOp, op), group=group)
    np.testing.assert_array_equal(out, expected(me, k, dtype, OPS[op], small=small))


def test_the_general_path_float16_bool_and_avg(group):
    """float16 is reduced in float32 and rounded once; bool as 0/1 bytes (SUM: any); AVG
    divides the rank-order sum."""
    n, me = world()
    k = 2 * K
    out = mt.zeros(k, dtype=mt.float16)
    dist.reduce_scatter_tensor(out, mt.tensor(data(me, k * n, np.float16)), group=group)
    np.testing.assert_array_equal(out.numpy(),
                                  expected(me, k, np.float16, np.add, via=np.float32))
    flags = np.zeros(4 * K, bool)
    mine = (np.arange(4 * K * n) % (n + 1)) == me
    dist.reduce_scatter_tensor(flags, mine, group=group)
    want = np.zeros(4 * K, bool)
    for r in range(n):
        want |= ((np.arange(4 * K * n) % (n + 1)) == r)[me * 4 * K:(me + 1) * 4 * K]
    np.testing.assert_array_equal(flags, want)
    avg = np.zeros(K // 2, np.float64)
    dist.reduce_scatter_tensor(avg, data(me, K // 2 * n, np.float64), op=dist.ReduceOp.AVG,
                               group=group)
    np.testing.assert_array_equal(avg, expected(me, K // 2, np.float64, np.add) / n)


def test_list_form_tensors_and_the_in_place_idiom(group):
    n, me = world()
    whole = data(me, K * n)
    out = np.zeros(K, np.float32)
    dist.reduce_scatter(out, [whole[r * K:(r + 1) * K].copy() for r in range(n)], group=group)
    np.testing.assert_array_equal(out, expected(me, K, np.float32, np.add))
    t_out = mt.zeros(K)
    dist.reduce_scatter_tensor(t_out, mt.tensor(whole), group=group)
    np.testing.assert_array_equal(t_out.numpy(), expected(me, K, np.float32, np.add))
    # the output is the input's own part (torch FSDP's idiom): read before it is written
    buf = whole.copy()
    dist.reduce_scatter_tensor(buf[me * K:(me + 1) * K], buf, group=group)
    np.testing.assert_array_equal(buf[me * K:(me + 1) * K], expected(me, K, np.float32, np.add))


def test_members_whose_arguments_take_different_paths(group):
    """Rank 0's output is a strided view (the general path), the others' contiguous arrays
    (the fast path): the same messages on both."""
    n, me = world()
    if me == 0:
        host = np.zeros((K, 2), np.float32)
        out = host[:, 0]
    else:
        out = np.zeros(K, np.float32)
    dist.reduce_scatter_tensor(out, data(me, K * n), group=group)
    np.testing.assert_array_equal(out, expected(me, K, np.float32, np.add))


def test_async_calls_waited_in_any_order_beside_gathers(group):
    n, me = world()
    outs = [np.zeros(K, np.float32) for _ in range(3)]
    lists = [[np.zeros(K, np.float32) for _ in range(n)] for _ in range(2)]
    works = [dist.reduce_scatter_tensor(outs[0], data(me, K * n, salt=0), group=group,
                                        async_op=True),
             dist.all_gather(lists[0], data(me, K, salt=5), group=group, async_op=True),
             dist.reduce_scatter_tensor(outs[1], data(me, K * n, salt=1), group=group,
                                        async_op=True),
             dist.all_gather(lists[1], data(me, K, salt=6), group=group, async_op=True),
             dist.reduce_scatter_tensor(outs[2], data(me, K * n, salt=2), group=group,
                                        async_op=True)]
    for w in reversed(works):
        w.wait()
    for i, out in enumerate(outs):
        np.testing.assert_array_equal(out, expected(me, K, np.float32, np.add, salt=i))
    for i, lst in enumerate(lists):
        for r in range(n):
            np.testing.assert_array_equal(lst[r], data(r, K, salt=5 + i))


def test_a_size_mismatch_raises_on_every_rank():
    n, me = world()
    g = dist.new_group(list(range(n)), group_desc="sp2p_size")
    _world._pg(g).shm_min = OFF_BYTES
    k = 2 * K if me == 0 else K
    with pytest.raises(CollectiveMismatchError, match="byte count"):
        dist.reduce_scatter_tensor(np.zeros(k, np.float32), data(me, k * n), group=g)
    assert_unusable_world_untouched(g)


@pytest.mark.mpi(min_size=3)
def test_a_group_of_some_ranks():
    """Group ranks are not the world's: each member gets its group rank's part."""
    n, me = world()
    members = [0, n - 1]
    g = dist.new_group(members)  # collective over the world: every rank makes it
    if me in members:
        _world._pg(g).shm_min = OFF_BYTES
        i = members.index(me)
        out = np.zeros(K, np.float32)
        dist.reduce_scatter_tensor(out, data(me, 2 * K), group=g)
        parts = [data(r, 2 * K)[i * K:(i + 1) * K] for r in members]
        np.testing.assert_array_equal(out, parts[0] + parts[1])
        dist.destroy_process_group(g)
