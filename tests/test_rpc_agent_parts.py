"""The RPC agent's parts that need no MPI job: its worker pool, its liveness checks, and the
pickled function references it keeps (``_pool``, ``_liveness``, ``_wire``)."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import threading
import time
import types

import pytest

from mpitensor.distributed.rpc import _liveness, _pool, _wire


# ------------------------------------------------------------------------------ worker pool
def test_pool_runs_tasks_on_at_most_size_threads() -> None:
    pool = _pool.WorkerPool(2, "test-pool")
    gate = threading.Event()
    done: list = []
    threads: set = set()
    lock = threading.Lock()

    def task(i: int) -> None:
        with lock:
            threads.add(threading.current_thread().name)
        gate.wait(5)
        with lock:
            done.append(i)

    for i in range(6):
        pool.submit(task, i)
    time.sleep(0.05)
    assert done == [] and len(pool.workers) == 2 and len(pool.queue) == 4
    gate.set()
    pool.shutdown(wait=True)
    assert sorted(done) == list(range(6))
    assert len(threads) == 2 and all(t.startswith("test-pool_") for t in threads)
    assert pool.workers == []
    with pytest.raises(RuntimeError, match="shut down"):
        pool.submit(task, 7)


def test_pool_reuses_idle_threads_and_survives_a_raising_task() -> None:
    pool = _pool.WorkerPool(4, "test-pool")
    seen: list = []
    evt = threading.Event()

    def boom() -> None:
        raise ValueError("task failure")

    pool.submit(boom)  # logged; the thread goes on serving
    time.sleep(0.1)
    for _ in range(20):
        evt.clear()
        pool.submit(lambda: (seen.append(threading.get_ident()), evt.set()))
        assert evt.wait(5)
        time.sleep(0.002)  # the worker goes idle before the next submit
    assert len(set(seen)) == 1  # the one idle thread took every task
    assert len(pool.workers) == 1
    pool.shutdown(wait=True)


def test_pool_shutdown_cancels_queued_tasks() -> None:
    pool = _pool.WorkerPool(1, "test-pool")
    gate = threading.Event()
    ran: list = []
    pool.submit(gate.wait, 5)
    pool.submit(ran.append, 1)
    pool.shutdown(wait=False, cancel_futures=True)
    gate.set()
    deadline = time.monotonic() + 5
    while pool.workers and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ran == [] and pool.workers == []
    with pytest.raises(ValueError):
        _pool.WorkerPool(0, "x")


def test_pool_hand_off_is_fast() -> None:
    """A submit to an idle thread wakes that thread directly (ThreadPoolExecutor: ~75 µs)."""
    pool = _pool.WorkerPool(1, "test-pool")
    evt = threading.Event()
    pool.submit(evt.set)
    evt.wait(5)
    lags = []
    for _ in range(200):
        time.sleep(0.001)
        evt.clear()
        t0 = time.perf_counter()
        pool.submit(lambda t0=t0: (lags.append(time.perf_counter() - t0), evt.set()))
        evt.wait(5)
    pool.shutdown()
    lags.sort()
    assert lags[len(lags) // 2] < 2e-3, f"median hand-off {lags[len(lags) // 2] * 1e6:.0f} µs"


# ------------------------------------------------------------------------------ liveness
@pytest.mark.skipif(_liveness.identity() is None, reason="no /proc process table here")
def test_pid_checks() -> None:
    space, pid, start = _liveness.identity()
    assert pid == os.getpid() and space
    assert not _liveness.pid_dead(pid, start)
    assert _liveness.pid_dead(pid, start + 1)  # same pid, another process: reused
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child_start = _liveness._stat(child.pid)[1]
    child.wait()
    assert _liveness.pid_dead(child.pid, child_start)  # reaped: gone


def test_peer_watch_local_peers_and_heartbeat(monkeypatch: pytest.MonkeyPatch) -> None:
    me = ("boot/pid:[1]", 100, 5)
    idents = [me, ("boot/pid:[1]", 101, 6), ("other-host", 102, 7), None]
    watch = _liveness.PeerWatch(0, idents)
    assert watch.local == {1: (101, 6)}  # the same PID namespace of the same boot only
    dead_pids = set()
    monkeypatch.setattr(_liveness, "pid_dead", lambda pid, start: pid in dead_pids)
    t = 1000.0
    assert watch.check(t, [1, 2, 3]) == ([], [])
    assert watch.check(t + 0.5, [1, 2, 3]) == ([], [])
    pings, dead = watch.check(t + _liveness.PING_AFTER_S, [1, 2, 3])
    assert pings == [2, 3] and dead == []  # silent heartbeat peers are pinged, once
    watch.seen[2] = 1  # peer 2 answered (any message counts)
    assert watch.check(t + 2, [1, 2, 3]) == ([], [])
    later = t + _liveness.PING_AFTER_S + _liveness.SILENCE_S
    pings, dead = watch.check(later, [1, 2, 3])
    assert pings == [2]  # silent again since its answer: pinged again
    assert [r for r, _ in dead] == [3] and "liveness probe" in dead[0][1]
    dead_pids.add(101)
    pings, dead = watch.check(later + 1, [1, 2])
    assert [r for r, _ in dead] == [1] and "pid 101" in dead[0][1]
    # a peer no longer waited on is forgotten: waiting on it again starts afresh
    assert watch.check(later + 2, []) == ([], [])
    assert watch.quiet_since == {} and watch.pinged == {}


def test_peer_watch_without_pid_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_liveness, "PID_CHECK", False)
    idents = [("s", 1, 1), ("s", 2, 2)]
    assert _liveness.PeerWatch(0, idents).local == {}


# ------------------------------------------------------------------------------ function refs
def _module_with(name: str) -> types.ModuleType:
    mod = types.ModuleType(name)
    sys.modules[name] = mod
    exec("def f(x):\n    return x + 1\n", mod.__dict__)
    return mod


def test_func_refs_follow_rebinding() -> None:
    mod = _module_with("_mt_rpc_ref_test")
    refs: dict = {}
    funcs: dict = {}
    try:
        old = mod.f
        ref = _wire.func_ref(old, refs)
        assert ref == pickle.dumps(old, protocol=5) and _wire.func_ref(old, refs) is ref
        assert _wire.load_func(ref, funcs) is old and _wire.load_func(ref, funcs) is old
        exec("def f(x):\n    return x + 2\n", mod.__dict__)  # redefined (or reloaded)
        assert _wire.func_ref(old, refs) is None  # pickled as usual, which refuses it
        with pytest.raises(pickle.PicklingError):
            pickle.dumps(old)
        assert _wire.load_func(ref, funcs) is mod.f and mod.f(1) == 3  # looked up afresh
        assert _wire.func_ref(lambda: 1, refs) is None  # not a module-level function
        assert _wire.func_ref(len, refs) == pickle.dumps(len, protocol=5)  # builtins too
        assert _wire.func_ref([].append, refs) is None  # a bound method: pickled as usual
    finally:
        del sys.modules["_mt_rpc_ref_test"]
