"""The module paths programs import (issue 25, family 7), and the members of
``torch.utils.data`` that were missing: each checked against torch where it is installed.

- ``torch.nn.modules.*`` (``from torch.nn.modules.loss import _Loss``), its ``utils``;
- ``torch.utils.data.sampler``, ``.dataset``, ``.dataloader``; ``WeightedRandomSampler``,
  ``ChainDataset``, ``StackDataset``;
- ``torch.futures``; ``torch.onnx`` (importable, export refused); ``torch.compile`` and
  ``torch.jit`` (they return what they are given: there is no compiler here).
"""

from __future__ import annotations

import importlib
from collections import OrderedDict
from typing import Any

import numpy as np
import pytest

import mpitensor as mt
from mpitensor import nn
from mpitensor.nn import modules


def _torch() -> Any:
    return pytest.importorskip("torch")


# --------------------------------------------------------------------------- nn.modules
def test_every_nn_modules_path_names_torchs_class_there() -> None:
    _torch()
    for sub, names in modules._PATHS.items():
        ours = importlib.import_module(f"mpitensor.nn.modules.{sub}")
        theirs = importlib.import_module(f"torch.nn.modules.{sub}")
        for n in names:
            assert hasattr(theirs, n), f"torch.nn.modules.{sub} has no {n}"
            obj = getattr(ours, n)
            assert obj is getattr(nn, n, None) or obj is modules._PRIVATE.get(n)
    # and at the package's top level, as torch.nn.modules
    assert modules.Linear is nn.Linear and modules.LSTM is nn.LSTM
    assert mt.nn.modules.loss._Loss is modules._PRIVATE["_Loss"]


def test_a_custom_loss_subclasses_loss_as_in_torch() -> None:
    from mpitensor.nn.modules.loss import _Loss, _WeightedLoss

    class Scaled(_Loss):
        def forward(self, a: Any, b: Any) -> Any:
            d = (a - b) ** 2
            return d.mean() if self.reduction == "mean" else d.sum()

    assert Scaled().reduction == "mean"
    assert Scaled(reduction="sum")(mt.ones(3), mt.zeros(3)).item() == 3.0
    with pytest.warns(UserWarning):
        assert Scaled(size_average=False).reduction == "sum"  # torch's legacy flags
    w = mt.tensor([1.0, 2.0])
    assert _WeightedLoss(weight=w).weight is not None
    from mpitensor.nn.modules.batchnorm import _BatchNorm

    assert issubclass(nn.BatchNorm1d, _BatchNorm)


def test_a_missing_class_fails_at_import() -> None:
    with pytest.raises(ImportError):
        from mpitensor.nn.modules.conv import _LazyConvXdMixin  # noqa: F401 - torch-private


def test_modules_utils_match_torch() -> None:
    torch = _torch()
    from torch.nn.modules import utils as theirs

    from mpitensor.nn.modules import utils as ours

    for fn in ("_single", "_pair", "_triple", "_quadruple"):
        for v in (3, (1, 2), [4, 5, 6]):
            assert getattr(ours, fn)(v) == getattr(theirs, fn)(v), (fn, v)
    assert ours._reverse_repeat_tuple((1, 2, 3), 2) == theirs._reverse_repeat_tuple((1, 2, 3), 2)
    assert ours._list_with_default([None, 4], [1, 2, 3, 5]) == \
        theirs._list_with_default([None, 4], [1, 2, 3, 5])

    def state(lib: Any) -> OrderedDict:
        sd = OrderedDict([("module.conv.weight", 1), ("module.fc.bias", 2), ("other", 3)])
        sd._metadata = OrderedDict([("", {}), ("module", {"v": 1}), ("module.conv", {"v": 2})])
        return sd

    a, b = state(mt), state(torch)
    ours.consume_prefix_in_state_dict_if_present(a, "module.")
    theirs.consume_prefix_in_state_dict_if_present(b, "module.")
    assert dict(a) == dict(b) and dict(a._metadata) == dict(b._metadata)
    # a DDP checkpoint loads into the bare model
    model = nn.Linear(2, 1)
    saved = OrderedDict(("module." + k, v) for k, v in model.state_dict().items())
    ours.consume_prefix_in_state_dict_if_present(saved, "module.")
    nn.Linear(2, 1).load_state_dict(saved)


# ------------------------------------------------------------------------ utils.data paths
@pytest.mark.parametrize("sub", ["sampler", "dataset", "dataloader", "distributed"])
def test_utils_data_submodules_hold_torchs_names(sub: str) -> None:
    torch = _torch()
    ours = importlib.import_module(f"mpitensor.utils.data.{sub}")
    theirs = importlib.import_module(f"torch.utils.data.{sub}")
    wanted = set(getattr(theirs, "__all__", ["DistributedSampler"]))
    assert wanted <= set(dir(ours)), wanted - set(dir(ours))
    del torch


def test_weighted_random_sampler() -> None:
    from mpitensor.utils.data import WeightedRandomSampler

    g = mt.Generator().manual_seed(3)
    draws = np.array(list(WeightedRandomSampler([1.0, 3.0, 0.0, 4.0], 8000, generator=g)))
    freq = np.bincount(draws, minlength=4) / draws.size
    # binomial standard error at n = 8000 is at most 0.0056: 6 of them
    assert np.all(np.abs(freq - [0.125, 0.375, 0.0, 0.5]) < 6 * 0.0056), freq
    once = list(WeightedRandomSampler(mt.tensor([1.0, 1.0, 1.0, 1.0]), 4, replacement=False))
    assert sorted(once) == [0, 1, 2, 3]
    a = list(WeightedRandomSampler([1, 2, 3], 20, generator=mt.Generator().manual_seed(9)))
    b = list(WeightedRandomSampler([1, 2, 3], 20, generator=mt.Generator().manual_seed(9)))
    assert a == b and len(WeightedRandomSampler([1, 2], 7)) == 7
    loader = mt.utils.data.DataLoader(mt.utils.data.TensorDataset(mt.arange(4)), batch_size=5,
                                      sampler=WeightedRandomSampler([0, 0, 1, 0], 5))
    assert [b[0].tolist() for b in loader] == [[2, 2, 2, 2, 2]]


def test_weighted_random_sampler_bad_arguments_get_torchs_error() -> None:
    torch = _torch()
    for args, kw in [(([1, 2], 0), {}), (([1, 2], 2.5), {}), (([[1, 2]], 2), {}),
                     (([1, 2], 2), {"replacement": 1})]:
        with pytest.raises(Exception) as theirs:
            torch.utils.data.WeightedRandomSampler(*args, **kw)
        with pytest.raises(theirs.type):
            mt.utils.data.WeightedRandomSampler(*args, **kw)


def test_chain_and_stack_datasets_match_torch() -> None:
    torch = _torch()

    def streams(lib: Any) -> Any:
        class Count(lib.utils.data.IterableDataset):
            def __init__(self, n: int) -> None:
                self.n = n

            def __iter__(self) -> Any:
                return iter(range(self.n))

            def __len__(self) -> int:
                return self.n
        return lib.utils.data.ChainDataset([Count(2), Count(3)])

    assert list(streams(mt)) == list(streams(torch)) and len(streams(mt)) == 5
    for lib in (mt, torch):
        with pytest.raises(ValueError):
            lib.utils.data.StackDataset([1, 2], [1])
        with pytest.raises(ValueError):
            lib.utils.data.StackDataset()
    ours = mt.utils.data.StackDataset(x=[1, 2, 3], y=["a", "b", "c"])
    theirs = torch.utils.data.StackDataset(x=[1, 2, 3], y=["a", "b", "c"])
    assert [ours[i] for i in range(3)] == [theirs[i] for i in range(3)]
    assert mt.utils.data.StackDataset([1, 2], [3, 4])[1] == (2, 4)


# --------------------------------------------------------------------------- futures etc.
def test_futures_module() -> None:
    from mpitensor import futures

    f = futures.Future()
    chained = f.then(lambda fut: fut.wait() + 1)
    f.set_result(1)
    assert chained.wait() == 2
    done = [futures.Future() for _ in range(3)]
    for i, d in enumerate(done):
        d.set_result(i)
    assert futures.wait_all(done) == [0, 1, 2]
    assert [x.wait() for x in futures.collect_all(done).wait()] == [0, 1, 2]
    import mpitensor.distributed.rpc as rpc

    assert rpc.Future is futures.Future  # RPC's futures are these


def test_onnx_is_importable_and_export_says_it_is_not_supported(tmp_path: Any) -> None:
    import mpitensor.onnx as onnx

    assert onnx.is_in_onnx_export() is False
    with pytest.raises(RuntimeError, match="not supported"):
        onnx.export(nn.Linear(2, 2), (mt.zeros(1, 2),), str(tmp_path / "m.onnx"))
    assert not (tmp_path / "m.onnx").exists()


def test_compile_and_jit_return_what_they_are_given(tmp_path: Any) -> None:
    model = nn.Linear(2, 2)
    assert mt.compile(model) is model
    assert mt.compile(model, mode="max-autotune", fullgraph=True, dynamic=False) is model

    @mt.compile
    def f(x: Any) -> Any:
        return x * 2

    @mt.compile(mode="reduce-overhead")
    def g(x: Any) -> Any:
        return x + 1

    assert f(mt.ones(1)).item() == 2.0 and g(mt.ones(1)).item() == 2.0
    assert mt.jit.script(model) is model and mt.jit.trace(model, mt.zeros(1, 2)) is model

    @mt.jit.ignore
    def h() -> int:
        return 1

    @mt.jit.unused(drop=False)
    def k() -> int:
        return 2

    assert h() == 1 and k() == 2 and mt.jit.annotate(list, [1]) == [1]
    assert not mt.jit.is_scripting() and not mt.jit.is_tracing()
    assert mt.jit.wait(mt.jit.fork(lambda a: a + 1, 1)) == 2
    with pytest.raises(NotImplementedError, match="state_dict"):
        mt.jit.save(model, str(tmp_path / "m.pt"))
    assert not (tmp_path / "m.pt").exists()


def test_compile_bad_arguments_get_torchs_error() -> None:
    torch = _torch()
    for kw in (dict(mode="bogus"), dict(mode="default", options={})):
        with pytest.raises(Exception) as theirs:
            torch.compile(torch.nn.Linear(2, 2), **kw)
        with pytest.raises(theirs.type):
            mt.compile(nn.Linear(2, 2), **kw)
    with pytest.raises(AssertionError):
        mt.compile(5)
