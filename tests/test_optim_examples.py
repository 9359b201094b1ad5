"""Every optimizer's docstring Example runs as written and prints what it says.

Each example shows something of its own algorithm (Adamax's infinity norm, ASGD's average,
Adagrad's growing sum, RAdam's rectification switching on, Adadelta's unit-free step); the
figures in them were checked against torch.optim, and the oracle test below re-checks them.
"""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = ["adadelta", "adafactor", "adagrad", "adam", "adamax", "asgd", "lbfgs", "muon",
           "nadam", "radam", "rmsprop", "rprop", "sgd", "sparse_adam", "optimizer"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    mod = importlib.import_module(f"mpitensor.optim.{name}")
    result = doctest.testmod(mod, optionflags=doctest.ELLIPSIS, report=False)
    assert result.attempted > 0, f"mpitensor.optim.{name} has no example"
    assert result.failed == 0, f"{result.failed} example line(s) of mpitensor.optim.{name} fail"


def _trajectory(lib, name, kwargs, grads, key):
    w = lib.tensor([1.0], requires_grad=True)
    opt = getattr(lib.optim, name)([w], **kwargs)
    path = []
    for g in grads:
        w.grad = lib.tensor([g])
        opt.step()
        path.append(float(w.detach()[0]))
    extra = float(opt.state[w][key].reshape(-1)[0]) if key else None
    return path, extra


CASES = [
    ("Adamax", {"lr": 0.1}, [4.0, 1.0], "exp_inf"),
    ("ASGD", {"lr": 0.1, "lambd": 0.0, "t0": 0}, [2.0, 2.0, 2.0], "ax"),
    ("Adagrad", {"lr": 0.5}, [4.0, 4.0], "sum"),
    ("RAdam", {"lr": 0.1}, [2.0] * 6, None),
    ("Adadelta", {}, [1.0], "acc_delta"),
]


@pytest.mark.parametrize("name,kwargs,grads,key", CASES, ids=[c[0] for c in CASES])
def test_example_figures_match_torch(name, kwargs, grads, key):
    torch = pytest.importorskip("torch", reason="torch is the oracle for the examples' figures")
    import mpitensor

    ours = _trajectory(mpitensor, name, kwargs, grads, key)
    theirs = _trajectory(torch, name, kwargs, grads, key)
    # a handful of float32 updates: a few ulps of the weights' magnitude
    assert ours[0] == pytest.approx(theirs[0], rel=1e-5, abs=1e-6)
    if key:
        assert ours[1] == pytest.approx(theirs[1], rel=1e-5)
