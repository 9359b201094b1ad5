"""torch.distributed's smaller members: debug level, backend queries, option records,
coalesced collectives, split_group, rendezvous, the gloo group class, errors, modules.

Behaviour is compared with torch's where torch answers without a process group of several
(its classes' fields and defaults, its error classes' bases, its answers for complex ops);
collectives run at world size 1 here and at 2 ranks under ``mpiexec`` at the end.
"""

from __future__ import annotations

import datetime

import numpy as np
import pytest

import mpitensor as mt
import mpitensor.distributed as dist

from .test_ddp_comm_hooks import run_on_ranks

torch = pytest.importorskip("torch")
tdist = torch.distributed


@pytest.fixture
def world():
    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("gloo")
    yield
    dist.destroy_process_group()
    dist.set_debug_level(dist.DebugLevel.OFF)


def test_error_classes_have_torchs_bases():
    assert issubclass(dist.DistBackendError, dist.DistError)
    assert issubclass(dist.QueueEmptyError, dist.DistStoreError)
    assert issubclass(dist.DistBackendError, RuntimeError)
    assert issubclass(dist.QueueEmptyError, RuntimeError)


OPTIONS = ["AllreduceOptions", "AllreduceCoalescedOptions", "AllToAllOptions", "BarrierOptions",
           "BroadcastOptions", "GatherOptions", "ReduceOptions", "ReduceScatterOptions",
           "ScatterOptions"]


@pytest.mark.parametrize("name", OPTIONS)
def test_option_records_have_torchs_fields(name):
    theirs, ours = getattr(tdist, name)(), getattr(dist, name)()
    fields = [a for a in dir(theirs) if not a.startswith("_")]
    for f in fields:
        a, b = getattr(ours, f), getattr(theirs, f)
        if f == "reduceOp":
            assert a == dist.ReduceOp.SUM
        else:
            assert a == b, (f, a, b)
    ours.timeout = datetime.timedelta(seconds=5)  # fields are settable
    assert ours.timeout.total_seconds() == 5


def test_supports_complex_as_torch():
    for op in ("SUM", "MIN", "MAX", "BAND", "BOR", "BXOR", "AVG"):
        assert dist.supports_complex(getattr(dist.ReduceOp, op)) == tdist.supports_complex(
            getattr(tdist.ReduceOp, op)), op
    assert dist.supports_complex(dist.ReduceOp.PRODUCT)  # MPI multiplies complex numbers


def test_complex_product_is_reduced(world):
    t = mt.tensor(np.array([1 + 2j, 3 - 1j], dtype=np.complex128))
    dist.all_reduce(t, op=dist.ReduceOp.PRODUCT)
    np.testing.assert_array_equal(t.numpy(), [1 + 2j, 3 - 1j])


def test_backend_config_parsing():
    for text in ("gloo", "cpu:gloo,cuda:nccl", "nccl"):
        assert str(dist.BackendConfig(text)) == str(tdist.BackendConfig(text))
        assert (dist.BackendConfig(text).get_device_backend_map()
                == tdist.BackendConfig(text).get_device_backend_map())
    for bad in ("cpu:", "cpu:bogus", "bogus"):
        with pytest.raises(ValueError):
            dist.BackendConfig(bad)


def test_availability_is_truthful():
    assert dist.is_backend_available("gloo") and dist.is_backend_available("mpi")
    assert dist.is_backend_available("nccl") == dist.is_nccl_available()
    assert not dist.is_backend_available("ucc") and not dist.is_backend_available("bogus")
    assert dist.is_ucc_available() is False and dist.is_xccl_available() is False
    assert dist.default_pg_timeout == tdist.default_pg_timeout
    from mpitensor.distributed import constants

    assert constants.default_pg_timeout == dist.default_pg_timeout


def test_debug_level_maps_onto_debug_mode(monkeypatch, world):
    assert dist.get_debug_level() == dist.DebugLevel.OFF
    dist.set_debug_level(dist.DebugLevel.DETAIL)
    assert dist.get_debug() and dist.group.WORLD.debug
    dist.set_debug_level(dist.DebugLevel.INFO)
    assert not dist.get_debug() and dist.get_debug_level() == dist.DebugLevel.INFO
    monkeypatch.setenv("TORCH_DISTRIBUTED_DEBUG", "detail")
    dist.set_debug_level_from_env()
    assert dist.get_debug_level() == dist.DebugLevel.DETAIL and dist.get_debug()
    monkeypatch.setenv("TORCH_DISTRIBUTED_DEBUG", "bogus")
    with pytest.raises(ValueError, match="OFF, INFO or DETAIL"):
        dist.set_debug_level_from_env()
    with pytest.raises(TypeError):
        dist.set_debug_level(2)
    dist.set_debug_level(dist.DebugLevel.OFF)
    assert not dist.get_debug()


def test_group_queries(world):
    assert dist.get_pg_count() == 1
    g = dist.new_group([0])
    assert dist.get_pg_count() == 2
    assert dist.get_backend_config() == "cpu:gloo,cuda:gloo"
    assert isinstance(dist.group.WORLD, dist.ProcessGroupGloo)
    assert isinstance(g, dist.ProcessGroupGloo)
    assert not isinstance(3, dist.ProcessGroupGloo)
    with pytest.raises(RuntimeError, match="new_group"):
        dist.ProcessGroupGloo()
    del g


@pytest.mark.parametrize("dtype", [mt.float32, mt.float64])
def test_coalesced_at_world_size_one(world, dtype):
    ts = [mt.ones(2, dtype=dtype), mt.full((3,), 2.0, dtype=dtype)]
    assert dist.all_reduce_coalesced(ts) is None
    np.testing.assert_array_equal(ts[1].numpy(), [2, 2, 2])
    w = dist.all_reduce_coalesced(ts, async_op=True)
    assert w.wait() and w.is_completed() and w.result()[0] is ts[0]
    out = [[mt.zeros(2, dtype=dtype), mt.zeros(3, dtype=dtype)]]
    dist.all_gather_coalesced(out, ts)
    np.testing.assert_array_equal(out[0][1].numpy(), [2, 2, 2])
    with pytest.raises(RuntimeError, match="one per rank"):
        dist.all_gather_coalesced([[mt.zeros(2, dtype=dtype)]], ts)
    with pytest.raises(TypeError, match="list of tensors"):
        dist.all_gather_coalesced(out, ts[0])
    with pytest.raises(TypeError, match="list of tensors"):
        dist.all_reduce_coalesced([1.0])
    with pytest.raises(ValueError, match="one dtype"):
        dist.all_reduce_coalesced([mt.ones(2, dtype=mt.float32), mt.ones(2, dtype=mt.float64)])
    with pytest.raises(RuntimeError, match="empty"):
        dist.all_reduce_coalesced([])
    one = mt.ones(2, dtype=dtype)
    dist.all_reduce_coalesced(one)  # one tensor, as torch accepts
    np.testing.assert_array_equal(one.numpy(), [1, 1])
    o = mt.zeros(3, dtype=dtype)
    dist.all_gather_single(o, mt.ones(3, dtype=dtype))
    dist.reduce_scatter_single(o, mt.full((3,), 4.0, dtype=dtype))
    np.testing.assert_array_equal(o.numpy(), [4, 4, 4])


def test_split_group_errors(world):
    with pytest.raises(ValueError, match="at least one split"):
        dist.split_group(split_ranks=[])
    with pytest.raises(ValueError, match="outside the parent"):
        dist.split_group(split_ranks=[[0, 1]])
    with pytest.raises(TypeError, match="lists of ints"):
        dist.split_group(split_ranks=[["a"]])
    g = dist.split_group(split_ranks=[[0]])
    assert dist.get_process_group_ranks(g) == [0]


def test_rendezvous_file_and_handlers(tmp_path):
    it = dist.rendezvous(f"file://{tmp_path / 'rdzv'}", rank=0, world_size=1)
    store, rank, size = next(it)
    assert (rank, size) == (0, 1)
    store.set("k", b"v")
    assert store.get("k") == b"v"
    with pytest.raises(RuntimeError, match="no handler"):
        next(dist.rendezvous("bogus://x"))
    with pytest.raises(RuntimeError, match="already has a handler"):
        dist.register_rendezvous_handler("file", lambda url, **kw: iter(()))

    def mine(url, **kw):
        yield "store", 3, 4

    dist.register_rendezvous_handler("mine-test", mine)
    assert next(dist.rendezvous("mine-test://x")) == ("store", 3, 4)


def test_distributed_c10d_module_resolves_package_names():
    from mpitensor.distributed import distributed_c10d as c10d

    assert c10d.ReduceOp is dist.ReduceOp and c10d.all_reduce is dist.all_reduce
    assert c10d.GradBucket is dist.GradBucket and c10d.breakpoint is dist.breakpoint
    with pytest.raises(AttributeError):
        c10d.no_such_name  # noqa: B018


def test_record_comm_names_the_operations(world):
    with dist.record_comm("layer1 grads"):
        with pytest.raises(ValueError, match=r"all_reduce \[layer1 grads\] \(#"):
            dist.all_reduce(mt.ones(2), op=dist.ReduceOp.BAND)
        with dist.record_comm("inner"):
            with pytest.raises(ValueError, match=r"all_reduce \[inner\]"):
                dist.all_reduce(mt.ones(2), op=dist.ReduceOp.BOR)
            dist.all_reduce(mt.ones(2))
        with pytest.raises(ValueError, match=r"\[layer1 grads\]"):
            dist.all_reduce(mt.ones(2), op=dist.ReduceOp.BAND)
    with pytest.raises(ValueError) as info:
        dist.all_reduce(mt.ones(2), op=dist.ReduceOp.BAND)
    assert "[" not in str(info.value).split(":")[1]
    with pytest.raises(TypeError):
        with dist.record_comm(3):
            pass


def test_breakpoint_skips_then_barrier(world, monkeypatch):
    calls = []
    monkeypatch.setattr("pdb.Pdb.set_trace", lambda self, frame=None: calls.append(frame))
    dist.breakpoint(rank=0, skip=1)  # skipped
    assert calls == []
    dist.breakpoint(rank=0, skip=1)
    assert len(calls) == 1
    dist.breakpoint(rank=5)  # another rank's: only the barrier
    assert len(calls) == 1


SCRIPT = r'''
import sys
sys.path.insert(0, {root!r})
import numpy as np
import mpitensor as mt, mpitensor.distributed as dist
dist.init_process_group("gloo")
r, n = dist.get_rank(), dist.get_world_size()
for dt in (mt.float32, mt.float64):
    ts = [mt.full((2,), float(r + 1), dtype=dt), mt.full((3,), 10.0 * (r + 1), dtype=dt)]
    dist.all_reduce_coalesced(ts)
    assert ts[0].tolist() == [3.0, 3.0] and ts[1].tolist() == [30.0] * 3, ts
    out = [[mt.zeros(2, dtype=dt), mt.zeros(3, dtype=dt)] for _ in range(n)]
    w = dist.all_gather_coalesced(out, [mt.full((2,), float(r), dtype=dt),
                                        mt.full((3,), float(r + 5), dtype=dt)], async_op=True)
    w.wait()
    assert [o[0].tolist() for o in out] == [[0.0, 0.0], [1.0, 1.0]], out
    assert [o[1].tolist() for o in out] == [[5.0] * 3, [6.0] * 3], out
g = dist.split_group(split_ranks=[[0], [1]])
assert dist.get_process_group_ranks(g) == [r]
t = mt.ones(1)
dist.all_reduce(t, group=g)
assert t.item() == 1.0
assert dist.get_pg_count() == 2
dist.destroy_process_group()
print("rank", r, "OK", flush=True)
'''


def test_two_ranks(tmp_path):
    run_on_ranks(tmp_path, SCRIPT, timeout=180)
