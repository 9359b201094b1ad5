"""Device APIs: ``mpitensor.device``, ``mpitensor.cuda``, ``mpitensor.accelerator``,
``mpitensor.backends`` and ``distributed.get_default_backend_for_device``.

Three kinds of tests:

* the answers on a machine without a GPU, compared with a CPU-only build of torch as the
  oracle where torch is installed (skipped on a machine with a GPU: the answers differ there);
* the CuPy paths against a fake CuPy with three GPUs, so that the logic of ``set_device``,
  ``synchronize``, the ``device`` context and seeding is checked on every machine;
* ``@pytest.mark.gpu`` tests of the same paths on a real GPU (skipped with the reason here).
"""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

import mpitensor as mt
import mpitensor.distributed as dist
import mpitensor.nn as nn
from mpitensor import backend

HAS_GPU = backend.cupy_available()
no_gpu = pytest.mark.skipif(HAS_GPU, reason="checks the answers of a machine without a GPU")


@pytest.fixture(scope="module")
def torch():
    """torch as the oracle: a CPU-only build, the answers these tests compare with."""
    t = pytest.importorskip("torch", reason="torch is the oracle for the parity checks")
    if t.cuda.is_available():
        pytest.skip("the installed torch sees a GPU; these checks compare CPU-only answers")
    return t


def _raised(fn, *args, **kwargs):
    """The exception ``fn(*args, **kwargs)`` raises (None if it returns)."""
    try:
        fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - the type is what is compared
        return exc
    return None


# ---------------------------------------------------------------------------- mpitensor.device
GOOD_SPECS = [("cpu",), ("cuda",), ("cuda:0",), ("cuda:1",), ("cuda", 1), ("cuda", 0),
              ("cuda:12",)]


@pytest.mark.parametrize("args", GOOD_SPECS)
def test_device_fields_str_and_repr_match_torch(torch, args):
    ours, theirs = mt.device(*args), torch.device(*args)
    assert (ours.type, ours.index) == (theirs.type, theirs.index)
    assert str(ours) == str(theirs) and repr(ours) == repr(theirs)


def test_device_forms():
    d = mt.device("cuda:1")
    assert (d.type, d.index) == ("cuda", 1)
    assert mt.device("cuda", 1) == d and mt.device(d) == d and mt.device(type="cuda", index=1) == d
    assert mt.device(d) is not d
    assert mt.device("cuda", np.int64(2)).index == 2
    assert mt.device("cuda").index is None and mt.device("cpu").index is None
    assert str(d) == "cuda:1" and repr(d) == "device(type='cuda', index=1)"
    assert repr(mt.device("cpu")) == "device(type='cpu')"


def test_device_equality_and_hash():
    assert mt.device("cuda:1") == mt.device("cuda", 1)
    assert mt.device("cuda") != mt.device("cuda:0")  # no number is not GPU 0, as in torch
    assert mt.device("cpu") != mt.device("cuda")
    assert hash(mt.device("cuda:1")) == hash(mt.device("cuda", 1))
    assert len({mt.device("cpu"), mt.device("cpu"), mt.device("cuda:0"), mt.device("cuda", 0)}) == 2
    assert {mt.device("cuda:1"): "x"}[mt.device("cuda", 1)] == "x"
    # beyond torch: a device also equals its string (torch's only equals devices)
    assert mt.device("cuda:1") == "cuda:1" and mt.device("cpu") == "cpu"
    assert mt.device("cpu") != "tpu" and mt.device("cpu") != 3


BAD_SPECS = [
    (("cuda:-1",), RuntimeError), (("tpu",), RuntimeError), (("CUDA",), RuntimeError),
    (("cuda:x",), RuntimeError), (("cuda:1:2",), RuntimeError), (("cuda", -1), RuntimeError),
    (("cuda:1", 2), RuntimeError), (("cuda", True), TypeError), (("cuda", 1.5), TypeError),
    ((True,), TypeError), ((1.5,), TypeError), ((None,), TypeError),
]


@pytest.mark.parametrize("args, kind", BAD_SPECS)
def test_bad_device_raises_what_torch_raises(torch, args, kind):
    theirs = _raised(torch.device, *args)
    assert isinstance(theirs, kind), theirs
    ours = _raised(mt.device, *args)
    assert isinstance(ours, kind), ours
    if kind is RuntimeError:  # a bad argument, so a ValueError too (the house rule)
        assert isinstance(ours, ValueError)


def test_bad_device_messages():
    with pytest.raises(RuntimeError, match="unknown device type 'tpu'"):
        mt.device("tpu")
    with pytest.raises(ValueError, match="non-negative integer"):
        mt.device("cuda:-1")
    with pytest.raises(TypeError, match="device index must be an int"):
        mt.device("cuda", 1.0)
    with pytest.raises(TypeError, match="pass a string and an index"):
        mt.device(mt.device("cuda"), 1)


def test_device_arguments_reach_tensors_and_modules():
    for dev in ("cpu", mt.device("cpu"), mt.device(mt.device("cpu"))):
        t = mt.zeros(2, 3, device=dev)
        assert t.device == mt.device("cpu") and t.device == "cpu" and t.device.type == "cpu"
        assert t.to(dev) is t and t.cpu() is t
        m = nn.Linear(2, 2)
        assert m.to(dev) is m and m.cpu() is m
        assert all(p.device == mt.device("cpu") for p in m.parameters())
    assert mt.ones(2, device="cpu").device.index is None


# ---------------------------------------------------------------------------- a torch program
def _program(lib, state=None):
    """The usual device set-up of a torch script, written once for both libraries."""
    device = lib.device("cuda" if lib.cuda.is_available() else "cpu")
    lib.manual_seed(0)
    lib.cuda.manual_seed_all(0)
    lib.backends.cudnn.benchmark = True
    model = lib.nn.Sequential(lib.nn.Linear(4, 3), lib.nn.ReLU(), lib.nn.Linear(3, 2))
    if state is not None:
        model.load_state_dict({k: lib.tensor(v) for k, v in state.items()})
    model.to(device)
    x = lib.arange(8, dtype=lib.float32).reshape(2, 4).to(device) / 8
    y = lib.zeros(2, dtype=lib.long, device=device)
    loss = lib.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    if lib.cuda.is_available():
        lib.cuda.synchronize()
    lib.backends.cudnn.benchmark = False
    grads = [p.grad.cpu().numpy() for p in model.parameters()]
    return device, loss.item(), grads


def test_torch_style_device_setup_runs():
    device, loss, grads = _program(mt)
    assert device == mt.device("cuda" if HAS_GPU else "cpu")
    assert np.isfinite(loss) and len(grads) == 4


def test_torch_style_device_setup_matches_torch(torch):
    state = {k: v.detach().numpy() for k, v in
             torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(),
                                 torch.nn.Linear(3, 2)).state_dict().items()}
    tdev, tloss, tgrads = _program(torch, {k: v.copy() for k, v in state.items()})
    mdev, mloss, mgrads = _program(mt, state)
    assert str(mdev) == str(tdev) == "cpu"
    np.testing.assert_allclose(mloss, tloss, rtol=1e-6)
    for a, b in zip(mgrads, tgrads):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


@no_gpu
def test_cuda_moves_fail_clearly_without_a_gpu():
    with pytest.raises(RuntimeError, match="CuPy"):
        mt.zeros(2).cuda()
    with pytest.raises(RuntimeError, match="CuPy"):
        nn.Linear(2, 2).cuda()
    with pytest.raises(RuntimeError, match="CuPy"):
        mt.zeros(2, device=mt.device("cuda", 0))


# ---------------------------------------------------------------------------- mpitensor.cuda
@no_gpu
def test_cuda_answers_without_a_gpu_match_torch(torch):
    for name in ("is_available", "device_count", "is_initialized", "empty_cache",
                 "memory_allocated", "memory_reserved"):
        assert getattr(mt.cuda, name)() == getattr(torch.cuda, name)(), name
    assert mt.cuda.is_available() is False and mt.cuda.device_count() == 0
    for name in ("manual_seed", "manual_seed_all"):
        assert getattr(mt.cuda, name)(0) is None and getattr(torch.cuda, name)(0) is None


@no_gpu
@pytest.mark.parametrize("name, args", [
    ("current_device", ()), ("synchronize", ()), ("synchronize", (0,)),
    ("get_device_name", ()), ("get_device_name", (0,)), ("get_device_capability", ()),
    ("init", ()),
])
def test_cuda_calls_that_need_a_gpu_raise_like_torch(torch, name, args):
    theirs = _raised(getattr(torch.cuda, name), *args)
    ours = _raised(getattr(mt.cuda, name), *args)
    assert isinstance(theirs, AssertionError)  # torch's CPU build
    assert isinstance(ours, AssertionError) and isinstance(ours, RuntimeError)
    assert isinstance(ours, mt.cuda.CudaUnavailableError)
    assert isinstance(ours, mt.MpiTensorError)


@no_gpu
@pytest.mark.parametrize("name, args", [
    ("set_device", (0,)), ("set_device", (5,)), ("set_device", ("cuda:1",)),
    ("set_device", (mt.device("cuda", 2),)), ("current_device", ()), ("synchronize", ()),
    ("synchronize", ("cuda",)), ("get_device_name", ("cuda:0",)), ("init", ()),
])
def test_no_gpu_error_says_why_and_what_to_do(name, args):
    with pytest.raises(mt.cuda.CudaUnavailableError) as info:
        getattr(mt.cuda, name)(*args)
    msg = str(info.value)
    assert f"mpitensor.cuda.{name}() needs a GPU" in msg
    assert "pip install" in msg or "no CUDA device" in msg
    assert "is_available()" in msg and "device('cpu')" in msg


@pytest.mark.parametrize("name, arg, kind", [
    ("set_device", "cpu", ValueError), ("set_device", mt.device("cpu"), ValueError),
    ("set_device", None, ValueError), ("set_device", 1.5, ValueError),
    ("set_device", "cuda", ValueError), ("synchronize", "cpu", ValueError),
    ("get_device_name", "cpu", ValueError), ("memory_allocated", "cpu", ValueError),
    ("set_device", "tpu", RuntimeError), ("set_device", "cuda:-1", RuntimeError),
])
def test_cuda_bad_arguments_raise_before_asking_for_a_gpu(name, arg, kind):
    with pytest.raises(kind):
        getattr(mt.cuda, name)(arg)


def test_cuda_bad_arguments_match_torch(torch):
    for arg in ("cpu", None, 1.5):
        theirs = _raised(torch.cuda.set_device, arg)
        ours = _raised(mt.cuda.set_device, arg)
        assert type(theirs) is ValueError and isinstance(ours, ValueError), arg
    with pytest.raises(ValueError, match="takes a CUDA device, got 'cpu'"):
        mt.cuda.set_device("cpu")


def test_cuda_negative_index_and_none_change_nothing(torch):
    assert mt.cuda.set_device(-1) is None and torch.cuda.set_device(-1) is None
    with mt.cuda.device(-1) as ctx, torch.cuda.device(-1):
        assert isinstance(ctx, mt.cuda.device)
    with mt.cuda.device(None):
        pass
    with pytest.raises(ValueError):
        mt.cuda.device("cpu")
    with pytest.raises(ValueError):
        torch.cuda.device("cpu")


@no_gpu
def test_cuda_device_context_needs_a_gpu_when_entered():
    ctx = mt.cuda.device(0)  # making it asks nothing
    with pytest.raises(mt.cuda.CudaUnavailableError, match=r"cuda\.device\(\) needs a GPU"):
        with ctx:
            pass


def test_cuda_manual_seed_checks_its_argument():
    for fn in (mt.cuda.manual_seed, mt.cuda.manual_seed_all, mt.manual_seed):
        with pytest.raises(TypeError, match="seed must be an int"):
            fn("x")
        with pytest.raises(ValueError, match="64 bits"):
            fn(2**70)


def test_seeding_cuda_leaves_the_cpu_stream_alone():
    mt.manual_seed(5)
    a = mt.rand(3)
    mt.manual_seed(5)
    mt.cuda.manual_seed(7)
    mt.cuda.manual_seed_all(7)
    np.testing.assert_array_equal(mt.rand(3).numpy(), a.numpy())
    assert mt.initial_seed() == 5


# ---------------------------------------------------------------------------- accelerator
@no_gpu
def test_accelerator_answers_without_a_gpu_match_torch(torch):
    acc, tacc = mt.accelerator, torch.accelerator
    assert acc.is_available() is tacc.is_available() is False
    assert acc.device_count() == tacc.device_count() == 0
    assert acc.current_accelerator() is tacc.current_accelerator() is None
    assert acc.current_accelerator(check_available=True) is None
    assert tacc.current_accelerator(check_available=True) is None
    assert acc.set_device_index(-1) is None and tacc.set_device_index(-1) is None
    with acc.device_index(None), tacc.device_index(None):
        pass


@no_gpu
@pytest.mark.parametrize("name, args", [
    ("current_device_index", ()), ("set_device_index", (0,)), ("synchronize", ()),
    ("synchronize", (0,)), ("set_device_index", ("cpu",)), ("synchronize", ("cpu",)),
])
def test_accelerator_errors_match_torch(torch, name, args):
    theirs = _raised(getattr(torch.accelerator, name), *args)
    ours = _raised(getattr(mt.accelerator, name), *args)
    assert type(theirs) is RuntimeError and isinstance(ours, RuntimeError), (theirs, ours)


def test_accelerator_bad_arguments_match_torch(torch):
    for arg in (None, 1.5):
        theirs = _raised(torch.accelerator.set_device_index, arg)
        ours = _raised(mt.accelerator.set_device_index, arg)
        assert type(theirs) is ValueError and isinstance(ours, ValueError), arg


def test_accelerator_agrees_with_cuda():
    assert mt.accelerator.is_available() == mt.cuda.is_available()
    assert mt.accelerator.device_count() == mt.cuda.device_count()
    acc = mt.accelerator.current_accelerator(check_available=True)
    assert acc == (mt.device("cuda") if mt.cuda.is_available() else None)


# ---------------------------------------------------------------------------- backends
def test_backend_flags_defaults_match_torch(torch):
    for name in ("enabled", "benchmark", "deterministic", "allow_tf32"):
        # the installed torch's defaults, read before any test could have changed them here
        assert getattr(mt.backends.cudnn, name) == getattr(torch.backends.cudnn, name), name
    assert mt.backends.cudnn.is_available() == torch.backends.cudnn.is_available() is False
    assert mt.backends.cudnn.version() is torch.backends.cudnn.version() is None
    assert mt.backends.mps.is_available() == torch.backends.mps.is_available() is False
    assert mt.backends.mps.is_built() == torch.backends.mps.is_built() is False
    assert mt.backends.cuda.matmul.allow_tf32 == torch.backends.cuda.matmul.allow_tf32
    if not HAS_GPU:
        assert mt.backends.cuda.is_built() == torch.backends.cuda.is_built() is False


def test_cudnn_flags_are_settable_and_checked():
    cudnn = mt.backends.cudnn
    saved = (cudnn.enabled, cudnn.benchmark, cudnn.deterministic, cudnn.allow_tf32)
    try:
        cudnn.benchmark = True
        cudnn.deterministic = True
        cudnn.allow_tf32 = False
        cudnn.enabled = False
        assert (cudnn.enabled, cudnn.benchmark, cudnn.deterministic, cudnn.allow_tf32) == \
            (False, True, True, False)
        for bad in ("x", 1, None):
            with pytest.raises(RuntimeError, match="takes True or False"):
                cudnn.benchmark = bad
            with pytest.raises(ValueError):
                cudnn.enabled = bad
        assert cudnn.benchmark is True and cudnn.enabled is False
        cudnn.something_else = 3  # only the four switches are checked
        assert cudnn.something_else == 3
        del cudnn.something_else
    finally:
        cudnn.enabled, cudnn.benchmark, cudnn.deterministic, cudnn.allow_tf32 = saved


def test_cudnn_bad_flag_raises_what_torch_raises(torch):
    theirs = _raised(setattr, torch.backends.cudnn, "benchmark", "x")
    ours = _raised(setattr, mt.backends.cudnn, "benchmark", "x")
    assert type(theirs) is RuntimeError and isinstance(ours, RuntimeError)


def test_cudnn_flags_context_restores():
    cudnn = mt.backends.cudnn
    before = (cudnn.enabled, cudnn.benchmark, cudnn.deterministic, cudnn.allow_tf32)
    with cudnn.flags(enabled=False, benchmark=True, deterministic=True, allow_tf32=False):
        assert (cudnn.enabled, cudnn.benchmark, cudnn.deterministic, cudnn.allow_tf32) == \
            (False, True, True, False)
    assert (cudnn.enabled, cudnn.benchmark, cudnn.deterministic, cudnn.allow_tf32) == before
    with pytest.raises(RuntimeError):
        with cudnn.flags(benchmark="yes"):
            pass
    assert (cudnn.enabled, cudnn.benchmark, cudnn.deterministic, cudnn.allow_tf32) == before


def test_matmul_flags_are_checked():
    matmul = mt.backends.cuda.matmul
    saved = matmul.allow_tf32
    try:
        matmul.allow_tf32 = True
        assert matmul.allow_tf32 is True
        with pytest.raises(RuntimeError, match="allow_tf32 takes True or False"):
            matmul.allow_tf32 = 1
    finally:
        matmul.allow_tf32 = saved


# ---------------------------------------------------------------------------- distributed
@pytest.mark.parametrize("dev, name", [
    ("cpu", "mpi"), (mt.device("cpu"), "mpi"), ("cuda", "nccl"), ("cuda:1", "nccl"),
    (mt.device("cuda", 3), "nccl"),
])
def test_default_backend_for_device(dev, name):
    got = dist.get_default_backend_for_device(dev)
    assert got == name and type(got) is str
    assert got in (dist.Backend.MPI, dist.Backend.NCCL)


def test_default_backend_for_device_against_torch(torch):
    import torch.distributed as tdist

    # the same for CUDA; for the CPU torch names gloo, and mpitensor its MPI path (which
    # init_process_group also accepts as "gloo")
    assert dist.get_default_backend_for_device("cuda:0") == tdist.get_default_backend_for_device(
        "cuda:0") == "nccl"
    assert tdist.get_default_backend_for_device("cpu") == "gloo"
    assert isinstance(_raised(tdist.get_default_backend_for_device, "tpu"), RuntimeError)


def test_default_backend_for_bad_devices():
    with pytest.raises(RuntimeError, match="unknown device type 'tpu'"):
        dist.get_default_backend_for_device("tpu")
    with pytest.raises(ValueError, match="unknown device type"):
        dist.get_default_backend_for_device("mps")
    for bad in (3, None, 1.5):
        with pytest.raises(TypeError, match="takes a device or a string"):
            dist.get_default_backend_for_device(bad)


# ---------------------------------------------------------------------------- package level
def test_package_exports():
    for name in ("cuda", "accelerator", "backends", "device"):
        assert name in mt.__all__ and hasattr(mt, name)
    assert "get_default_backend_for_device" in dist.__all__
    for mod in (mt.cuda, mt.accelerator, mt.backends, mt.backends.cudnn, mt.backends.mps,
                mt.backends.cuda):
        assert all(hasattr(mod, n) for n in mod.__all__), mod.__name__


def test_threads_and_seed_exist():
    n = mt.get_num_threads()
    assert isinstance(n, int) and n >= 1
    assert isinstance(mt.manual_seed(0), mt.Generator)


# ---------------------------------------------------------------------------- a fake CuPy
class _FakeCupy(types.ModuleType):
    """Just enough of CuPy's device API for mpitensor.cuda: three GPUs, a current one."""

    def __init__(self, n: int = 3) -> None:
        super().__init__("cupy")
        fake = self
        self.n, self.current = n, 0
        self.synced: list = []
        self.freed: list = []
        self.seeded: list = []
        self.used = {i: 0 for i in range(n)}

        class Device:
            def __init__(self, i=None):
                self.id = fake.current if i is None else i

            def use(self):
                if not 0 <= self.id < fake.n:
                    raise RuntimeError("cudaErrorInvalidDevice")
                fake.current = self.id

            def synchronize(self):
                fake.synced.append(self.id)

            def __enter__(self):
                self.prev = fake.current
                self.use()
                return self

            def __exit__(self, *exc):
                fake.current = self.prev

        class RandomState:
            def __init__(self, seed):
                self.seed, self.device = seed, fake.current

        runtime = types.SimpleNamespace(
            getDeviceCount=lambda: fake.n, getDevice=lambda: fake.current,
            getDeviceProperties=lambda i: {"name": f"Fake GPU {i}".encode(), "major": 9,
                                           "minor": i})
        self.cuda = types.SimpleNamespace(Device=Device, runtime=runtime)
        self.random = types.SimpleNamespace(
            RandomState=RandomState, seed=lambda s: fake.seeded.append((fake.current, s)))
        pool = types.SimpleNamespace(
            free_all_blocks=lambda stream=None: fake.freed.append(("device", fake.current)),
            used_bytes=lambda: fake.used[fake.current],
            total_bytes=lambda: 2 * fake.used[fake.current])
        pinned = types.SimpleNamespace(
            free_all_blocks=lambda: fake.freed.append(("pinned", None)))
        self.get_default_memory_pool = lambda: pool
        self.get_default_pinned_memory_pool = lambda: pinned


@pytest.fixture
def fake_cupy(monkeypatch):
    fake = _FakeCupy()
    monkeypatch.setattr(backend, "_import_cupy", lambda: fake)
    monkeypatch.setitem(sys.modules, "cupy", fake)
    saved_cuda = dict(mt.default_generator._cuda)
    yield fake
    mt.default_generator._cuda.clear()
    mt.default_generator._cuda.update(saved_cuda)


def test_fake_cupy_answers(fake_cupy):
    assert mt.cuda.is_available() and mt.cuda.device_count() == 3
    assert mt.cuda.is_initialized()
    assert mt.accelerator.is_available() and mt.accelerator.device_count() == 3
    assert mt.accelerator.current_accelerator() == mt.device("cuda")
    assert mt.accelerator.current_accelerator(check_available=True) == mt.device("cuda")
    assert mt.backends.cuda.is_built()
    mt.cuda.init()


@pytest.mark.parametrize("arg", [2, "cuda:2", mt.device("cuda", 2), np.int32(2)])
def test_fake_set_device_and_current_device(fake_cupy, arg):
    assert mt.cuda.current_device() == 0
    mt.cuda.set_device(arg)
    assert mt.cuda.current_device() == 2 == fake_cupy.current
    assert mt.accelerator.current_device_index() == 2
    mt.cuda.set_device(-1)  # no change
    assert mt.cuda.current_device() == 2
    mt.accelerator.set_device_index(1)
    assert mt.cuda.current_device() == 1


@pytest.mark.parametrize("arg", [3, "cuda:7", mt.device("cuda", 3)])
def test_fake_set_device_out_of_range(fake_cupy, arg):
    with pytest.raises(RuntimeError, match=r"there is no GPU \d; this process sees GPUs 0 to 2"):
        mt.cuda.set_device(arg)
    with pytest.raises(ValueError, match="CUDA_VISIBLE_DEVICES"):
        mt.accelerator.set_device_index(arg)
    assert fake_cupy.current == 0
    with pytest.raises(RuntimeError, match="no GPU"):
        mt.cuda.synchronize(arg)
    with pytest.raises(RuntimeError, match="no GPU"):
        with mt.cuda.device(arg):
            pass


def test_fake_synchronize(fake_cupy):
    mt.cuda.synchronize()
    mt.cuda.synchronize(2)
    mt.cuda.synchronize("cuda:1")
    mt.cuda.synchronize("cuda")
    mt.cuda.synchronize(-1)
    mt.accelerator.synchronize(mt.device("cuda", 2))
    assert fake_cupy.synced == [0, 2, 1, 0, 0, 2]
    assert fake_cupy.current == 0  # synchronizing does not change the current GPU


def test_fake_device_context_restores(fake_cupy):
    mt.cuda.set_device(1)
    with mt.cuda.device(2):
        assert mt.cuda.current_device() == 2
        with mt.accelerator.device_index(0):
            assert mt.cuda.current_device() == 0
        assert mt.cuda.current_device() == 2
    assert mt.cuda.current_device() == 1
    with pytest.raises(KeyError):
        with mt.cuda.device("cuda:2"):
            raise KeyError("restored on the way out too")
    assert mt.cuda.current_device() == 1
    with mt.cuda.device(-1):
        assert mt.cuda.current_device() == 1


def test_fake_device_properties(fake_cupy):
    assert mt.cuda.get_device_name() == "Fake GPU 0"
    assert mt.cuda.get_device_name(2) == "Fake GPU 2"
    assert mt.cuda.get_device_name(mt.device("cuda:1")) == "Fake GPU 1"
    assert mt.cuda.get_device_capability(1) == (9, 1)
    with pytest.raises(RuntimeError, match="no GPU 3"):
        mt.cuda.get_device_name(3)


def test_fake_seeding(fake_cupy):
    gen = mt.default_generator
    mt.cuda.set_device(1)
    mt.cuda.manual_seed(11)
    assert set(gen._cuda) == {1} and gen._cuda[1].seed == 11 and gen._cuda[1].device == 1
    assert fake_cupy.seeded == [(1, 11)] and fake_cupy.current == 1
    mt.cuda.manual_seed_all(12)
    assert {i: rs.seed for i, rs in gen._cuda.items()} == {0: 12, 1: 12, 2: 12}
    assert all(rs.device == i for i, rs in gen._cuda.items())
    assert fake_cupy.seeded[1:] == [(0, 12), (1, 12), (2, 12)] and fake_cupy.current == 1
    mt.manual_seed(3)  # the global seed re-seeds every GPU, as torch.manual_seed does
    assert gen._cuda == {}


def test_fake_memory(fake_cupy):
    fake_cupy.used.update({0: 100, 2: 300})
    assert mt.cuda.memory_allocated() == 100 and mt.cuda.memory_reserved() == 200
    assert mt.cuda.memory_allocated(2) == 300 and mt.cuda.memory_reserved("cuda:2") == 600
    assert fake_cupy.current == 0
    mt.cuda.empty_cache()
    assert fake_cupy.freed == [("device", 0), ("pinned", None)]


def test_fake_gpu_without_devices(monkeypatch):
    """CuPy present, no GPU visible: CUDA is 'built', nothing is available."""
    fake = _FakeCupy(n=0)
    monkeypatch.setattr(backend, "_import_cupy", lambda: fake)
    monkeypatch.setitem(sys.modules, "cupy", fake)
    assert not mt.cuda.is_available() and mt.cuda.device_count() == 0
    assert not mt.cuda.is_initialized()
    assert mt.backends.cuda.is_built()
    assert mt.accelerator.current_accelerator() == mt.device("cuda")  # as a CUDA build answers
    assert mt.accelerator.current_accelerator(check_available=True) is None
    with pytest.raises(mt.cuda.CudaUnavailableError, match="no CUDA device is visible"):
        mt.cuda.set_device(0)
    mt.cuda.manual_seed_all(1)
    mt.cuda.empty_cache()
    assert mt.cuda.memory_allocated() == 0 and fake.freed == [] and fake.seeded == []


# ---------------------------------------------------------------------------- a real GPU
@pytest.mark.gpu
def test_gpu_cuda_api():
    n = mt.cuda.device_count()
    assert mt.cuda.is_available() and n >= 1
    mt.cuda.set_device(0)
    assert mt.cuda.current_device() == 0 == mt.accelerator.current_device_index()
    assert isinstance(mt.cuda.get_device_name(), str) and mt.cuda.get_device_name()
    major, minor = mt.cuda.get_device_capability(0)
    assert major >= 3 and minor >= 0
    x = mt.ones(1 << 20, device="cuda")
    mt.cuda.synchronize()
    mt.accelerator.synchronize()
    assert mt.cuda.is_initialized()
    assert mt.cuda.memory_allocated() >= x.numel() * 4
    assert mt.cuda.memory_reserved() >= mt.cuda.memory_allocated()
    del x
    mt.cuda.empty_cache()
    with pytest.raises(RuntimeError, match=f"no GPU {n}"):
        mt.cuda.set_device(n)
    assert mt.accelerator.current_accelerator(check_available=True) == mt.device("cuda")
    with mt.cuda.device(n - 1):
        assert mt.zeros(2, device="cuda").device == mt.device("cuda", n - 1)
    assert mt.cuda.current_device() == 0


@pytest.mark.gpu
def test_gpu_seeding_reproduces_draws():
    mt.cuda.manual_seed(3)
    a = mt.randn(5, device="cuda")
    mt.cuda.manual_seed(3)
    b = mt.randn(5, device="cuda")
    np.testing.assert_array_equal(a.cpu().numpy(), b.cpu().numpy())
    mt.cuda.manual_seed_all(4)
    c = mt.randn(5, device="cuda")
    assert not np.array_equal(a.cpu().numpy(), c.cpu().numpy())


@pytest.mark.gpu
def test_gpu_torch_style_program_and_moves():
    device, loss, grads = _program(mt)
    assert device == mt.device("cuda") and np.isfinite(loss)
    t = mt.zeros(2)
    g = t.cuda()
    assert g.is_cuda and g.device == mt.device("cuda", 0) and g.device.type == "cuda"
    assert g.cpu().device == "cpu" and t.to(mt.device("cuda:0")).is_cuda
    m = nn.Linear(2, 2).cuda()
    assert all(p.is_cuda for p in m.parameters())
    assert all(not p.is_cuda for p in m.cpu().parameters())
