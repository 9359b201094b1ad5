"""The rest of torch.cuda: random states, device properties, nvtx, graphs, memory limits and
pools, legacy GPU tensor types, CUDA errors. On a machine without a GPU every name answers as
a CPU-only torch 2.13 does (same value, or an error of the same class); the CuPy paths run
where a GPU is present and check their values against CuPy's own answers."""

from __future__ import annotations

import importlib.util

import pytest

import mpitensor as mt
from mpitensor import backend
from tests.test_devices_api import HAS_GPU, no_gpu
from tests.test_devices_api import torch as cpu_torch  # noqa: F401 - the oracle fixture, by this name

gpu = pytest.mark.skipif(not HAS_GPU, reason=f"GPU test: {backend.cupy_unavailable_reason()}")
HAS_PYNVML = importlib.util.find_spec("pynvml") is not None


def _answer(fn):
    try:
        return "value", fn()
    except Exception as e:  # noqa: BLE001 - the kind is what is compared
        return "raise", e


SAME_VALUE = [
    lambda m: m.cuda.get_rng_state_all(), lambda m: m.cuda.set_rng_state_all([]),
    lambda m: m.cuda.seed(), lambda m: m.cuda.seed_all(), lambda m: m.cuda.manual_seed(3),
    lambda m: m.cuda.manual_seed_all(3), lambda m: m.cuda.random.get_rng_state_all(),
    lambda m: m.cuda.random.seed_all(), lambda m: m.cuda.default_generators,
    lambda m: m.cuda.get_arch_list(), lambda m: m.cuda.is_tf32_supported(),
    lambda m: m.cuda.host_memory_stats(), lambda m: m.cuda.host_memory_stats_as_nested_dict(),
    lambda m: m.cuda.caching_allocator_enable(False), lambda m: m.cuda.caching_allocator_enable(),
    lambda m: m.cuda.has_half, lambda m: m.cuda.has_magma,
    lambda m: isinstance(m.zeros(2), m.cuda.FloatTensor),
    lambda m: isinstance(m.zeros(2, dtype=m.int64), m.cuda.LongTensor),
    lambda m: m.cuda.LongTensor.is_cuda, lambda m: m.cuda.LongTensor.dtype == m.int64,
    lambda m: (m.cuda.cudaStatus.SUCCESS, m.cuda.cudaStatus.ERROR_NOT_READY),
    lambda m: issubclass(m.cuda.CudaError, RuntimeError),
    lambda m: issubclass(m.cuda.OutOfMemoryError, RuntimeError),
    lambda m: issubclass(m.cuda.DeferredCudaCallError, Exception),
    lambda m: m.cuda.device_of(m.zeros(2)).idx,
    lambda m: type(m.cuda.list_gpu_processes()),
    lambda m: sorted(m.cuda.random.__all__),
    lambda m: sorted(m.cuda.nvtx.__all__),
    lambda m: sorted(m.cuda.graphs.__all__),
]


@no_gpu
@pytest.mark.parametrize("call", SAME_VALUE)
def test_no_gpu_same_value_as_a_cpu_only_torch(cpu_torch, call):  # noqa: F811 - the fixture
    kind, ours = _answer(lambda: call(mt))
    tkind, theirs = _answer(lambda: call(cpu_torch))
    assert (kind, type(ours), ours) == (tkind, type(theirs), theirs)


SAME_ERROR = [
    lambda m: m.cuda.get_rng_state(), lambda m: m.cuda.get_rng_state(0),
    lambda m: m.cuda.get_rng_state("cpu"), lambda m: m.cuda.initial_seed(),
    lambda m: m.cuda.random.initial_seed(),
    lambda m: m.cuda.get_device_properties(), lambda m: m.cuda.get_device_properties(0),
    lambda m: m.cuda.set_per_process_memory_fraction(0.5),
    lambda m: m.cuda.set_per_process_memory_fraction(2.0),
    lambda m: m.cuda.get_per_process_memory_fraction(),
    lambda m: m.cuda.caching_allocator_alloc(64), lambda m: m.cuda.ipc_collect(),
    lambda m: m.cuda.set_sync_debug_mode(0), lambda m: m.cuda.set_sync_debug_mode("warn"),
    lambda m: m.cuda.get_sync_debug_mode(), lambda m: m.cuda.can_device_access_peer(0, 1),
    lambda m: m.cuda.get_stream_from_external(0),
    lambda m: m.cuda.profiler.start(), lambda m: m.cuda.profiler.stop(),
    lambda m: m.cuda.profiler.profile().__enter__(),
    lambda m: m.cuda.nvtx.range_push("a"), lambda m: m.cuda.nvtx.range_pop(),
    lambda m: m.cuda.nvtx.mark("a"), lambda m: m.cuda.nvtx.range("a").__enter__(),
    lambda m: m.cuda.CUDAGraph(), lambda m: m.cuda.graph_pool_handle(),
    lambda m: m.cuda.graphs.CUDAGraph(),
    lambda m: m.cuda.make_graphed_callables(lambda x: x, (m.zeros(2),)),
    lambda m: m.cuda.MemPool(), lambda m: m.cuda.use_mem_pool(None).__enter__(),
    lambda m: m.cuda.FloatTensor(2), lambda m: m.cuda.FloatTensor([1.0]),
    lambda m: m.cuda.LongTensor(),
]


@no_gpu
@pytest.mark.parametrize("call", SAME_ERROR)
def test_no_gpu_same_error_class_as_a_cpu_only_torch(cpu_torch, call):  # noqa: F811
    kind, ours = _answer(lambda: call(mt))
    tkind, theirs = _answer(lambda: call(cpu_torch))
    assert kind == tkind == "raise"
    assert isinstance(ours, type(theirs)), (ours, theirs)


@no_gpu
@pytest.mark.skipif(HAS_PYNVML, reason="checks the answer where nvidia-ml-py is missing")
@pytest.mark.parametrize("name", ["clock_rate", "utilization", "temperature", "power_draw",
                                  "memory_usage", "device_memory_used"])
def test_nvml_readings_need_pynvml_as_in_torch(cpu_torch, name):  # noqa: F811
    _, ours = _answer(getattr(mt.cuda, name))
    _, theirs = _answer(getattr(cpu_torch.cuda, name))
    assert type(ours) is type(theirs) is ModuleNotFoundError
    assert "nvidia-ml-py" in str(ours)
    assert "nvidia-ml-py" in mt.cuda.list_gpu_processes()


@no_gpu
def test_cuda_seeding_without_a_gpu_leaves_the_cpu_numbers_alone(cpu_torch):  # noqa: F811
    # torch queues the CUDA seeding calls for a CUDA start that never comes: the CPU stream
    # goes on as if they had not been made
    for m in (mt, cpu_torch):
        m.manual_seed(0)
        a = m.rand(4)
        m.manual_seed(0)
        m.cuda.manual_seed(5)
        m.cuda.manual_seed_all(6)
        m.cuda.seed()
        m.cuda.seed_all()
        m.cuda.set_rng_state_all([])
        assert m.rand(4).tolist() == a.tolist()
    assert mt.initial_seed() == 0


@no_gpu
def test_no_gpu_answers_that_differ_from_torchs_accidents():
    # a CPU-only torch fails here with AttributeError from its missing C functions; ours says
    # what is true without a GPU
    assert mt.cuda.memory_snapshot() == []
    assert mt.cuda.is_current_stream_capturing() is False
    assert mt.cuda.check_error(0) is None
    for call in (lambda: mt.cuda.get_allocator_backend(), lambda: mt.cuda.nvtx.range_start("a"),
                 lambda: mt.cuda.nvtx.range_end(0),
                 lambda: mt.cuda.reset_peak_host_memory_stats(),
                 lambda: mt.cuda.reset_accumulated_host_memory_stats()):
        with pytest.raises(mt.cuda.CudaUnavailableError, match="needs a GPU"):
            call()
    with pytest.raises(mt.cuda.CudaUnavailableError):
        mt.cuda.ExternalStream(0)


def test_check_error_raises_cuda_error_with_its_code():
    with pytest.raises(mt.cuda.CudaError) as info:
        mt.cuda.check_error(2)
    assert info.value.code == 2 and "(2)" in str(info.value)
    assert isinstance(info.value, RuntimeError)


def test_caching_allocator_delete_refuses_an_unknown_pointer():
    with pytest.raises(RuntimeError, match="caching_allocator_alloc"):
        mt.cuda.caching_allocator_delete(0x1234)


@pytest.mark.parametrize("bad", [None, 3, {"seed": 1}, b"\x00" * 8])
def test_set_rng_state_refuses_what_get_rng_state_never_gave(bad):
    with pytest.raises(TypeError, match="get_rng_state"):
        mt.cuda.set_rng_state(bad)
    with pytest.raises(TypeError, match="get_rng_state"):
        mt.cuda.set_rng_state_all([bad])


def test_graphs_raise_not_implemented_and_say_why():
    for call in (mt.cuda.CUDAGraph, mt.cuda.graph_pool_handle,
                 lambda: mt.cuda.graph(None),
                 lambda: mt.cuda.make_graphed_callables(lambda x: x, (mt.zeros(1),))):
        with pytest.raises(NotImplementedError, match="does not capture CUDA graphs"):
            call()


def test_device_of_a_cpu_tensor_changes_nothing():
    with mt.cuda.device_of(mt.ones(3)) as ctx:
        assert ctx.idx == -1 and ctx.prev is None


def test_derived_seeds_are_fixed_by_the_seed_and_spread():
    from mpitensor.cuda.random import _mix

    assert _mix(0) == _mix(0)
    seeds = {_mix(s) for s in range(1000)}
    assert len(seeds) == 1000
    assert all(0 <= s < 2**64 for s in seeds)


def test_properties_take_torchs_names_from_cupys_dict():
    from mpitensor.cuda.properties import _DeviceProperties

    raw = {"name": b"NVIDIA H200", "major": 9, "minor": 0, "totalGlobalMem": 150 * 2**30,
           "multiProcessorCount": 132, "warpSize": 32, "l2CacheSize": 60 * 2**20,
           "uuid": bytes(range(16)), "pciBusID": 25, "maxThreadsPerMultiProcessor": 2048}
    p = _DeviceProperties(raw)
    assert (p.name, p.major, p.minor, p.total_memory, p.multi_processor_count) == (
        "NVIDIA H200", 9, 0, 150 * 2**30, 132)
    assert (p.warp_size, p.L2_cache_size, p.pci_bus_id, p.max_threads_per_multi_processor) == (
        32, 60 * 2**20, 25, 2048)
    assert p.uuid == "00010203-0405-0607-0809-0a0b0c0d0e0f"
    assert p.is_integrated == 0 and p.memory_bus_width == 0  # not in the dict: 0
    assert repr(p).startswith("_CudaDeviceProperties(name='NVIDIA H200', major=9, minor=0, "
                              "total_memory=153600MB, multi_processor_count=132")


# ---- with a GPU: CuPy's answers ------------------------------------------------------------


@gpu
def test_rng_state_round_trip_reproduces_the_numbers():
    mt.cuda.manual_seed(3)
    assert mt.cuda.initial_seed() == 3
    state = mt.cuda.get_rng_state()
    a = mt.rand(5, device="cuda")
    b = mt.randn(7, device="cuda")
    mt.rand(100, device="cuda")  # move the stream on
    mt.cuda.set_rng_state(state)
    assert mt.rand(5, device="cuda").tolist() == a.tolist()
    assert mt.randn(7, device="cuda").tolist() == b.tolist()
    assert mt.cuda.initial_seed() == state["seed"]


@gpu
def test_rng_state_all_round_trip_and_the_same_seed_gives_the_same_state():
    mt.cuda.manual_seed_all(11)
    states = mt.cuda.get_rng_state_all()
    assert len(states) == mt.cuda.device_count()
    a = mt.rand(6, device="cuda")
    mt.cuda.manual_seed_all(11)
    assert mt.cuda.get_rng_state_all() == states  # derived from the seed alone
    mt.rand(50, device="cuda")
    mt.cuda.set_rng_state_all(states)
    assert mt.rand(6, device="cuda").tolist() == a.tolist()


@gpu
def test_seeds_and_default_generators():
    mt.cuda.manual_seed(21)
    a = mt.rand(4, device="cuda")
    mt.cuda.manual_seed(21)
    assert mt.rand(4, device="cuda").tolist() == a.tolist()
    gens = mt.cuda.default_generators
    assert len(gens) == mt.cuda.device_count()
    assert gens[0].manual_seed(9).initial_seed() == 9 == mt.cuda.initial_seed()
    mt.cuda.seed()
    s = mt.cuda.initial_seed()
    assert 0 <= s < 2**64
    mt.manual_seed(4)  # the global seed reaches the GPUs, as in torch
    assert mt.cuda.initial_seed() == 4


@gpu
def test_device_properties_are_cupys():
    cp = backend.get_cupy()
    for i in range(mt.cuda.device_count()):
        raw = cp.cuda.runtime.getDeviceProperties(i)
        p = mt.cuda.get_device_properties(i)
        name = raw["name"].decode() if isinstance(raw["name"], bytes) else raw["name"]
        assert p.name == name == mt.cuda.get_device_name(i)
        assert (p.major, p.minor) == (raw["major"], raw["minor"]) == \
            mt.cuda.get_device_capability(i)
        assert p.total_memory == raw["totalGlobalMem"]
        assert p.multi_processor_count == raw["multiProcessorCount"]
        assert f"sm_{p.major}{p.minor}" in mt.cuda.get_arch_list()
    assert mt.cuda.is_tf32_supported() == (mt.cuda.get_device_capability()[0] >= 8)
    assert mt.cuda.get_device_properties().name == mt.cuda.get_device_name()


@gpu
def test_nvtx_ranges_nest():
    cp = backend.get_cupy()
    if not getattr(cp.cuda.nvtx, "available", True):
        pytest.skip("this CuPy has no NVTX")
    assert mt.cuda.nvtx.range_push("outer") == 0
    assert mt.cuda.nvtx.range_push("inner") == 1
    mt.cuda.nvtx.mark("here")
    assert mt.cuda.nvtx.range_pop() == 1
    assert mt.cuda.nvtx.range_pop() == 0
    assert mt.cuda.nvtx.range_pop() == -1
    with mt.cuda.nvtx.range("step {}", 3):
        pass
    with pytest.raises(NotImplementedError):
        mt.cuda.nvtx.range_start("a")


@gpu
def test_memory_fraction_is_cupys_pool_limit():
    cp = backend.get_cupy()
    pool = cp.get_default_memory_pool()
    total = mt.cuda.mem_get_info()[1]
    try:
        assert mt.cuda.get_per_process_memory_fraction() == 1.0
        mt.cuda.set_per_process_memory_fraction(0.25)
        assert mt.cuda.get_per_process_memory_fraction() == 0.25
        assert pool.get_limit() == int(0.25 * total)
        with pytest.raises(ValueError):
            mt.cuda.set_per_process_memory_fraction(1.5)
    finally:
        pool.set_limit(size=0)


@gpu
def test_raw_blocks_are_counted_and_given_back():
    mt.zeros(1, device="cuda")
    before = mt.cuda.memory_allocated()
    ptr = mt.cuda.caching_allocator_alloc(1 << 20)
    assert isinstance(ptr, int) and ptr != 0
    assert mt.cuda.memory_allocated() == before + (1 << 20)
    mt.cuda.caching_allocator_delete(ptr)
    assert mt.cuda.memory_allocated() == before
    with pytest.raises(RuntimeError):
        mt.cuda.caching_allocator_delete(ptr)


@gpu
def test_mem_pool_takes_the_allocations_of_its_block():
    pool = mt.cuda.MemPool()
    assert pool.use_count() == 1 and pool.used_bytes() == 0
    with mt.cuda.use_mem_pool(pool):
        assert pool.use_count() == 2
        x = mt.zeros(1 << 18, dtype=mt.float32, device="cuda")
    assert pool.used_bytes() >= x.numel() * 4
    del x
    assert pool.used_bytes() == 0 and pool.use_count() == 1


@gpu
def test_caching_allocator_disabled_bypasses_the_pool():
    cp = backend.get_cupy()
    allocator = cp.cuda.get_allocator()
    mt.zeros(1, device="cuda")
    before = mt.cuda.memory_allocated()
    with mt.cuda.caching_allocator_disabled():
        x = mt.zeros(1 << 16, device="cuda")
        assert mt.cuda.memory_allocated() == before  # not from the pool
    assert cp.cuda.get_allocator() == allocator
    del x
    assert mt.cuda.get_allocator_backend() == "native"


@gpu
def test_legacy_gpu_types_make_gpu_tensors():
    t = mt.cuda.FloatTensor([1, 2])
    assert t.is_cuda and t.dtype == mt.float32 and t.tolist() == [1.0, 2.0]
    assert isinstance(t, mt.cuda.FloatTensor) and not isinstance(t, mt.FloatTensor)
    assert mt.cuda.LongTensor(2, 3).shape == (2, 3)
    assert mt.cuda.FloatTensor(t) is t
    assert t.type() == "mpitensor.cuda.FloatTensor"


@gpu
def test_gpu_context_sync_mode_errors_streams():
    x = mt.zeros(2, device="cuda")
    with mt.cuda.device_of(x):
        assert mt.cuda.current_device() == x.get_device()
    assert mt.cuda.is_current_stream_capturing() is False
    mt.cuda.set_sync_debug_mode("default")
    assert mt.cuda.get_sync_debug_mode() == 0
    with pytest.raises(NotImplementedError):
        mt.cuda.set_sync_debug_mode(1)
    with pytest.raises(ValueError):
        mt.cuda.set_sync_debug_mode("loud")
    err = mt.cuda.CudaError(2)
    assert "cudaErrorMemoryAllocation" in str(err)
    with mt.cuda.profiler.profile():
        mt.ones(4, device="cuda").sum()
    mt.cuda.ipc_collect()
    cp = backend.get_cupy()
    raw = cp.cuda.Stream()
    ext = mt.cuda.get_stream_from_external(raw.ptr)
    assert ext.cuda_stream == raw.ptr
    for call in (mt.cuda.memory_snapshot, mt.cuda.host_memory_stats):
        with pytest.raises(NotImplementedError):  # CuPy's pools do not list or count these
            call()


@gpu
@pytest.mark.skipif(not HAS_PYNVML, reason="needs nvidia-ml-py (pynvml)")
def test_nvml_readings():
    assert 0 <= mt.cuda.utilization() <= 100
    assert 0 <= mt.cuda.memory_usage() <= 100
    assert mt.cuda.temperature() > 0
    assert mt.cuda.power_draw() > 0
    assert mt.cuda.clock_rate() > 0
    mt.zeros(1 << 20, device="cuda")
    assert mt.cuda.device_memory_used() >= mt.cuda.memory_reserved()
    assert mt.cuda.list_gpu_processes().startswith("GPU:")


NEW_CALLABLES = [
    "get_rng_state", "set_rng_state", "get_rng_state_all", "set_rng_state_all", "seed",
    "seed_all", "initial_seed", "get_device_properties", "get_arch_list", "is_tf32_supported",
    "can_device_access_peer", "clock_rate", "utilization", "temperature", "power_draw",
    "memory_usage", "device_memory_used", "list_gpu_processes", "memory_snapshot",
    "set_per_process_memory_fraction", "get_per_process_memory_fraction",
    "caching_allocator_alloc", "caching_allocator_delete", "caching_allocator_enable",
    "caching_allocator_disabled", "get_allocator_backend", "host_memory_stats",
    "host_memory_stats_as_nested_dict", "reset_accumulated_host_memory_stats",
    "reset_peak_host_memory_stats", "ipc_collect", "MemPool", "use_mem_pool",
    "set_sync_debug_mode", "get_sync_debug_mode", "check_error", "is_current_stream_capturing",
    "graph_pool_handle", "CUDAGraph", "make_graphed_callables", "get_stream_from_external",
    "ExternalStream", "device_of", "nvtx.range_push", "nvtx.range_pop", "nvtx.range_start",
    "nvtx.range_end", "nvtx.mark", "nvtx.range", "profiler.start", "profiler.stop",
    "profiler.profile", "random.manual_seed", "random.manual_seed_all",
]


def _resolve_name(module, dotted):
    for part in dotted.split("."):
        module = getattr(module, part)
    return module


@pytest.mark.parametrize("name", NEW_CALLABLES)
def test_parameters_are_torchs(cpu_torch, name):  # noqa: F811 - the fixture
    import inspect

    def params(fn):
        sig = inspect.signature(fn)
        return [(p.name, p.kind, p.default) for p in sig.parameters.values()
                if p.kind not in (p.VAR_KEYWORD,)]

    ours = params(_resolve_name(mt.cuda, name))
    theirs = params(_resolve_name(cpu_torch.cuda, name))
    assert ours == theirs
