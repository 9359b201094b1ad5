"""The meta device (shapes and dtypes without data), ``Module.to_empty`` and
``load(..., mmap=True)``, as torch (the oracle) behaves: construction under
``with device("meta")`` draws no random numbers, ``to_empty`` then ``reset_parameters()``
gives the values a plain construction under the same seed gives, and copying data out of
a meta tensor is refused."""

from __future__ import annotations

import io

import numpy as np
import pytest

import mpitensor as mt
import mpitensor.nn as nn

torch = pytest.importorskip("torch")


def _model(lib):
    return lib.nn.Sequential(lib.nn.Linear(4, 3), lib.nn.LayerNorm(3), lib.nn.Embedding(5, 3))


def test_meta_tensors_have_shape_dtype_and_no_data():
    for lib in (mt, torch):
        with lib.device("meta"):
            x = lib.zeros(1000, 1000)
            y = lib.randn(3, dtype=lib.float64)
        assert str(x.device) == "meta" and x.is_meta and tuple(x.shape) == (1000, 1000)
        assert str(y.dtype).split(".")[-1] == "float64"
        assert str(lib.empty(2, device="meta").device) == "meta"
        assert not lib.zeros(2).is_meta
    assert mt.zeros(1000, 1000, device="meta")._data.strides == (0, 0)  # one shared slot
    assert repr(mt.device("meta")) == repr(torch.device("meta"))


def test_no_data_leaves_the_meta_device():
    x, xt = mt.zeros(3, device="meta"), torch.zeros(3, device="meta")
    with pytest.raises(NotImplementedError):
        xt.to("cpu")
    with pytest.raises(NotImplementedError, match="to_empty"):
        x.to("cpu")
    assert mt.ones(2).to("meta").is_meta


def test_meta_construction_draws_no_numbers_as_torch():
    for lib in (mt, torch):
        lib.manual_seed(0)
        want = lib.rand(3)
        lib.manual_seed(0)
        with lib.device("meta"):
            m = _model(lib)
        assert all(p.is_meta for p in m.parameters())
        np.testing.assert_array_equal(lib.rand(3).numpy(), want.numpy())


def test_to_empty_then_reset_equals_a_plain_construction():
    mt.manual_seed(3)
    plain = _model(mt)
    mt.manual_seed(3)
    with mt.device("meta"):
        m = _model(mt)
    weight = m[0].weight
    assert m.to_empty(device="cpu") is m
    assert m[0].weight is weight and not weight.is_meta and weight.device == mt.device("cpu")
    for layer in m:
        layer.reset_parameters()
    for (name, p), q in zip(m.named_parameters(), plain.parameters()):
        np.testing.assert_array_equal(p.detach().numpy(), q.detach().numpy(), err_msg=name)
        assert p.requires_grad
    with mt.device("meta"):
        t = nn.Linear(2, 2)
    tt = torch.nn.Linear(2, 2, device="meta").to_empty(device="cpu")
    assert str(t.to_empty(device="cpu").weight.device) == str(tt.weight.device) == "cpu"


def test_to_empty_keeps_what_is_already_there():
    m = nn.Linear(2, 2)
    w = m.weight.detach().numpy().copy()
    m.to_empty(device="cpu")
    np.testing.assert_array_equal(m.weight.detach().numpy(), w)  # any values are "empty" ones


def test_load_with_mmap_gives_the_same_tensors(tmp_path):
    sd = _model(mt).state_dict()
    for i, save in enumerate((mt.save, lambda obj, p: torch.save(
            {k: torch.tensor(v.numpy()) for k, v in obj.items()}, p))):
        path = tmp_path / f"m{i}.pt"
        save(sd, path)
        got = mt.load(path, mmap=True, weights_only=True, map_location="cpu")
        assert sorted(got) == sorted(sd)
        for k in sd:
            np.testing.assert_array_equal(got[k].numpy(), sd[k].numpy(), err_msg=k)
    with pytest.raises(ValueError, match="file path"):
        mt.load(io.BytesIO(b""), mmap=True)
    with pytest.raises(TypeError, match="mmap"):
        mt.load(tmp_path / "m0.pt", mmap="yes")


def test_meta_views_stay_meta_and_arithmetic_computes_shapes_only():
    """Views keep the meta device, as torch's do; arithmetic gives a meta tensor of torch's
    shape (tests/test_meta_shapes.py has the whole table)."""
    x = mt.zeros(3, 4, device="meta")
    for v in (x.reshape(4, 3), x.t(), x[1:], x.unsqueeze(0)):
        assert v.is_meta and str(v.device) == "meta"
    assert tuple(x.t().shape) == tuple(torch.zeros(3, 4, device="meta").t().shape)
    xt = torch.zeros(3, 4, device="meta")
    for op in (lambda L, x: x + 1, lambda L, x: x * x, lambda L, x: x.sum(),
               lambda L, x: x @ x.t()):
        got, want = op(mt, x), op(torch, xt)
        assert got.is_meta and tuple(got.shape) == tuple(want.shape)


def test_meta_repr_as_torch():
    for make in (lambda lib: lib.zeros(3, device="meta"),
                 lambda lib: lib.zeros(2, 3, device="meta", dtype=lib.float64),
                 lambda lib: lib.nn.Parameter(lib.zeros(2, device="meta"))):
        assert repr(make(mt)).replace("mpitensor.", "torch.") == repr(make(torch))


def test_no_values_come_out_of_a_meta_tensor():
    """Reading values out of a meta tensor raises, as torch's does, instead of giving the
    shared slot's zeros; contiguous() keeps it meta."""
    x = mt.zeros(2, 3, device="meta")
    for read in (lambda: x.numpy(), lambda: x.tolist(), lambda: x[0, 0].item(),
                 lambda: float(x[0, 0]), lambda: x._data.tobytes()):
        with pytest.raises(NotImplementedError, match="meta tensor"):
            read()
    with pytest.raises(NotImplementedError):
        torch.zeros(2, 3, device="meta").tolist()
    assert x.t().contiguous().is_meta and x.contiguous() is x
