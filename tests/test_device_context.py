"""``with mpitensor.device(...)`` and ``set_default_device``: the device factories use when
given none, as torch's (the oracle, where the two can be compared on a CPU: the device each
call reports); a CUDA default on a machine without CuPy makes the factories raise."""

from __future__ import annotations

import threading

import pytest

import mpitensor as mt
from mpitensor import backend

torch = pytest.importorskip("torch")

FACTORIES = {
    "zeros": lambda L: L.zeros(2), "ones": lambda L: L.ones(2, 3), "empty": lambda L: L.empty(2),
    "full": lambda L: L.full((2,), 1.0), "arange": lambda L: L.arange(3),
    "linspace": lambda L: L.linspace(0, 1, 3), "eye": lambda L: L.eye(2),
    "tensor": lambda L: L.tensor([1.0]), "randn": lambda L: L.randn(2),
    "rand": lambda L: L.rand(2), "randint": lambda L: L.randint(3, (2,)),
    "randperm": lambda L: L.randperm(3),
    "linear": lambda L: L.nn.Linear(2, 3).weight,
    "embedding": lambda L: L.nn.Embedding(4, 2).weight,
}


@pytest.fixture(autouse=True)
def _reset():
    yield
    mt.set_default_device(None)


def test_default_is_cpu_as_torch():
    assert str(mt.get_default_device()) == str(torch.get_default_device()) == "cpu"
    assert repr(mt.get_default_device()) == repr(torch.get_default_device())


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_factories_in_a_cpu_block(name):
    with mt.device("cpu") as d, torch.device("cpu"):
        assert d == mt.device("cpu")
        assert str(mt.get_default_device()) == str(torch.get_default_device()) == "cpu"
        made, want = FACTORIES[name](mt), FACTORIES[name](torch)
        assert str(made.device) == str(want.device) == "cpu"
        assert tuple(made.shape) == tuple(want.shape)


def test_blocks_nest_and_end():
    with mt.device("cuda:1"):
        assert mt.get_default_device() == mt.device("cuda", 1)
        with mt.device("cpu"):
            assert mt.get_default_device() == mt.device("cpu")
            assert mt.zeros(1).device == mt.device("cpu")
        assert mt.get_default_device() == mt.device("cuda", 1)
    assert mt.get_default_device() == mt.device("cpu")
    assert backend.default_factory_device() is None  # nothing asked: the fast path


def test_block_is_per_thread():
    seen = []
    with mt.device("cuda"):
        t = threading.Thread(target=lambda: seen.append(mt.get_default_device()))
        t.start()
        t.join()
        assert mt.get_default_device() == mt.device("cuda")
    assert seen == [mt.device("cpu")]


def test_set_default_device_and_a_block_over_it():
    mt.set_default_device("cuda")
    assert mt.get_default_device() == mt.device("cuda")
    with mt.device("cpu"):
        assert mt.ones(2).device == mt.device("cpu")
    mt.set_default_device(0)
    assert mt.get_default_device() == mt.device("cuda", 0)
    mt.set_default_device(None)
    assert mt.get_default_device() == mt.device("cpu")
    with pytest.raises(ValueError):
        mt.set_default_device("tpu")


def test_explicit_device_and_like_functions_keep_theirs():
    x = mt.zeros(2)
    with mt.device("cuda"):
        assert mt.zeros_like(x).device == mt.device("cpu")  # *_like: the input's device
        assert mt.zeros(2, device="cpu").device == mt.device("cpu")
        assert mt.randn(2, device="cpu").device == mt.device("cpu")


@pytest.mark.skipif(mt.cupy_available(), reason="CuPy is importable: cuda factories work here")
@pytest.mark.parametrize("name", ["zeros", "randn", "tensor", "arange", "linear"])
def test_cuda_block_without_cupy_raises_in_the_factories(name):
    with mt.device("cuda"):
        with pytest.raises(RuntimeError, match="CuPy"):
            FACTORIES[name](mt)
    assert FACTORIES[name](mt).device == mt.device("cpu")
