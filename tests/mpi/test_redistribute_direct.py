"""The direct path of Shard(i) -> Shard(j) and Shard(d) -> Replicate (``tensor/_direct.py``:
blocks written into the peers' mapped results, or moved with process_vm_readv/writev,
straight into place) across 1-4 ranks, compared bit for bit with the full tensor's slices:
every dtype, every pair of dims, uneven and empty pieces, non-contiguous local pieces, a swap
on one dim of a 2-D mesh, and the way back.

Every test runs three ways: through mapped results (``mapped``), and through cross-memory
attach with the staging buffer lowered to 40 bytes so that a block goes through it in
several slices (``staged``) or with no staging (``straight``). The size thresholds are
lowered to nothing so that small tensors take the path.
The tests that count assert that the path was taken where the group's probe allows it; the
collective path gives the same bits where it does not, is switched off, or a move failed.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import mpitensor.distributed as dist
from mpitensor import dtypes
from mpitensor.distributed.tensor import Replicate, Shard, _direct, init_device_mesh

from .test_redistribute_swap import DTYPES, full, piece, placed, same_bits, swap_and_check


@pytest.fixture(autouse=True, params=["mapped", "staged", "straight"])
def every_size(request, monkeypatch):
    """Every size takes the path: through the peers' mapped results, or by cross-memory
    attach where strided short runs either go through a staging buffer a few runs at a time
    (several slices per block) or straight to the kernel."""
    monkeypatch.setattr(_direct, "MIN_BYTES", 0)
    monkeypatch.setattr(_direct, "MIN_RUN", 0)
    monkeypatch.setattr(_direct, "MIN_PUSH_RUN", 0)
    monkeypatch.setattr(_direct, "MIN_MAPPED_RUN", 0)
    monkeypatch.setattr(_direct, "STAGE", 40)
    monkeypatch.setattr(_direct, "MAPPED", request.param == "mapped")
    if request.param == "straight":
        monkeypatch.setattr(_direct, "STAGE_RUN", 0)
    return request.param


class Count:
    """Counts the calls that the direct path completed (returned a result)."""

    def __init__(self, monkeypatch):
        self.done = 0
        for name in ("swap", "gather"):
            real = getattr(_direct, name)

            def wrapped(*a, _real=real, **kw):
                got = _real(*a, **kw)
                self.done += got is not None
                return got

            monkeypatch.setattr(_direct, name, wrapped)


def usable(mesh, m=0):
    """Whether the group of mesh dim ``m`` takes the direct path (its probe, agreed)."""
    return dist.get_world_size() == 1 or _direct._pids(mesh.get_group(m), mesh.size(m)) is not None


def test_the_probe_agrees_and_succeeds_on_one_node():
    # every rank of these suites runs on this machine as the same user: the kernel allows
    # cross-memory attach, and opening a peer's descriptors, unless ptrace is restricted
    # (Yama's ptrace_scope) or seccomp refuses
    n = dist.get_world_size()
    mesh = init_device_mesh("cpu", (n,))
    found = _direct._probe(mesh.get_group(0), n) if n > 1 else None
    ok = np.array([int(usable(mesh)), int(found is not None and found.cma),
                   int(found is not None and found.mapped)], np.int64)
    every = np.zeros((n, 3), np.int64)
    dist.all_gather_into_tensor(every, ok)
    assert (every == every[0]).all()
    if found is not None and found.cma:  # the same permission lets a peer map a segment
        assert found.mapped


def test_swap_every_dtype_every_pair(monkeypatch):
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    count = Count(monkeypatch)
    calls = 0
    for dtype in DTYPES:
        for shape in ((5, 7, 3), (8, 4, 6)):
            arr = full(shape, dtype, seed=11)
            for i, j in itertools.permutations(range(3), 2):
                swap_and_check(arr, mesh, [Shard(i)], [Shard(j)])
                calls += 1
    if dist.get_world_size() > 1 and usable(mesh):
        assert count.done == calls


@pytest.mark.parametrize("shape", [(5, 7, 3), (4, 8, 12), (2, 3, 1), (1, 6, 5), (7, 1, 2),
                                   (3, 0, 2), (13, 1031)])
def test_swap_uneven_and_empty_pieces(shape):
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    arr = full(shape, np.float64, seed=12)
    for i, j in itertools.permutations(range(len(shape)), 2):
        y = swap_and_check(arr, mesh, [Shard(i)], [Shard(j)])
        np.testing.assert_array_equal(y.full_tensor().numpy(), arr)


def test_swap_non_contiguous_pieces_and_back():
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for dtype in (np.float32, np.int64, dtypes.bfloat16, np.bool_):
        arr = full((6, 5, 4), dtype, seed=13)
        for i, j in itertools.permutations(range(3), 2):
            y = swap_and_check(arr, mesh, [Shard(i)], [Shard(j)], strided=True)
            back = y.redistribute(mesh, [Shard(i)])
            same_bits(back.to_local().numpy(), piece(arr, mesh, [Shard(i)]), (dtype, i, j))


def test_swap_on_one_dim_of_a_two_dimensional_mesh(monkeypatch):
    n = dist.get_world_size()
    arr = full((6, 5, 7), np.float32, seed=14)
    for shape in [(a, n // a) for a in range(1, n + 1) if n % a == 0]:
        mesh = init_device_mesh("cpu", shape)
        for a, b, c in itertools.permutations(range(3)):
            swap_and_check(arr, mesh, [Shard(a), Shard(b)], [Shard(a), Shard(c)])
            swap_and_check(arr, mesh, [Shard(b), Replicate()], [Shard(c), Replicate()])


def test_gather_every_dtype_every_dim(monkeypatch):
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    count = Count(monkeypatch)
    calls = 0
    for dtype in DTYPES:
        for shape in ((5, 7, 3), (2, 4, 9), (3, 0, 2), (9, 2, 1)):
            arr = full(shape, dtype, seed=15)
            for d in range(3):
                for strided in (False, True):
                    y = placed(arr, mesh, [Shard(d)], strided).redistribute(mesh, [Replicate()])
                    same_bits(y.to_local().numpy(), arr, (dtype, shape, d, strided))
                    assert y.to_local().numpy().flags.c_contiguous
                    calls += 1  # every dim, the leading ones too
    if dist.get_world_size() > 1 and usable(mesh):
        assert count.done == calls


def test_switched_off_gives_the_same_bits():
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    arr = full((9, 10, 3), np.float64, seed=16)
    old = _direct.set_enabled(False)
    try:
        for i, j in itertools.permutations(range(3), 2):
            swap_and_check(arr, mesh, [Shard(i)], [Shard(j)])
    finally:
        _direct.set_enabled(old)


def test_a_rank_with_another_shape_falls_back_to_the_collective():
    # the fingerprints differ: every rank leaves the direct path before any byte moves, and
    # the all_to_all (which checks sizes) reports the mismatch on every rank
    n, me = dist.get_world_size(), dist.get_rank()
    if n == 1:
        return
    mesh = init_device_mesh("cpu", (n,))
    group = mesh.get_group(0)
    if _direct._pids(group, n) is None:
        return
    x = np.zeros((4, 8 + (me == 0)), np.float32)
    got = []

    def plan(addrs):
        got.append(True)

    fp = _direct._fingerprint("swap", x.shape)
    assert not _direct._move(group, _direct._pids(group, n), me, x.ctypes.data, fp, plan)
    assert not got


def test_without_the_compiled_copy(monkeypatch):
    # where _cpu_kernels is not built, this rank's own block is one NumPy copyto
    monkeypatch.setattr(_direct, "_copy_runs", None)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for dtype in (np.float32, np.complex64):
        arr = full((7, 9, 4), dtype, seed=17)
        for i, j in itertools.permutations(range(3), 2):
            swap_and_check(arr, mesh, [Shard(i)], [Shard(j)])
        for d in (1, 2):
            y = placed(arr, mesh, [Shard(d)]).redistribute(mesh, [Replicate()])
            same_bits(y.to_local().numpy(), arr, (dtype, d))


def every_swap_and_gather(arr, mesh):
    """Every Shard(i) -> Shard(j) of the 3-D ``arr`` and its gathers along dims 1 and 2,
    each compared bit for bit with the full array's slices."""
    for i, j in itertools.permutations(range(3), 2):
        swap_and_check(arr, mesh, [Shard(i)], [Shard(j)])
    for d in (1, 2):
        y = placed(arr, mesh, [Shard(d)]).redistribute(mesh, [Replicate()])
        same_bits(y.to_local().numpy(), arr, d)


def test_a_failed_move_on_one_rank_sends_every_rank_to_the_collective(monkeypatch):
    n, me = dist.get_world_size(), dist.get_rank()
    mesh = init_device_mesh("cpu", (n,))
    if n == 1 or not usable(mesh):
        return
    from mpitensor.distributed.backends.mpi.cma import CmaError

    def refused(*args, **kwargs):
        raise CmaError(1, "refused (test)")

    if me == n - 1:  # this rank can neither write into its peers' results nor attach
        monkeypatch.setattr(_direct._cma, "transfer", refused)
        monkeypatch.setattr(_direct._mapped.PEERS, "get", refused)
    count = Count(monkeypatch)
    every_swap_and_gather(full((8, 12, 5), np.float32, seed=18), mesh)
    assert count.done == 0


def test_default_thresholds_choose_by_size_and_run(monkeypatch, every_size):
    # the module's own limits: at least MIN_BYTES in all, runs of MIN_MAPPED_RUN bytes into
    # mapped results, else MIN_RUN (reads) or MIN_PUSH_RUN (writes from strided runs) bytes;
    # the choice is the same on every rank
    for name in ("MIN_BYTES", "MIN_RUN", "MIN_PUSH_RUN", "MIN_MAPPED_RUN", "STAGE",
                 "STAGE_RUN"):
        monkeypatch.setattr(_direct, name, getattr(_direct, name + "_DEFAULT"))
    n = dist.get_world_size()
    mesh = init_device_mesh("cpu", (n,))
    if n == 1 or not usable(mesh):
        return
    mapped = every_size == "mapped" and _direct._probe(mesh.get_group(0), n).mapped
    count = Count(monkeypatch)
    arr = full((512, 1024), np.float32, seed=19)  # 2 MiB
    run = -(-1024 // n) * 4  # bytes of a row's chunk
    swap_and_check(arr, mesh, [Shard(1)], [Shard(0)])  # the receiver reads
    assert count.done == 1
    swap_and_check(arr, mesh, [Shard(0)], [Shard(1)])  # the sender writes
    assert count.done == 1 + (mapped or run >= _direct.MIN_PUSH_RUN)
    if mapped:  # 16-byte runs: too short even for a compiled copy
        before = count.done
        swap_and_check(full((65536, 4 * n), np.float32, seed=20), mesh, [Shard(0)], [Shard(1)])
        assert count.done == before
    before = count.done
    swap_and_check(full((64, 64), np.float32), mesh, [Shard(1)], [Shard(0)])  # 16 KiB
    assert count.done == before


def mapped_path(mesh, every_size):
    """Whether this test's calls write into mapped results."""
    n = dist.get_world_size()
    return (every_size == "mapped" and n > 1 and usable(mesh)
            and _direct._probe(mesh.get_group(0), n).mapped)


def test_a_result_held_is_never_written_again(every_size):
    # results come from a pool of shared segments the peers write into: a segment is handed
    # out again only once no view of it is alive, so results a user holds keep their values
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    a, b = full((24, 16), np.float32, seed=21), full((24, 16), np.float32, seed=22)
    ya = placed(a, mesh, [Shard(1)]).redistribute(mesh, [Replicate()])
    kept = ya.to_local().numpy().copy()
    row = ya.to_local().numpy()[3]  # a view of the result alone keeps it too
    del ya
    for _ in range(3):
        yb = placed(b, mesh, [Shard(1)]).redistribute(mesh, [Replicate()])
        same_bits(yb.to_local().numpy(), b, "b")
    same_bits(row, kept[3], "the row held")
    same_bits(placed(a, mesh, [Shard(0)]).redistribute(mesh, [Shard(1)]).to_local().numpy(),
              piece(a, mesh, [Shard(1)]), "swap")


def test_results_are_recycled_once_dropped(monkeypatch, every_size):
    from mpitensor.distributed.backends.mpi import mapped

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    if not mapped_path(mesh, every_size):
        return
    writes = []
    real = _direct._write_all
    monkeypatch.setattr(_direct, "_write_all", lambda *a: (writes.append(1), real(*a)))
    arr = full((32, 64), np.float64, seed=23)
    dt = placed(arr, mesh, [Shard(1)])
    dt.redistribute(mesh, [Replicate()])
    made = len(mapped.POOL)
    for _ in range(4):
        y = dt.redistribute(mesh, [Replicate()])
        same_bits(y.to_local().numpy(), arr, "again")
    assert len(mapped.POOL) <= made + 1  # the one held by y, and the one freed each time
    assert len(writes) == 5  # every call wrote into the peers' mapped results


def test_a_full_pool_on_one_rank_takes_another_path_everywhere(monkeypatch, every_size):
    # a rank whose pool has no segment to give announces none: every rank moves the blocks
    # by cross-memory attach instead (or takes the collective), with the same bits
    from mpitensor.distributed.backends.mpi import mapped

    n, me = dist.get_world_size(), dist.get_rank()
    mesh = init_device_mesh("cpu", (n,))
    if not mapped_path(mesh, every_size):
        return
    if me == 0:
        monkeypatch.setattr(mapped.POOL, "MAX_BUFFERS", 0)
    every_swap_and_gather(full((8, 12, 5), np.float32, seed=24), mesh)


# ------------------------------------------------------------------ Partial -> Replicate
REDUCE = {"sum": np.add, "avg": np.add, "max": np.maximum, "min": np.minimum,
          "product": np.multiply}


def rank_order(terms, op):
    """The reduction of the terms in rank order, as the node-local engine computes it."""
    acc = REDUCE[op](terms[0], terms[1]) if len(terms) > 1 else terms[0].copy()
    for t in terms[2:]:
        acc = REDUCE[op](acc, t)
    if op == "avg":
        acc = (acc / acc.dtype.type(len(terms))).astype(acc.dtype)
    return acc


def reduce_and_check(shape, dtype, op, mesh, seed, exact=False):
    """Partial(op) -> Replicate of one term per rank: the rank-order reduction, bit for bit
    where ``exact`` (the direct path, and every order-free op or integer type), else within
    the arithmetic's rounding (the group's path may reduce in another order, or wider)."""
    from mpitensor.distributed.tensor import DTensor, Partial

    n, me = dist.get_world_size(), dist.get_rank()
    terms = [full(shape, dtype, seed=seed + r) for r in range(n)]
    if op == "product" and np.dtype(dtype).kind in "iu":
        terms = [t % 3 for t in terms]  # (products that stay in range)
    mine = terms[me].copy()
    x = DTensor.from_local(mt_tensor(mine), mesh, [Partial(op)])
    y = x.redistribute(mesh, [Replicate()]).to_local().numpy()
    same_bits(mine, terms[me], "the term is left as it was")
    want = rank_order(terms, op)
    if exact or op in ("max", "min") or np.dtype(dtype).kind in "iub" or n <= 2:
        same_bits(y, want, (shape, dtype, op))
    else:  # each of the n - 1 steps rounds by at most eps of what it combines
        eps = 2.0 ** -7 if dtype is dtypes.bfloat16 else float(np.finfo(dtype).eps)
        wide = [t.astype(np.complex128 if np.dtype(dtype).kind == "c" else np.float64)
                for t in terms]
        mag = (np.abs(rank_order(wide, op)) if op == "product"
               else sum(np.abs(t) for t in wide))
        err = np.abs(y.astype(wide[0].dtype) - rank_order(wide, op))
        assert (err <= n * eps * mag).all(), (shape, dtype, op)
    every = np.zeros((n,) + y.shape, y.dtype)
    dist.all_gather_into_tensor(every, np.ascontiguousarray(y))
    assert all(e.tobytes() == every[0].tobytes() for e in every), "the same bits everywhere"
    return y


def mt_tensor(a):
    import mpitensor as mt

    return mt.tensor(a)


@pytest.mark.parametrize("op", ["sum", "avg", "max", "min", "product"])
def test_partial_to_replicate_every_op_and_dtype(monkeypatch, op, every_size):
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    calls = []
    real = _direct._reduce_part
    monkeypatch.setattr(_direct, "_reduce_part", lambda *a: (calls.append(1), real(*a)))
    dtypes_ = [np.float32, np.float64, np.int32, np.int64, np.uint8]
    direct = mapped_path(mesh, every_size)
    for dtype in dtypes_:
        if op == "avg" and np.dtype(dtype).kind != "f":
            continue
        for shape in ((37, 5), (3, 1000), (1,), (64, 16)):
            reduce_and_check(shape, dtype, op, mesh, seed=31, exact=direct)
    if direct:  # every call wrote its part into every rank's result
        assert len(calls) == sum(4 for d in dtypes_ if op != "avg" or np.dtype(d).kind == "f")
    elif dist.get_world_size() > 1:
        assert not calls


def test_partial_to_replicate_other_dtypes_take_the_group(every_size):
    # half precision and bool go through the engine's own staging; complex has no order
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for dtype in (np.float16, dtypes.bfloat16, np.complex64, np.bool_):
        op = "max" if dtype is np.bool_ else "sum"
        reduce_and_check((9, 7), dtype, op, mesh, seed=32)


def test_partial_to_replicate_falls_back_together(monkeypatch, every_size):
    # a rank whose pool has no segment, or whose read of a peer fails: every rank takes the
    # group's all_reduce, with the same bits
    n, me = dist.get_world_size(), dist.get_rank()
    mesh = init_device_mesh("cpu", (n,))
    if not mapped_path(mesh, every_size):
        return
    from mpitensor.distributed.backends.mpi import mapped
    from mpitensor.distributed.backends.mpi.cma import CmaError

    with monkeypatch.context() as mp:
        if me == n - 1:
            mp.setattr(mapped.POOL, "MAX_BUFFERS", 0)
        reduce_and_check((40, 24), np.float64, "sum", mesh, seed=33)

    def refused(*a, **kw):
        raise CmaError(1, "refused (test)")

    class Refusing:  # the direct path's reader only (the engine's reads keep working)
        read = staticmethod(refused)

    with monkeypatch.context() as mp:
        if me == 0:
            mp.setattr(_direct, "_reader", Refusing)
        reduce_and_check((40, 24), np.int64, "max", mesh, seed=34)
