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
@pytest.mark.parametrize("count", [4, 1 << 20])
def test_collective_wait_sleeps(count):
    """Also for a call of 8 MiB, whose wait yields for its first 34 ms (its bytes at
    backoff.TRANSFER_RATE) and sleeps after that as any other (the path's first call,
    which may make the shared-memory engine and time it, comes before)."""
    n, r = dist.get_world_size(), dist.get_rank()
    t = np.full(count, r + 1.0)
    dist.all_reduce(np.zeros(count))
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


def test_a_large_call_yields_while_its_bytes_can_still_be_moving(monkeypatch):
    """A wait for a call of b bytes yields (MPI's schedule moves only while its ranks poll)
    until b / TRANSFER_RATE, where that is past the 2 ms of every wait, then sleeps as any
    wait does, the ramp counted from the wait's start."""
    calls = []
    monkeypatch.setattr(_backoff, "_yield", lambda: calls.append(("yield", 0.0)))
    monkeypatch.setattr(_backoff, "_sleep", lambda s: calls.append(("sleep", s)))
    nbytes = 8 << 20
    window = nbytes / _backoff.TRANSFER_RATE
    assert window > _backoff._YIELD_S
    b = _backoff.Backoff(0.0, nbytes=nbytes)
    b.pause(0.003, 1e-6)  # past 2 ms: a small call's wait would sleep here
    b.pause(window * 0.99, 1e-6)
    b.pause(window * 1.01, 1e-6)
    assert calls == [("yield", 0.0), ("yield", 0.0),
                     ("sleep", pytest.approx(min(_backoff._SLEEP_MAX_S,
                                                 window * 1.01 * _backoff._SLEEP_FRACTION)))]
    calls.clear()
    small = _backoff.Backoff(0.0, nbytes=4096)  # under 2 ms' worth: the usual schedule
    small.pause(0.003, 1e-6)
    assert calls == [("sleep", pytest.approx(0.003 * _backoff._SLEEP_FRACTION))]
    passive = _backoff.Backoff(0.0, passive=True, nbytes=nbytes)  # shared-memory arrivals
    calls.clear()
    passive.pause(1e-4, 1e-6)
    assert calls[0][0] == "sleep"


def test_bytes_of_a_calls_buffers():
    W = _watchdog
    a, b = np.zeros(10, np.float32), np.zeros(3, np.float64)
    assert W.bytes_of(a) == 40 and W.bytes_of(memoryview(b)) == 24
    assert W.bytes_of((a, b)) == 40 and W.bytes_of([b, a]) == 40
    assert W.bytes_of(None) == 0 and W.bytes_of(()) == 0 and W.bytes_of(("x", 3)) == 0
    assert W.bytes_of(([a, "spec"], None)) == 40  # (an isend's: its spec and header)
    assert W.bytes_of([[[a]]]) == 0  # (no deeper)


@pytest.mark.mpi(min_size=2)
def test_the_paths_tell_the_wait_their_calls_bytes(monkeypatch):
    """Every blocking path on MPI's calls and a Work's wait hand the call's bytes to the
    backoff: rank 0 comes late, so the others' waits reach it. (A group with the
    shared-memory collectives off: their waits read flags, which the bytes do not concern.)"""
    seen, got = [], []

    class Recording(_backoff.Backoff):
        def __init__(self, t0, passive=False, nbytes=0, moves=True):
            seen.append(nbytes)
            super().__init__(t0, passive, nbytes, moves)

    monkeypatch.setenv("MPITENSOR_SHM_COLLECTIVES", "off")
    g = dist.new_group(list(range(dist.get_world_size())))
    monkeypatch.setattr(_watchdog, "Backoff", Recording)
    n, r = dist.get_world_size(), dist.get_rank()

    def late(what, call, expect):
        dist.barrier(group=g)
        seen.clear()
        if r == 0:
            time.sleep(0.05)
        call()
        if r != 0:
            got.append((what, max(seen, default=None), expect))

    x = np.ones(1 << 18, np.float32)  # 1 MiB
    late("all_reduce", lambda: dist.all_reduce(x, group=g), x.nbytes)
    late("async", lambda: dist.all_reduce(x, group=g, async_op=True).wait(), x.nbytes)
    xs = np.ones(1 << 19, np.float32)[::2]  # not contiguous: the general path
    late("general", lambda: dist.all_reduce(xs, group=g), xs.nbytes)
    out = np.empty(n * x.size, np.float32)
    late("all_gather", lambda: dist.all_gather_into_tensor(out, x, group=g), out.nbytes)
    y = np.empty_like(x)
    late("send/recv", lambda: (dist.send(x, 1) if r == 0 else
                               dist.recv(y, 0) if r == 1 else None), x.nbytes)
    late("irecv", lambda: (dist.send(x, 1) if r == 0 else
                           dist.irecv(y, 0).wait() if r == 1 else None), x.nbytes)
    z = mt.zeros(1 << 18)[::2]  # not contiguous: irecv's general path
    late("irecv, staged", lambda: (dist.send(np.ones(1 << 17, np.float32), 1) if r == 0 else
                                   dist.irecv(z, 0).wait() if r == 1 else None), z.nbytes)
    if r > 1:
        del got[-3:]  # (no part in the messages)
    dist.destroy_process_group(g)
    assert (x == n ** 2).all() and (xs == n).all() and (out == n ** 2).all()
    assert r == 0 or all(seen_ == expect for _, seen_, expect in got), got


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
