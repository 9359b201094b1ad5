"""torch.cuda's memory statistics, Event and Stream: CPU answers against a CPU-only torch, and
the GPU path on CuPy where a GPU is present."""

from __future__ import annotations

import warnings

import pytest

import mpitensor as mt
from mpitensor import backend
from tests.test_devices_api import HAS_GPU, no_gpu
from tests.test_devices_api import torch as cpu_torch  # noqa: F401 - the oracle fixture, by this name

gpu = pytest.mark.skipif(not HAS_GPU, reason=f"GPU test: {backend.cupy_unavailable_reason()}")


def _answer(fn):
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        try:
            out = ("value", fn())
        except Exception as e:  # noqa: BLE001 - the kind is what is compared
            out = ("raise", e)
    return out, sorted({x.category.__name__ for x in w})


ZERO_ANSWERS = ["memory_allocated", "max_memory_allocated", "memory_reserved",
                "max_memory_reserved", "memory_cached", "max_memory_cached", "memory_stats",
                "memory_stats_as_nested_dict", "empty_cache", "is_bf16_supported"]


@no_gpu
@pytest.mark.parametrize("name", ZERO_ANSWERS)
def test_cpu_answers_match_a_cpu_only_torch(cpu_torch, name):  # noqa: F811 - the fixture
    (kind, ours), ow = _answer(getattr(mt.cuda, name))
    (tkind, theirs), tw = _answer(getattr(cpu_torch.cuda, name))
    assert (kind, ours, ow) == (tkind, theirs, tw)


@no_gpu
@pytest.mark.parametrize("call", [
    lambda m: m.cuda.mem_get_info(), lambda m: m.cuda.current_stream(),
    lambda m: m.cuda.default_stream(), lambda m: m.cuda.Event(enable_timing=True),
    lambda m: m.cuda.Event(), lambda m: m.cuda.Stream(),
    lambda m: m.accelerator.memory_allocated(), lambda m: m.accelerator.max_memory_allocated(),
    lambda m: m.accelerator.memory_stats(), lambda m: m.accelerator.reset_peak_memory_stats(),
    lambda m: m.accelerator.current_stream(), lambda m: m.accelerator.get_memory_info(),
    lambda m: m.accelerator.empty_cache(), lambda m: m.accelerator.empty_host_cache(),
    lambda m: m.accelerator.current_device_idx(), lambda m: m.accelerator.set_device_idx(0),
])
def test_calls_that_need_a_gpu_raise_torchs_type(cpu_torch, call):  # noqa: F811 - the fixture
    (kind, ours), _ = _answer(lambda: call(mt))
    (tkind, theirs), _ = _answer(lambda: call(cpu_torch))
    assert kind == tkind == "raise"
    assert isinstance(ours, type(theirs))


@no_gpu
@pytest.mark.parametrize("name", ["reset_peak_memory_stats", "reset_max_memory_allocated",
                                  "reset_max_memory_cached", "reset_accumulated_memory_stats",
                                  "memory_summary"])
def test_resets_and_summary_raise_without_a_gpu(cpu_torch, name):  # noqa: F811 - the fixture
    # a CPU-only torch fails here too (with an AttributeError/KeyError from its internals);
    # ours says why, as the other GPU-only calls do
    (tkind, _), tw = _answer(getattr(cpu_torch.cuda, name))
    (kind, err), ow = _answer(getattr(mt.cuda, name))
    assert kind == tkind == "raise"
    assert isinstance(err, mt.cuda.CudaUnavailableError) and "needs a GPU" in str(err)
    assert ow == tw


@no_gpu
def test_stream_none_is_a_no_op_context(cpu_torch):  # noqa: F811 - the fixture
    with mt.cuda.stream(None) as s:
        assert s is None
    mt.cuda.set_stream(None)


def test_bad_device_arguments_raise_before_any_work():
    with pytest.raises(ValueError):
        mt.cuda.max_memory_allocated("cpu")
    with pytest.raises(ValueError):
        mt.cuda.memory_stats(1.5)


@gpu
def test_gpu_peak_tracks_allocations_and_resets():
    mt.cuda.empty_cache()
    mt.cuda.reset_peak_memory_stats()
    base = mt.cuda.memory_allocated()
    x = mt.ones(1 << 20, device="cuda")  # 4 MiB
    y = x * 2
    peak = mt.cuda.max_memory_allocated()
    assert peak >= base + 2 * (4 << 20)
    del x, y
    assert mt.cuda.memory_allocated() <= peak - 2 * (4 << 20) + 4096
    assert mt.cuda.max_memory_allocated() == peak  # the peak stays after the free
    mt.cuda.reset_peak_memory_stats()
    assert mt.cuda.max_memory_allocated() == mt.cuda.memory_allocated()
    stats = mt.cuda.memory_stats()
    assert stats["allocated_bytes.all.current"] == mt.cuda.memory_allocated()
    assert stats["reserved_bytes.all.peak"] >= stats["reserved_bytes.all.current"]
    mt.cuda.reset_accumulated_memory_stats()
    assert mt.cuda.memory_stats()["allocation.all.allocated"] == 0
    assert mt.cuda.memory_reserved() <= mt.cuda.max_memory_reserved()
    free, total = mt.cuda.mem_get_info()
    assert 0 < free <= total
    assert "allocated_bytes.all.current" in mt.cuda.memory_summary()
    assert mt.accelerator.max_memory_allocated() == mt.cuda.max_memory_allocated()


@gpu
def test_gpu_events_time_work_and_streams_order_it():
    start = mt.cuda.Event(enable_timing=True)
    end = mt.cuda.Event(enable_timing=True)
    start.record()
    y = (mt.ones(1 << 20, device="cuda") * 3).sum()
    end.record()
    end.synchronize()
    assert end.query() and start.elapsed_time(end) >= 0.0
    s = mt.cuda.Stream()
    assert s != mt.cuda.default_stream()
    with mt.cuda.stream(s):
        assert mt.cuda.current_stream() == s
        z = mt.ones(1000, device="cuda") + 1
    assert mt.cuda.current_stream() != s
    mt.cuda.current_stream().wait_stream(s)
    ev = s.record_event()
    ev.wait()
    s.synchronize()
    assert s.query()
    assert float(z.sum()) == 2000.0 and float(y) == 3.0 * (1 << 20)
    with pytest.raises(NotImplementedError):
        ev.ipc_handle()


class _FakePool:
    """CuPy's MemoryPool as _gpu_memory sees it: used and held bytes, 512-byte blocks."""

    def __init__(self):
        self.used = self.held = 0
        self.live = []

    def malloc(self, size):
        import types

        if size > 1 << 30:
            raise _FakeOOM()
        size = -(-size // 512) * 512
        self.used += size
        self.held = max(self.held, self.used)
        mem = types.SimpleNamespace(mem=types.SimpleNamespace(size=size))
        self.live.append(mem)
        return mem

    def free(self, mem):
        self.live.remove(mem)
        self.used -= mem.mem.size

    def used_bytes(self):
        return self.used

    def total_bytes(self):
        return self.held


class _FakeOOM(MemoryError):
    pass


@pytest.fixture
def fake_cupy(monkeypatch):
    """A stand-in for the parts of CuPy the counting allocator uses, with fresh counts."""
    import contextlib
    import types

    from mpitensor._base import gpu_memory as _gpu_memory
    from mpitensor.cuda import memory

    pool = _FakePool()
    cp = types.SimpleNamespace(get_default_memory_pool=lambda: pool)
    cp.cuda = types.SimpleNamespace(
        runtime=types.SimpleNamespace(getDevice=lambda: 0, memGetInfo=lambda: (3, 8)),
        memory=types.SimpleNamespace(OutOfMemoryError=_FakeOOM),
        Device=lambda i: contextlib.nullcontext(), allocator=pool.malloc)
    cp.cuda.get_allocator = lambda: cp.cuda.allocator
    cp.cuda.set_allocator = lambda f: setattr(cp.cuda, "allocator", f)
    monkeypatch.setattr(_gpu_memory, "_state", {"installed": False, "tried": False})
    monkeypatch.setattr(_gpu_memory, "_per_device", {})
    monkeypatch.setattr(memory, "_used", lambda device, what: (cp, 0))
    monkeypatch.setattr(memory, "_gpu", lambda device, what: (cp, 0))
    _gpu_memory.install(cp)
    return cp, pool


def test_counting_allocator_peaks_and_counts(fake_cupy):
    cp, pool = fake_cupy
    a = cp.cuda.allocator(1000)   # 1024 in blocks
    b = cp.cuda.allocator(4096)
    pool.free(a)
    assert mt.cuda.memory_allocated() == 4096
    assert mt.cuda.max_memory_allocated() == 5120  # the peak outlives the free
    assert mt.cuda.max_memory_reserved() == 5120
    with pytest.raises(_FakeOOM):
        cp.cuda.allocator(1 << 31)
    stats = mt.cuda.memory_stats()
    assert stats["allocation.all.allocated"] == 2 and stats["num_ooms"] == 1
    assert stats["allocated_bytes.all.allocated"] == 5120
    assert mt.cuda.memory_stats_as_nested_dict()["allocated_bytes"]["all"]["peak"] == 5120
    mt.cuda.reset_peak_memory_stats()
    assert mt.cuda.max_memory_allocated() == 4096
    mt.cuda.reset_accumulated_memory_stats()
    assert mt.cuda.memory_stats()["allocation.all.allocated"] == 0
    assert "allocated_bytes.all.peak" in mt.cuda.memory_summary()
    assert mt.cuda.mem_get_info() == (3, 8)
    pool.free(b)


def test_a_programs_own_allocator_is_left_alone(fake_cupy, monkeypatch):
    from mpitensor._base import gpu_memory as _gpu_memory

    cp, _ = fake_cupy
    mine = object()
    cp.cuda.allocator = mine
    monkeypatch.setattr(_gpu_memory, "_state", {"installed": False, "tried": False})
    _gpu_memory.install(cp)
    assert cp.cuda.allocator is mine and not _gpu_memory.installed()
    with pytest.raises(RuntimeError, match="own allocator"):
        mt.cuda.max_memory_allocated()
    assert "allocated_bytes.all.peak" not in mt.cuda.memory_stats()
