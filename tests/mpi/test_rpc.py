"""``mpitensor.distributed.rpc``: calls, futures, RRefs, errors and shutdown, on every rank.

Each test starts RPC on every rank (``rpc_world``) and shuts it down gracefully at the end, so
a test leaves no work behind for the next. Functions run remotely are defined at module level
(RPC sends functions by reference). Every rank asserts its own results.
"""

from __future__ import annotations

import gc
import pickle
import threading
import time
import weakref

import numpy as np
import pytest
from mpi4py import MPI

import mpitensor as torch
import mpitensor.distributed.rpc as rpc
from mpitensor.distributed.rpc import _state
from mpitensor.errors import DistributedTimeoutError, MpiTensorError, PeerFailedError

_COMM = MPI.COMM_WORLD.Dup()  # the tests' own coordination, apart from RPC's traffic
RANK = _COMM.Get_rank()
SIZE = _COMM.Get_size()


def _quiet_barrier() -> None:
    """A barrier that sleeps while it waits, so the ranks' RPC threads keep the cores."""
    req = _COMM.Ibarrier()
    t0 = time.monotonic()
    while not req.Test():
        assert time.monotonic() - t0 < 30, "barrier: another rank did not arrive in 30 s"
        time.sleep(1e-3)


@pytest.fixture
def rpc_world():
    """RPC started on every rank as worker<rank>; shut down gracefully afterwards."""
    rpc.init_rpc(f"worker{RANK}")
    yield RANK, SIZE
    agent = _state.agent
    if agent is not None and agent.running:
        try:
            rpc.shutdown(timeout=30)
        except Exception:
            if _state.agent is not None:
                rpc.shutdown(graceful=False)
            raise


# ------------------------------------------------------------------------------ remote functions
def add(a, b):
    return a + b


def whoami():
    return rpc.get_worker_info().name


def relay(hops, x):
    """Call the next rank with one hop fewer; the last adds its rank (A -> B -> C ...)."""
    me = rpc.get_worker_info().id
    if hops == 0:
        return x + [me]
    return rpc.rpc_sync((me + 1) % SIZE, relay, args=(hops - 1, x + [me]))


def square(i):
    return i * i


def echo(x):
    return x


def checksum(a):
    return float(np.asarray(a, dtype=np.float64).sum()), type(a).__name__, a.shape


def negate_inplace(a):
    a *= -1  # a received array is writable and its own
    return a


def fail_value(msg):
    raise ValueError(msg)


class OddError(Exception):
    """An exception whose constructor takes two arguments."""

    def __init__(self, code, detail):
        super().__init__(code, detail)
        self.code = code


def fail_odd():
    raise OddError(7, "odd")


def nap(seconds, value=None):
    time.sleep(seconds)
    return value


def make_lock():
    return threading.Lock()


class Counter:
    """An object that lives on its owner and is used through RRef proxies."""

    def __init__(self, start=0):
        self.n = start

    def add(self, k=1):
        self.n += k
        return self.n

    def value(self):
        return self.n

    @rpc.functions.async_execution
    def add_later(self, k):
        fut = rpc.Future()
        threading.Timer(0.01, lambda: fut.set_result(self.add(k))).start()
        return fut


FREED: dict = {}  # on each rank: tag -> how many values of class Tracked were freed there
KEPT = {}  # on each rank: RRefs a test asked it to hold


class Tracked:
    def __init__(self, payload, tag=""):
        self.payload = payload
        weakref.finalize(self, _count_freed, tag)


def _count_freed(tag):
    FREED[tag] = FREED.get(tag, 0) + 1


def freed_count(tag):
    gc.collect()
    return FREED.get(tag, 0)


def keep(key, rref):
    KEPT[key] = rref
    return rref.is_owner()


def drop(key):
    KEPT.pop(key, None)
    gc.collect()
    return True


def fetch_through(rref):
    """A worker that got an RRef passed as an argument copies its value."""
    return rref.to_here()


def rref_local_sum(rref):
    """Runs on the owner: the RRef arrives as the owner's own."""
    return rref.is_owner(), float(np.sum(rref.local_value().payload))


def owned_count():
    gc.collect()
    return len(rpc._get_current_rpc_agent().owned)


@rpc.functions.async_execution
def async_add_via(to, a, b):
    """Replies when a nested call to ``to`` has answered (no thread held meanwhile)."""
    return rpc.rpc_async(to, add, args=(a, b)).then(lambda f: f.wait() * 10)


@rpc.functions.async_execution
def async_not_a_future():
    return 3


# ------------------------------------------------------------------------------ tests
def test_not_initialized():
    with pytest.raises(rpc.RpcNotInitializedError, match="init_rpc"):
        rpc.rpc_sync(0, add, args=(1, 2))
    with pytest.raises(MpiTensorError):
        rpc.get_worker_info()
    with pytest.raises(rpc.RpcNotInitializedError):
        rpc.shutdown()


def test_init_checks_arguments():
    with pytest.raises(ValueError, match="contradicts MPI"):
        rpc.init_rpc(f"worker{RANK}", rank=RANK + 1)
    with pytest.raises(ValueError, match="contradicts MPI"):
        rpc.init_rpc(f"worker{RANK}", world_size=SIZE + 1)
    with pytest.raises(TypeError):
        rpc.init_rpc("")
    with pytest.raises(ValueError):
        rpc.init_rpc("bad name!")
    with pytest.raises(ValueError, match="num_worker_threads"):
        rpc.TensorPipeRpcBackendOptions(num_worker_threads=0)
    assert _state.agent is None


@pytest.mark.mpi(min_size=2)
def test_init_rejects_duplicate_names():
    with pytest.raises(ValueError, match="unique"):
        rpc.init_rpc("same")
    assert _state.agent is None


def test_worker_info(rpc_world):
    rank, size = rpc_world
    me = rpc.get_worker_info()
    assert me == rpc.WorkerInfo(f"worker{rank}", rank)
    assert (me.name, me.id) == (f"worker{rank}", rank)
    assert repr(me) == f"WorkerInfo(id={rank}, name=worker{rank})"
    assert pickle.loads(pickle.dumps(me)) == me and hash(me) == hash(rpc.WorkerInfo(me.name, rank))
    for r in range(size):
        assert rpc.get_worker_info(f"worker{r}").id == r
    assert [w.name for w in rpc._get_worker_infos()] == [f"worker{r}" for r in range(size)]
    with pytest.raises(RuntimeError, match="already initialized"):
        rpc.init_rpc(f"worker{rank}")


def test_init_with_options():
    opts = rpc.TensorPipeRpcBackendOptions(num_worker_threads=2, rpc_timeout=5,
                                           init_method="tcp://unused:1")
    rpc.init_rpc(f"w{RANK}", backend=rpc.BackendType.TENSORPIPE, rank=RANK, world_size=SIZE,
                 rpc_backend_options=opts)
    try:
        agent = rpc._get_current_rpc_agent()
        assert agent.rpc_timeout == 5.0 and agent.num_worker_threads == 2
        assert rpc.rpc_sync(f"w{(RANK + 1) % SIZE}", whoami) == f"w{(RANK + 1) % SIZE}"
    finally:
        rpc.shutdown()


def test_rpc_sync_and_async(rpc_world):
    rank, size = rpc_world
    peer = (rank + 1) % size
    t = rpc.rpc_sync(f"worker{peer}", torch.add, args=(torch.ones(2), 3))
    assert isinstance(t, torch.Tensor) and t.tolist() == [4.0, 4.0]
    assert rpc.rpc_sync(peer, whoami) == f"worker{peer}"  # by id
    assert rpc.rpc_sync(rpc.get_worker_info(f"worker{peer}"), add, kwargs={"a": 1, "b": 2}) == 3
    assert rpc.rpc_sync(rank, whoami) == f"worker{rank}"  # to itself
    fut = rpc.rpc_async(peer, add, args=(np.arange(3), 1))
    chained = fut.then(lambda f: f.wait().sum())
    seen = []
    fut.add_done_callback(lambda f: seen.append(f.value().tolist()))
    assert fut.wait().tolist() == [1, 2, 3] and fut.done()
    assert chained.wait() == 6
    assert seen == [[1, 2, 3]]
    futs = [rpc.rpc_async(r, whoami) for r in range(size)]
    assert rpc.wait_all(futs) == [f"worker{r}" for r in range(size)]
    assert [f.wait() for f in rpc.collect_all(futs).wait()] == [f"worker{r}" for r in range(size)]


@pytest.mark.mpi(min_size=3)
def test_nested_calls(rpc_world):
    rank, size = rpc_world
    # A -> B -> C (-> D at 4 ranks): each hop is a blocking rpc_sync made inside a served call
    path = rpc.rpc_sync((rank + 1) % size, relay, args=(size - 2, [rank]))
    assert path == [(rank + i) % size for i in range(size)]


def test_many_concurrent_async(rpc_world):
    rank, size = rpc_world
    peer = (rank + 1) % size
    futs = [rpc.rpc_async(peer, square, args=(i,)) for i in range(1000)]
    assert [f.wait() for f in futs] == [i * i for i in range(1000)]


def test_rpc_sync_from_many_threads(rpc_world):
    """User threads calling rpc_sync at once: one at a time drives progress and sends before
    it registers its call; the others register first and sleep until their reply is met for
    them (by another caller, a pool thread or the progress thread). Every result is right."""
    rank, size = rpc_world
    peer = (rank + 1) % size
    results, errors = {}, []

    def worker(t):
        try:
            results[t] = [rpc.rpc_sync(peer, add, args=(t, i)) for i in range(300)]
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert not errors, errors
    assert results == {t: [t + i for i in range(300)] for t in range(8)}


def test_rpc_sync_argument_kinds(rpc_world):
    """Plain arguments take the short pickling path; anything else (keyword arguments, a
    list, an array, a float subclass) the general one: same results either way."""
    rank, size = rpc_world
    peer = (rank + 1) % size

    class Num(float):
        pass

    assert rpc.rpc_sync(peer, add, args=(2, 3)) == 5
    assert rpc.rpc_sync(peer, add, args=("a", "b")) == "ab"
    assert rpc.rpc_sync(peer, add, args=(b"x", b"y")) == b"xy"
    assert rpc.rpc_sync(peer, echo, args=(None,)) is None
    assert rpc.rpc_sync(peer, add, args=[1, 2]) == 3  # a list of arguments
    assert rpc.rpc_sync(peer, add, kwargs={"a": 1.5, "b": 2}) == 3.5
    assert rpc.rpc_sync(peer, add, args=(1,), kwargs={"b": 2}) == 3
    assert rpc.rpc_sync(peer, echo, args=([1, (2, 3)],)) == [1, (2, 3)]
    got = rpc.rpc_sync(peer, echo, args=(np.arange(5.0),))
    assert got.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert rpc.rpc_sync(peer, echo, args=(True,)) is True
    with pytest.raises(TypeError, match="cannot be pickled"):
        rpc.rpc_sync(peer, echo, args=(Num(1.0),))  # a local class: refused before sending


def test_deadline_table_stays_small(rpc_world):
    """Answered calls leave no deadline behind for long (it would grow by 20,000 a second)."""
    rank, size = rpc_world
    agent = rpc._get_current_rpc_agent()
    for i in range(3000):
        assert rpc.rpc_sync((rank + 1) % size, square, args=(i,)) == i * i
    assert len(agent.heap) < 1100, len(agent.heap)


@pytest.mark.mpi(min_size=2)
def test_large_array_zero_copy(rpc_world):
    rank, size = rpc_world
    peer = (rank + 1) % size
    a = np.arange(16 << 20, dtype=np.float32)  # 64 MiB
    stats = rpc._get_current_rpc_agent().stats
    before = dict(stats)
    total, kind, shape = rpc.rpc_sync(peer, checksum, args=(a,))
    assert (total, kind, shape) == (float(a.astype(np.float64).sum()), "ndarray", a.shape)
    back = rpc.rpc_sync(peer, negate_inplace, args=(a,))
    assert back.dtype == a.dtype and back.shape == a.shape and back.flags.writeable
    assert np.array_equal(back, -a) and a[1] == 1.0  # the caller's array is untouched
    t = torch.from_numpy(a[: 1 << 20].copy())
    tback = rpc.rpc_sync(peer, echo, args=(t,))
    assert isinstance(tback, torch.Tensor) and torch.equal(tback, t)
    # the arrays travelled as buffer messages, not through the pickle
    assert stats["oob_bytes"] - before["oob_bytes"] >= 2 * a.nbytes + t.numel() * 4
    assert stats["inband_bytes"] - before["inband_bytes"] < 64 << 10


def test_remote_exception_with_traceback(rpc_world):
    rank, size = rpc_world
    peer = (rank + 1) % size
    with pytest.raises(ValueError) as info:
        rpc.rpc_sync(peer, fail_value, args=("bad input",))
    text = str(info.value)
    assert "bad input" in text and "Traceback" in text and "fail_value" in text
    assert f"worker{peer}" in text
    assert isinstance(info.value.__cause__, rpc.RemoteTraceback)
    fut = rpc.rpc_async(peer, fail_value, args=("later",))
    with pytest.raises(ValueError, match="later"):
        fut.wait()
    with pytest.raises(OddError) as info2:  # a constructor of its own: the same exception
        rpc.rpc_sync(peer, fail_odd)
    assert info2.value.code == 7 and "fail_odd" in str(info2.value.__cause__)
    with pytest.raises(TypeError, match="must return a Future"):
        rpc.rpc_sync(peer, async_not_a_future)


def test_timeouts(rpc_world):
    rank, size = rpc_world
    peer = (rank + 1) % size
    t0 = time.monotonic()
    with pytest.raises(DistributedTimeoutError, match="timeout") as info:
        rpc.rpc_sync(peer, nap, args=(0.6,), timeout=0.1)
    assert time.monotonic() - t0 < 0.5
    assert isinstance(info.value, TimeoutError) and f"worker{peer}" in str(info.value)
    fut = rpc.rpc_async(peer, nap, args=(0.6,), timeout=0.1)
    with pytest.raises(TimeoutError):
        fut.wait()
    assert rpc.rpc_sync(peer, nap, args=(0.01, "ok"), timeout=0) == "ok"  # 0: no deadline
    rpc._set_rpc_timeout(0.1)  # the default deadline of later calls
    with pytest.raises(DistributedTimeoutError):
        rpc.rpc_sync(peer, nap, args=(0.6,))
    rref = rpc.remote(peer, nap, args=(0.6, "slow"))
    with pytest.raises(DistributedTimeoutError):
        rref.to_here(timeout=0.05)
    assert rref.to_here(timeout=5) == "slow"
    with pytest.raises(ValueError):
        rpc.rpc_sync(peer, add, args=(1, 2), timeout=-3)


def test_rref_basics(rpc_world):
    rank, size = rpc_world
    peer = (rank + 1) % size
    rref = rpc.remote(f"worker{peer}", torch.add, args=(torch.ones(2), 3))
    assert rref.to_here().tolist() == [4.0, 4.0]
    assert rref.owner() == rpc.get_worker_info(f"worker{peer}")
    assert rref.owner_name() == f"worker{peer}"
    assert rref.is_owner() == (peer == rank)
    assert rref.confirmed_by_owner()
    if peer != rank:
        with pytest.raises(RuntimeError, match="owner"):
            rref.local_value()
    # proxies call methods of the referenced object on its owner
    counter = rpc.remote(peer, Counter, args=(10,))
    assert counter.rpc_sync().add(5) == 15
    assert counter.rpc_async().add(k=2).wait() == 17
    assert counter.remote().value().to_here() == 17
    assert counter.rpc_sync().add_later(3) == 20  # an async_execution method
    assert counter.to_here().n == 20
    # an exception in the function remote() ran comes out of to_here()
    bad = rpc.remote(peer, fail_value, args=("in remote",))
    with pytest.raises(ValueError, match="in remote"):
        bad.to_here()
    # remote() to this worker: an owner RRef
    mine = rpc.remote(rank, Counter, args=(1,))
    assert mine.is_owner() and mine.local_value().add() == 2 and mine.to_here().n == 2
    # a local value wrapped in an RRef, used by another worker
    local = rpc.RRef(Tracked(np.ones(4)))
    assert local.is_owner() and local.owner().id == rank
    assert rpc.rpc_sync(peer, fetch_through, args=(local,)).payload.tolist() == [1.0] * 4
    with pytest.raises(RuntimeError, match="pickled"):
        pickle.dumps(rref)


@pytest.mark.mpi(min_size=2)
def test_rref_passed_around(rpc_world):
    rank, size = rpc_world
    owner, third = (rank + 1) % size, (rank + 2) % size
    rref = rpc.remote(owner, Tracked, args=(np.arange(5.0),))
    # to the owner itself: it sees its own RRef
    assert rpc.rpc_sync(owner, rref_local_sum, args=(rref,)) == (True, 10.0)
    # to a third worker (a fork): it copies the value from the owner
    got = rpc.rpc_sync(third, fetch_through, args=(rref,))
    assert got.payload.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]


@pytest.mark.mpi(min_size=2)
def test_rref_lifetime(rpc_world):
    rank, size = rpc_world
    owner = 1
    holder = 2 % size  # with 2 ranks: the creator keeps a second reference of its own
    tag = "lifetime"
    _quiet_barrier()
    base_freed = rpc.rpc_sync(owner, freed_count, args=(tag,))
    base_owned = rpc.rpc_sync(owner, owned_count)
    _quiet_barrier()
    if rank == 0:
        rref = rpc.remote(owner, Tracked, args=(np.zeros(10), tag))
        assert rref.to_here().payload.shape == (10,)
        # fork it to the holder, which keeps it
        assert rpc.rpc_sync(holder, keep, args=("t", rref)) == (holder == owner)
        assert rpc.rpc_sync(owner, owned_count) == base_owned + 1
        del rref
        gc.collect()
        time.sleep(0.05)
        # the holder's reference still keeps the value alive on the owner
        assert rpc.rpc_sync(owner, freed_count, args=(tag,)) == base_freed
        assert rpc.rpc_sync(holder, drop, args=("t",))
        deadline = time.monotonic() + 10
        while rpc.rpc_sync(owner, freed_count, args=(tag,)) == base_freed:
            assert time.monotonic() < deadline, "the owner never freed the value"
            time.sleep(0.01)
        assert rpc.rpc_sync(owner, freed_count, args=(tag,)) == base_freed + 1
        deadline = time.monotonic() + 10
        while rpc.rpc_sync(owner, owned_count) != base_owned:
            assert time.monotonic() < deadline, "the owner still counts the RRef"
            time.sleep(0.01)
        # many user RRefs created and dropped: every value is freed
        refs = [rpc.remote(owner, Tracked, args=(i, tag)) for i in range(20)]
        assert [r.to_here().payload for r in refs] == list(range(20))
        del refs
        gc.collect()
        deadline = time.monotonic() + 10
        while rpc.rpc_sync(owner, freed_count, args=(tag,)) != base_freed + 21:
            assert time.monotonic() < deadline, "values of deleted RRefs were kept"
            time.sleep(0.01)
    _quiet_barrier()


def test_async_execution(rpc_world):
    rank, size = rpc_world
    peer, other = (rank + 1) % size, (rank + 2) % size
    assert rpc.rpc_sync(peer, async_add_via, args=(other, 2, 3)) == 50
    assert rpc.rpc_async(peer, async_add_via, args=(other, 1, 1)).wait() == 20
    assert rpc.remote(peer, async_add_via, args=(other, 0, 4)).to_here() == 40
    assert getattr(async_add_via, "_wrapped_async_rpc_function", None) is not None


def test_shutdown_with_calls_in_flight():
    rpc.init_rpc(f"worker{RANK}")
    futs = []
    for r in range(SIZE):
        futs += [rpc.rpc_async(r, nap, args=(0.02, (RANK, r, i))) for i in range(5)]
    futs.append(rpc.rpc_async((RANK + 1) % SIZE, relay, args=(1, [RANK])))
    rref = rpc.remote((RANK + 1) % SIZE, nap, args=(0.05, "made"))
    rpc.shutdown()  # graceful: returns once every worker's calls are answered
    assert _state.agent is None
    assert all(f.done() for f in futs)
    assert [f.wait() for f in futs[:-1]] == [(RANK, r, i) for r in range(SIZE) for i in range(5)]
    assert futs[-1].wait() == [RANK, (RANK + 1) % SIZE, (RANK + 2) % SIZE]
    assert rref.confirmed_by_owner()
    with pytest.raises(rpc.RpcNotInitializedError):
        rpc.rpc_async(0, add, args=(1, 2))
    del rref  # after shutdown: nothing to tell, and no error


def test_unknown_worker(rpc_world):
    rank, size = rpc_world
    stats = rpc._get_current_rpc_agent().stats
    sent = stats["messages"]
    with pytest.raises(rpc.UnknownWorkerError, match="unknown destination worker 'nobody'"):
        rpc.rpc_sync("nobody", add, args=(1, 2))
    with pytest.raises(ValueError):
        rpc.rpc_async("nobody", add, args=(1, 2))
    with pytest.raises(RuntimeError):  # torch raises RuntimeError: so does this
        rpc.remote("nobody", add, args=(1, 2))
    with pytest.raises(rpc.UnknownWorkerError, match="out of range"):
        rpc.rpc_sync(size, add, args=(1, 2))
    with pytest.raises(rpc.UnknownWorkerError):
        rpc.rpc_sync(rpc.WorkerInfo("ghost", 0), add, args=(1, 2))
    with pytest.raises(rpc.UnknownWorkerError):
        rpc.get_worker_info("nobody")
    with pytest.raises(TypeError):
        rpc.rpc_sync(1.5, add, args=(1, 2))
    with pytest.raises(TypeError, match="callable"):
        rpc.rpc_sync(rank, "add")
    assert stats["messages"] == sent  # nothing was sent


def test_unpicklable(rpc_world):
    rank, size = rpc_world
    peer = (rank + 1) % size
    stats = rpc._get_current_rpc_agent().stats
    sent = stats["messages"]
    with pytest.raises(TypeError, match="cannot be pickled") as info:
        rpc.rpc_sync(peer, echo, args=(threading.Lock(),))
    assert "module level" in str(info.value)
    with pytest.raises(TypeError, match="cannot be pickled"):
        rpc.rpc_async(peer, lambda: 1)
    with pytest.raises(TypeError, match="cannot be pickled"):
        rpc.remote(peer, echo, args=(lambda: 1,))
    assert stats["messages"] == sent  # refused before sending
    _quiet_barrier()  # (before the others' calls below make this worker answer)
    # a result that cannot be pickled is an error at the caller too
    with pytest.raises(TypeError, match="result cannot be pickled"):
        rpc.rpc_sync(peer, make_lock)


@pytest.mark.mpi(min_size=2)
def test_peer_left(rpc_world):
    rank, size = rpc_world
    slow = rpc.rpc_async(1, nap, args=(0.3, "late"), timeout=20) if rank == 0 else None
    _quiet_barrier()
    if rank == 1:
        rpc.shutdown(graceful=False)  # leaves at once: the others must not wait for it
        assert _state.agent is None
    _quiet_barrier()
    if rank != 1:
        t0 = time.monotonic()
        if slow is not None:
            with pytest.raises(PeerFailedError, match="worker1"):
                slow.wait()  # in flight when worker1 left
        with pytest.raises(PeerFailedError, match="has left"):
            rpc.rpc_sync("worker1", add, args=(1, 2), timeout=20)
        with pytest.raises(PeerFailedError):
            rpc.remote(1, add, args=(1, 2)).to_here(timeout=20)
        assert time.monotonic() - t0 < 5
        others = [r for r in range(size) if r != 1]
        assert rpc.rpc_sync(others[-1], add, args=(1, 2)) == 3
        rpc.shutdown()  # graceful among the workers still there
    _quiet_barrier()


def test_exit_without_shutdown_tells_peers(rpc_world):
    """The exit hook (interpreter exit with the agent running) leaves like graceful=False."""
    from mpitensor.distributed.rpc import api

    rank, size = rpc_world
    _quiet_barrier()
    if rank == size - 1:
        api._at_exit()
        assert _state.agent is None
    _quiet_barrier()
    if rank != size - 1:
        with pytest.raises(PeerFailedError):
            rpc.rpc_sync(size - 1, add, args=(1, 2), timeout=20)
        rpc.shutdown()
    _quiet_barrier()


def test_idle_agent_sleeps(rpc_world):
    rank, size = rpc_world
    rpc.rpc_sync((rank + 1) % size, add, args=(1, 2))
    time.sleep(0.1)  # past the polling phase
    cpu0, t0 = time.process_time(), time.monotonic()
    time.sleep(0.5)
    used = (time.process_time() - cpu0) / (time.monotonic() - t0)
    assert used < 0.2, f"an idle RPC agent used {used:.0%} of a core"


def test_future():
    fut = rpc.Future()
    assert not fut.done()
    with pytest.raises(RuntimeError):
        fut.value()
    doubled = fut.then(lambda f: f.wait() * 2)
    failing = fut.then(lambda f: 1 / 0)
    got = []
    fut.add_done_callback(lambda f: got.append(f.value()))
    fut.set_result(21)
    assert fut.wait() == 21 and fut.value() == 21 and doubled.wait() == 42 and got == [21]
    with pytest.raises(ZeroDivisionError):
        failing.wait()
    with pytest.raises(RuntimeError):
        fut.set_result(1)
    err = rpc.Future()
    threading.Timer(0.02, lambda: err.set_exception(KeyError("k"))).start()
    with pytest.raises(KeyError):
        err.wait()
    assert fut.then(lambda f: f.value() + 1).wait() == 22  # added after completion
    both = rpc.collect_all([fut, err]).wait()
    assert both[0] is fut and both[1] is err
    with pytest.raises(KeyError):
        rpc.wait_all([fut, err])


@pytest.mark.mpi(min_size=2)
def test_example_rpc_square(rpc_world, capsys):
    """examples/rpc_square.py's caller prints what its docstring promises."""
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "examples" / "rpc_square.py"
    spec = importlib.util.spec_from_file_location("rpc_square_example", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["rpc_square_example"] = mod  # every rank: its functions travel by this name
    spec.loader.exec_module(mod)
    _quiet_barrier()
    if rpc_world[0] == 0:
        mod.caller()
        doc = mod.__doc__.split("::")[-1]
        expected = [line.strip() for line in doc.strip().splitlines()]
        assert [line.strip() for line in capsys.readouterr().out.splitlines()] == expected
    _quiet_barrier()


# ------------------------------------------------------------------------------ dist autograd
def mul_add(a, b):
    return a * b + b


def relay_mul_add(third, a, b):
    """Runs on the peer, inside the caller's context: a nested call, then more graph."""
    return rpc.rpc_sync(third, mul_add, args=(a, b)) * 2


def make_param():
    return torch.tensor([1.0, 2.0], requires_grad=True)


def scaled(w_rref, x):
    return w_rref.local_value() * x


def param_value(w_rref):
    return w_rref.local_value().detach().numpy().copy()


def test_dist_autograd(rpc_world):
    import mpitensor.distributed.autograd as dist_autograd

    rank, size = rpc_world
    peer, third = (rank + 1) % size, (rank + 2) % size
    a0, b0 = np.array([1.0, 2.0, 3.0]), np.array([4.0, -5.0, 6.0])
    # the oracle: the same expression on local autograd
    la = torch.tensor(a0, requires_grad=True)
    lb = torch.tensor(b0, requires_grad=True)
    (((la * lb + lb) * 2) ** 2).sum().backward()
    with dist_autograd.context() as cid:
        t1 = torch.tensor(a0, requires_grad=True)
        t2 = torch.tensor(b0, requires_grad=True)
        out = rpc.rpc_sync(peer, relay_mul_add, args=(third, t1, t2))  # rank -> peer -> third
        loss = (out ** 2).sum()
        dist_autograd.backward(cid, [loss])
        grads = dist_autograd.get_gradients(cid)
        assert set(map(id, grads)) == {id(t1), id(t2)}
        np.testing.assert_allclose(grads[t1].numpy(), la.grad.numpy())
        np.testing.assert_allclose(grads[t2].numpy(), lb.grad.numpy())
        assert t1.grad is None and t2.grad is None  # gradients go to the context
        with pytest.raises(RuntimeError, match="nested"):
            with dist_autograd.context():
                pass
    with pytest.raises(RuntimeError, match="does not exist"):
        dist_autograd.get_gradients(cid)


def test_distributed_optimizer(rpc_world):
    import mpitensor.distributed.autograd as dist_autograd
    import mpitensor.optim as optim
    from mpitensor.distributed.optim import DistributedOptimizer

    rank, size = rpc_world
    owner = (rank + 1) % size
    w = rpc.remote(owner, make_param)
    with dist_autograd.context() as cid:
        out = rpc.rpc_sync(owner, scaled, args=(w, torch.tensor([3.0, 4.0])))
        dist_autograd.backward(cid, [out.sum()])
        opt = DistributedOptimizer(optim.SGD, [w], lr=0.5)
        opt.step(cid)
    np.testing.assert_allclose(rpc.rpc_sync(owner, param_value, args=(w,)), [-0.5, 0.0])


def affine(x, w):
    return x * w + w


def make_param64():
    return torch.tensor(np.array([1.5, -2.0]), requires_grad=True)


def fetch_and_square(rref):
    """Runs on another worker inside the caller's context: to_here() there, then more graph."""
    return rref.to_here() ** 2


def owner_grad(cid, rref):
    """On an RRef's owner: the context's gradient of the tensor the RRef holds."""
    import mpitensor.distributed.autograd as dist_autograd

    g = dist_autograd.get_gradients(cid).get(rref.local_value())
    return None if g is None else g.numpy().copy()


def test_dist_autograd_remote_and_to_here(rpc_world):
    """remote()'s arguments and to_here()'s value are recorded: backward crosses both."""
    import mpitensor.distributed.autograd as dist_autograd
    import mpitensor.optim as optim
    from mpitensor.distributed.optim import DistributedOptimizer

    rank, size = rpc_world
    peer, third = (rank + 1) % size, (rank + 2) % size
    x0, w0 = np.array([0.5, -1.0]), np.array([2.0, 3.0])
    # the oracle: one process, the same weights
    lx = torch.tensor(x0, requires_grad=True)
    lw = torch.tensor(w0, requires_grad=True)
    lp = make_param64()
    ly = affine(lx, lw)
    ((ly ** 2 * ly).sum() + (lp * ly).sum()).backward()

    p_rref = rpc.remote(peer, make_param64)  # a parameter that lives on the peer
    with dist_autograd.context() as cid:
        x = torch.tensor(x0, requires_grad=True)
        w = torch.tensor(w0, requires_grad=True)
        y_rref = rpc.remote(peer, affine, args=(x, w))  # the arguments' edges: here -> peer
        z = rpc.rpc_sync(third, fetch_and_square, args=(y_rref,))  # peer -> third -> here
        y = y_rref.to_here()  # peer -> here
        p = p_rref.to_here()  # the parameter, peer -> here
        assert y.requires_grad and p.requires_grad and z.requires_grad
        dist_autograd.backward(cid, [(z * y).sum() + (p * y).sum()])
        grads = dist_autograd.get_gradients(cid)
        np.testing.assert_allclose(grads[x].numpy(), lx.grad.numpy(), rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(grads[w].numpy(), lw.grad.numpy(), rtol=1e-6, atol=1e-6)
        assert x.grad is None and w.grad is None
        # the parameter's gradient is on its owner
        np.testing.assert_allclose(rpc.rpc_sync(peer, owner_grad, args=(cid, p_rref)),
                                   lp.grad.numpy(), rtol=1e-6, atol=1e-6)
        DistributedOptimizer(optim.SGD, [p_rref], lr=0.25).step(cid)
    np.testing.assert_allclose(p_rref.to_here().detach().numpy(),
                               lp.detach().numpy() - 0.25 * lp.grad.numpy(), rtol=1e-6)
    # outside a context nothing is recorded: a plain copy
    assert not rpc.remote(peer, affine, args=(torch.tensor(x0), torch.tensor(w0))) \
        .to_here().requires_grad
