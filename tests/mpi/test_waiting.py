"""Waiting costs nothing: a rank blocked on a slow peer leaves its core to the ranks that work.

Issue 9 §2: after a short spin and 2 ms of yielding, a waiting rank backs off to sleeps of up to
1 ms (``backoff.Backoff``). Each scenario has rank 0 sleep ``DELAY`` seconds before its part,
while the other ranks wait in the call and measure their own CPU time (all threads of the
process). Every rank checks the values it got.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

import mpitensor as mt
import mpitensor.distributed as dist
from mpitensor.distributed.health import backoff as _backoff
from mpitensor.distributed.health import watchdog as _watchdog

DELAY = 1.0
CPU_LIMIT = 0.2  # seconds of CPU for DELAY seconds of waiting (measured: ~0.03)


def _waited(call) -> "tuple[float, float]":
    """(wall, cpu) seconds that ``call`` took on this rank."""
    c0, w0 = time.process_time(), time.perf_counter()
    call()
    return time.perf_counter() - w0, time.process_time() - c0


def _check(wall: float, cpu: float, what: str) -> None:
    if dist.get_rank() == 0:
        return
    assert wall >= 0.8 * DELAY, f"{what}: did not wait ({wall:.2f} s)"
    assert cpu < CPU_LIMIT, f"{what}: {cpu:.3f} s of CPU over {wall:.2f} s of waiting"


@pytest.mark.mpi(min_size=2)
def test_collective_wait_sleeps():
    n, r = dist.get_world_size(), dist.get_rank()
    t = np.full(4, r + 1.0)
    dist.barrier()

    def call():
        if r == 0:
            time.sleep(DELAY)
        dist.all_reduce(t)

    wall, cpu = _waited(call)
    assert (t == n * (n + 1) / 2).all()
    _check(wall, cpu, "all_reduce")


@pytest.mark.mpi(min_size=2)
def test_recv_and_work_wait_sleep():
    n, r = dist.get_world_size(), dist.get_rank()
    dist.barrier()
    if r == 0:
        time.sleep(DELAY)
        for peer in range(1, n):
            dist.send(mt.full((3,), float(peer)), peer)
        time.sleep(DELAY)
        for peer in range(1, n):
            dist.send(mt.full((3,), -float(peer)), peer)
        return
    x = mt.zeros(3)
    wall, cpu = _waited(lambda: dist.recv(x, 0))
    assert (x.numpy() == r).all()
    _check(wall, cpu, "recv")
    y = mt.zeros(3)
    work = dist.irecv(y, 0)
    wall, cpu = _waited(lambda: work.wait(timeout=60))  # an explicit timeout: the other path
    assert (y.numpy() == -r).all()
    _check(wall, cpu, "irecv().wait(timeout=60)")


def test_backoff_schedule(monkeypatch):
    """Yield for 2 ms, then sleep a growing fraction of the wait, capped at 1 ms; a slow Test
    (data moved) earns a short window of yielding without restarting the ramp."""
    calls = []
    monkeypatch.setattr(_backoff, "_yield", lambda: calls.append(("yield", 0.0)))
    monkeypatch.setattr(_backoff, "_sleep", lambda s: calls.append(("sleep", s)))
    b = _backoff.Backoff(0.0)
    b.pause(0.001, 1e-6)
    b.pause(0.010, 1e-6)
    b.pause(0.500, 1e-6)
    b.pause(0.600, 5e-5)   # a busy Test: yield ...
    b.pause(0.6001, 1e-6)  # ... for the window after it
    b.pause(0.601, 1e-6)   # then back to the capped sleep, not to the start of the ramp
    assert calls == [("yield", 0.0), ("sleep", pytest.approx(0.010 * _backoff._SLEEP_FRACTION)),
                     ("sleep", _backoff._SLEEP_MAX_S), ("yield", 0.0), ("yield", 0.0),
                     ("sleep", _backoff._SLEEP_MAX_S)]


def test_spin_is_skipped_only_where_ranks_outnumber_their_cpus():
    """The node's CPUs are the union of its ranks' affinities: four ranks bound one to a core
    each on four cores are not oversubscribed, four unbound ranks on two cores are."""
    W = _watchdog
    saved = W._SPIN_S
    try:
        W.set_node_load(4, 2)
        assert W._SPIN_S == 0.0
        W.set_node_load(4, 4)
        assert W._SPIN_S > 0
        W.set_node_load(1, 2)
        assert W._SPIN_S > 0
    finally:
        W._SPIN_S = saved


def test_work_dropped_unfinished_is_finished_by_mpi_not_freed():
    """torch programs often drop an isend's or an async collective's work without wait(): the
    operation must still complete, with its buffers alive until it does (mpi4py frees a
    collected request, which MPI forbids for a collective in flight), and the program's
    later calls must see the right numbers."""
    import gc

    from mpitensor.distributed.health import posted

    n, me = dist.get_world_size(), dist.get_rank()
    if n < 2:
        pytest.skip("needs a peer")
    gc.collect()  # earlier tests' garbage (works of groups they broke) is dropped now, not
    gc.disable()  # during this test: what is dropped below is this test's own
    try:
        _drop_works_then_check(n, me, posted)
    finally:
        gc.enable()


def _drop_works_then_check(n, me, posted):
    import time

    from mpi4py import MPI

    earlier = [e[0] for e in posted._dropped]  # dropped by earlier tests (broken groups)
    if me == 0:
        time.sleep(0.2)  # the others' async calls are posted and dropped before rank 0 comes
    for _ in range(3):
        dist.all_reduce(np.full(1 << 15, 1.0, np.float32), async_op=True)  # dropped at once
    if me == 0:
        dist.isend(np.arange(1 << 15, dtype=np.float64), dst=1, tag=91)  # dropped unfinished
    junk = [np.full(1 << 16, 5.0) for _ in range(16)]
    if me == 1:
        got = np.zeros(1 << 15)
        dist.recv(got, src=0, tag=91)
        np.testing.assert_array_equal(got, np.arange(1 << 15, dtype=np.float64))
    x = np.full(8, float(me + 1))
    dist.all_reduce(x)
    np.testing.assert_array_equal(x, n * (n + 1) / 2)
    assert all((j == 5.0).all() for j in junk)
    # MPI finishes the dropped operations as the ranks go on calling it; once finished,
    # they are let go
    for _ in range(2000):
        posted.sweep()
        mine = [e for e in posted._dropped if not any(e[0] is r for r in earlier)]
        left = MPI.COMM_WORLD.allreduce(len(mine))
        if not left:
            break
    assert left == 0
