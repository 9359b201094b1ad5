"""Large collectives move their bytes as raw mpi4py does (issue 29): all_gather's list form
receives straight into its entries where they lie end to end in one buffer, else into a flat
buffer that a large blocking call reuses (no output-sized temporary per call), and the
agreement check of a large call is posted before its data.

Run: ``timeout 600 mpiexec -n N python -m pytest -q --with-mpi``
``tests/mpi/test_large_collectives.py``.
"""

from __future__ import annotations

import time
import tracemalloc

import numpy as np
import pytest
from mpi4py import MPI

import mpitensor
import mpitensor.distributed as dist
from mpitensor.distributed import _world
from mpitensor.distributed.backends.mpi import gather_p2p
from mpitensor.errors import CollectiveMismatchError, PeerFailedError

BIG = 1 << 16  # float32 elements per rank: 256 KiB, past the 64 KiB agreement threshold


def world():
    return dist.get_world_size(), dist.get_rank()


def piece(rank, count, dtype=np.float32):
    """Rank ``rank``'s distinct piece: its values name the rank and the position."""
    return (np.arange(count) % 1000 + 1000 * (rank + 1)).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.complex128, np.bool_])
def test_all_gather_list_values(dtype):
    n, me = world()
    outs = [np.zeros(1000, dtype) for _ in range(n)]
    dist.all_gather(outs, piece(me, 1000, dtype))
    for r in range(n):
        np.testing.assert_array_equal(outs[r], piece(r, 1000, dtype))


def test_all_gather_list_into_tensors_of_any_shape():
    n, me = world()
    outs = [mpitensor.zeros(3, 4, dtype=mpitensor.float64) for _ in range(n)]
    dist.all_gather(outs, mpitensor.tensor(piece(me, 12, np.float64).reshape(3, 4)))
    for r in range(n):
        np.testing.assert_array_equal(outs[r].numpy(), piece(r, 12, np.float64).reshape(3, 4))


def test_all_gather_list_into_chunks_of_one_buffer():
    n, me = world()
    flat = np.zeros(n * BIG, np.float32)
    outs = list(np.split(flat, n))
    dist.all_gather(outs, piece(me, BIG))
    np.testing.assert_array_equal(flat, np.concatenate([piece(r, BIG) for r in range(n)]))


def test_all_gather_list_into_chunks_needs_no_receive_buffer():
    n, me = world()
    g = dist.new_group(list(range(n)), group_desc="chunks_direct")
    flat = np.zeros(n * BIG, np.float32)
    dist.all_gather(list(flat.reshape(n, BIG)), piece(me, BIG), group=g)
    np.testing.assert_array_equal(flat, np.concatenate([piece(r, BIG) for r in range(n)]))
    if g.rank_ >= 0:
        assert g._gather_buf is None  # MPI wrote the chunks' own memory


def test_all_gather_list_into_chunks_out_of_order_are_not_taken_whole():
    n, me = world()
    flat = np.zeros(n * BIG, np.float32)
    outs = list(flat.reshape(n, BIG))[::-1]
    dist.all_gather(outs, piece(me, BIG))
    for r in range(n):
        np.testing.assert_array_equal(outs[r], piece(r, BIG))


def test_all_gather_list_with_the_input_one_of_the_entries():
    """torch's idiom ``tensor is tensor_list[rank]``: MPI forbids the aliased buffers, so the
    send side is copied; every entry, this rank's included, ends right."""
    n, me = world()
    outs = [np.zeros(BIG, np.float32) for _ in range(n)]
    outs[me][:] = piece(me, BIG)
    dist.all_gather(outs, outs[me])
    for r in range(n):
        np.testing.assert_array_equal(outs[r], piece(r, BIG))


def test_all_gather_list_into_strided_entries():
    n, me = world()
    backing = [np.full((BIG, 2), -1.0, np.float32) for _ in range(n)]
    outs = [b[:, 0] for b in backing]  # every other element: staged and written back
    dist.all_gather(outs, piece(me, BIG))
    for r in range(n):
        np.testing.assert_array_equal(backing[r][:, 0], piece(r, BIG))
        assert (backing[r][:, 1] == -1.0).all()  # the gaps are untouched


def test_all_gather_list_async():
    n, me = world()
    outs = [np.zeros(BIG, np.float32) for _ in range(n)]
    work = dist.all_gather(outs, piece(me, BIG), async_op=True)
    work.wait()
    for r in range(n):
        np.testing.assert_array_equal(outs[r], piece(r, BIG))


def test_all_gather_list_of_empty_tensors():
    n, _ = world()
    outs = [np.zeros(0, np.float32) for _ in range(n)]
    dist.all_gather(outs, np.zeros(0, np.float32))
    assert [o.shape for o in outs] == [(0,)] * n


def test_all_gather_list_allocates_no_output_sized_temporary_twice():
    """4 MiB gathered into separate arrays, twice: the second call's Python-side allocations
    stay far below one entry (it reuses the first call's flat receive buffer)."""
    n, me = world()
    count = (4 << 20) // 4 // n
    outs = [np.zeros(count, np.float32) for _ in range(n)]
    inp = piece(me, count)
    dist.all_gather(outs, inp)  # warm: any one-time setup
    tracemalloc.start()
    try:
        dist.all_gather(outs, inp)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < count * 4 // 8, f"all_gather allocated {peak} B for {count * 4} B entries"
    for r in range(n):
        np.testing.assert_array_equal(outs[r], piece(r, count))


def test_all_gather_list_against_torch():
    """The gathered list equals what torch.cat of the pieces gives (torch as the oracle of
    the layout; torch.distributed itself is not needed)."""
    torch = pytest.importorskip("torch", reason="torch is not installed: no oracle")
    n, me = world()
    outs = [mpitensor.zeros(2, 5) for _ in range(n)]
    dist.all_gather(outs, mpitensor.tensor(piece(me, 10).reshape(2, 5)))
    want = torch.cat([torch.from_numpy(piece(r, 10).reshape(2, 5)) for r in range(n)])
    np.testing.assert_array_equal(np.concatenate([o.numpy() for o in outs]), want.numpy())


@pytest.mark.mpi(min_size=2)
def test_a_large_mismatch_is_still_caught():
    """The agreement check, now posted before the data, still names a shape that differs on
    one rank (same byte count, so MPI itself would not notice)."""
    n, me = world()
    g = dist.new_group(list(range(n)), group_desc="large_mismatch")
    inp = np.ones(BIG, np.float32) if me == 0 else np.ones((1, BIG), np.float32)
    out = np.zeros(n * BIG, np.float32)
    with pytest.raises(CollectiveMismatchError):
        dist.all_gather_into_tensor(out, inp, group=g)
    with pytest.raises(PeerFailedError, match="unusable"):
        dist.all_reduce(np.ones(1), group=g)


@pytest.mark.parametrize("op", ["all_gather_into_tensor", "reduce_scatter_tensor",
                                "all_reduce", "all_gather"])
def test_large_calls_settle_without_waiting(op):
    """With the fingerprint posted before the data, a finished all-to-everyone call finds
    every member's fingerprint in place: it leaves no pending token, and its numbers are
    right."""
    n, me = world()
    g = _world._pg(None)
    inp = piece(me, BIG)
    if op == "all_gather_into_tensor":
        out = np.zeros(n * BIG, np.float32)
        dist.all_gather_into_tensor(out, inp)
        np.testing.assert_array_equal(out, np.concatenate([piece(r, BIG) for r in range(n)]))
    elif op == "reduce_scatter_tensor":
        full = np.tile(inp, n)
        out = np.zeros(BIG, np.float32)
        dist.reduce_scatter_tensor(out, full)
        np.testing.assert_array_equal(out, sum(piece(r, BIG) for r in range(n)))
    elif op == "all_reduce":
        dist.all_reduce(inp)
        np.testing.assert_array_equal(inp, sum(piece(r, BIG) for r in range(n)))
    else:
        outs = [np.zeros(BIG, np.float32) for _ in range(n)]
        dist.all_gather(outs, inp)
        for r in range(n):
            np.testing.assert_array_equal(outs[r], piece(r, BIG))
    assert g.health.fp_tok is None
    MPI.COMM_WORLD.Barrier()


class _LateIallgather:
    """A communicator whose ``Iallgather`` posts 0.3 s late (a rank descheduled between its
    fingerprint and its data); everything else is the real communicator's."""

    def __init__(self, comm):
        self._comm = comm

    def __getattr__(self, name):
        return getattr(self._comm, name)

    def Iallgather(self, *args):
        import time
        time.sleep(0.3)
        return self._comm.Iallgather(*args)


@pytest.mark.parametrize("path", ["mpi", "messages"])
def test_a_mismatch_found_while_the_data_is_posted_keeps_its_request(monkeypatch, path):
    """A mismatch seen in the slots while this rank still waits for its data (the peer wrote
    its fingerprint and was descheduled before posting its data) ends the call with the data
    operation still posted in MPI. That request and its buffers must outlive the call: mpi4py
    would free a collected request, which MPI forbids for a collective in flight (in a CI run
    MPICH then corrupted the heap and a later test crashed in NumPy), and the buffers would go
    back to the allocator while MPI still writes them."""
    from mpitensor.distributed.health import posted

    n, me = world()
    if n < 2:
        pytest.skip("needs a peer")
    # the case is MPI's posted request: the group takes the MPI path whatever the suite forces
    monkeypatch.setenv("MPITENSOR_SHM_COLLECTIVES", "off")
    g = dist.new_group(list(range(n)), group_desc="late_data")
    pg = _world._pg(g)
    if pg.health.fp_node is None:
        pytest.skip("the group has no shared slots (spans machines)")
    monkeypatch.setattr(pg, "pers_max", -1)  # nonblocking Iallgather (persistent: Start)
    if path == "messages":  # (a list's gather of this size takes gather_p2p's; the switch off,
        # the group never asked whether it spans machines: it does not)
        monkeypatch.setattr(pg, "one_node", True)
    assert gather_p2p.takes(pg, n * BIG * 4) == (path == "messages")
    if me == n - 1 and path == "mpi":  # its fingerprint goes out at once, its data 0.3 s later
        monkeypatch.setattr(pg, "comm", _LateIallgather(pg.comm))
    elif me == n - 1:
        real = gather_p2p.start
        monkeypatch.setattr(gather_p2p, "start", lambda *a: time.sleep(0.3) or real(*a))
    kept = posted.count()
    inp = np.ones((1, BIG), np.float32) if me == n - 1 else np.ones(BIG, np.float32)
    out = np.zeros(n * BIG, np.float32)
    # the late rank may hear that the group broke before it reads the slots itself
    with pytest.raises(CollectiveMismatchError if me != n - 1
                       else (CollectiveMismatchError, PeerFailedError)):
        if path == "mpi":
            dist.all_gather_into_tensor(out, inp, group=g)
        else:  # (all_gather_into_tensor stays with MPI: a list's gather takes the messages)
            dist.all_gather(list(out.reshape(n, 1, BIG) if me == n - 1
                                 else out.reshape(n, BIG)), inp, group=g)
    if me != n - 1:
        assert posted.count() > kept  # raised with its data in flight: the request is kept
    del out, inp
    import gc
    gc.collect()
    # memory the freed buffers went back to, then MPI calls that drive its progress engine
    # (which finishes the orphaned all_gather on every rank): nothing is overwritten
    junk = [np.full(BIG * 2, 7.0, np.float32) for _ in range(32)]
    for _ in range(3):
        x = np.full(BIG, float(me), np.float32)
        MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, x)
        np.testing.assert_array_equal(x, sum(range(n)))
    assert all((j == 7.0).all() for j in junk)
    MPI.COMM_WORLD.Barrier()
