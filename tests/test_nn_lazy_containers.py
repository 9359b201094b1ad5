"""Lazy modules, UninitializedParameter/Buffer, Buffer, ParameterList/ParameterDict and
Container against torch: reprs, state-dict keys and shapes, materialisation from the first
input and from a state dict, the class each becomes, values after loading torch's weights,
and the errors of placeholders used too early."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import mpitensor as mt
import mpitensor.nn as nn

from .nn_oracle import both, tol

torch = pytest.importorskip("torch")

CASES = [("LazyLinear", (3,), (2, 5)), ("LazyConv1d", (4, 3), (6, 9)),
         ("LazyConv2d", (4, 3), (2, 6, 7, 7)), ("LazyConv3d", (4, 2, 1, 0, 1, 2), (2, 6, 3, 4, 4)),
         ("LazyConvTranspose1d", (4, 3, 2), (2, 6, 5)),
         ("LazyConvTranspose2d", (4, 3, 2, 1, 1), (2, 6, 5, 5)),
         ("LazyConvTranspose3d", (4, 2), (2, 6, 3, 3, 3)), ("LazyBatchNorm1d", (), (4, 3)),
         ("LazyBatchNorm2d", (), (2, 3, 4, 4)), ("LazyBatchNorm3d", (), (2, 3, 2, 4, 4)),
         ("LazyInstanceNorm1d", (), (2, 3, 8)), ("LazyInstanceNorm2d", (), (2, 3, 4, 4)),
         ("LazyInstanceNorm3d", (), (2, 3, 2, 4, 4))]


@pytest.mark.parametrize("name,args,shape", CASES)
def test_lazy_module_materialises_and_becomes_the_layer(name, args, shape):
    ours, theirs = getattr(nn, name)(*args), getattr(torch.nn, name)(*args)
    assert repr(ours) == repr(theirs)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert ours.has_uninitialized_params()
    ours(mt.randn(*shape))
    theirs(torch.randn(*shape))
    assert type(ours).__name__ == type(theirs).__name__ == name[4:]
    assert repr(ours) == repr(theirs)
    assert [tuple(v.shape) for v in ours.state_dict().values()] == \
        [tuple(v.shape) for v in theirs.state_dict().values()]
    assert all(type(p) is nn.Parameter for p in ours.parameters())


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name,args,shape", CASES)
def test_lazy_module_loads_torch_weights_then_computes_like_torch(dtype, name, args, shape):
    tdt = torch.float32 if dtype == np.float32 else torch.float64
    theirs = getattr(torch.nn, name)(*args).to(tdt)
    theirs(torch.randn(*shape, dtype=tdt))  # materialise, and move the running statistics
    ours = getattr(nn, name)(*args).to(mt.float32 if dtype == np.float32 else mt.float64)
    ours.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})
    assert not ours.has_uninitialized_params()
    assert repr(ours)[4:].split("(")[1] == repr(theirs).split("(")[1]  # the sizes are known
    ours.eval()
    theirs.eval()
    both(ours, theirs, [np.random.default_rng(3).standard_normal(shape)], dtype,
         tol(dtype, int(np.prod(shape))))
    assert type(ours).__name__ == name[4:]


def test_lazy_dtype_moves_before_materialising():
    layer = nn.LazyLinear(3).double()
    assert layer.weight.dtype == mt.float64
    layer(mt.ones(2, 4, dtype=mt.float64))
    assert layer.weight.dtype == mt.float64 and tuple(layer.weight.shape) == (3, 4)
    conv = nn.LazyConv2d(4, 3, groups=2)
    with pytest.raises(ValueError):
        conv(mt.ones(1, 3, 5, 5))
    with pytest.raises(RuntimeError):
        nn.LazyConv2d(4, 3)(mt.ones(5, 5))


def test_uninitialized_placeholders_refuse_use():
    p = nn.UninitializedParameter()
    assert repr(p) == repr(torch.nn.UninitializedParameter()) == "<UninitializedParameter>"
    for use, err in [(lambda: p + 1, ValueError), (lambda: p.sum(), ValueError),
                     (lambda: p.numel(), ValueError), (lambda: p.shape, RuntimeError),
                     (lambda: mt.ones(2) @ p, ValueError), (lambda: p[0], ValueError)]:
        with pytest.raises(err):
            use()
    p.materialize((2, 3))
    assert type(p) is nn.Parameter and tuple(p.shape) == (2, 3) and p.requires_grad
    b = nn.UninitializedBuffer(dtype=mt.float64)
    b.materialize(4)
    assert type(b) is mt.Tensor and b.dtype == mt.float64 and not b.requires_grad
    with pytest.raises(ValueError):
        nn.LazyLinear(3).weight * 2


def test_buffer_registers_itself():
    m, t = nn.Module(), torch.nn.Module()
    m.a, t.a = nn.Buffer(mt.ones(2)), torch.nn.Buffer(torch.ones(2))
    m.b, t.b = nn.Buffer(mt.zeros(1), persistent=False), torch.nn.Buffer(torch.zeros(1),
                                                                         persistent=False)
    assert list(m.state_dict()) == list(t.state_dict()) == ["a"]
    assert [n for n, _ in m.named_buffers()] == [n for n, _ in t.named_buffers()] == ["a", "b"]
    assert list(m.parameters()) == []


def test_parameter_list():
    ours = nn.ParameterList([mt.ones(2), nn.Parameter(mt.zeros(3)), "x"])
    theirs = torch.nn.ParameterList([torch.ones(2), torch.nn.Parameter(torch.zeros(3)), "x"])
    assert list(ours.state_dict()) == list(theirs.state_dict()) == ["0", "1"]
    assert repr(ours) == repr(theirs).replace("torch.", "mpitensor.")
    assert ours[2] == "x" and len(ours) == 3 and isinstance(ours[0], nn.Parameter)
    assert ours[-3] is ours[0] and len(ours[0:2]) == 2
    ours.append(mt.ones(1))
    ours += [mt.ones(4)]
    ours[0] = mt.full((2,), 5.0)
    assert len(list(ours.parameters())) == 4 and float(ours[0].sum()) == 10.0
    with pytest.raises(IndexError):
        ours[9]
    with pytest.raises(TypeError):
        ours.extend(mt.ones(2))
    model = nn.Module()
    model.ps = ours
    assert list(model.state_dict()) == ["ps.0", "ps.1", "ps.3", "ps.4"]


def test_parameter_dict():
    ours = nn.ParameterDict({"b": mt.ones(2), "a": mt.zeros(1)})
    theirs = torch.nn.ParameterDict({"b": torch.ones(2), "a": torch.zeros(1)})
    assert list(ours.state_dict()) == list(theirs.state_dict()) == ["a", "b"]
    ours["c"] = mt.ones(3)
    assert "c" in ours and isinstance(ours["c"], nn.Parameter)
    assert list(ours.keys()) == ["a", "b", "c"]
    assert ours.pop("a").shape == (1,) and list(ours) == ["b", "c"]
    assert ours.popitem()[0] == "c"
    merged = ours | nn.ParameterDict({"z": mt.ones(1)})
    assert list(merged.keys()) == ["b", "z"] and ours.get("z") is None
    assert ours.setdefault("d", mt.ones(2)).shape == (2,)
    ours.update([("e", mt.ones(1))])
    assert list(ours.state_dict()) == ["b", "d", "e"]
    ours.clear()
    assert len(ours) == 0 and list(ours.parameters()) == []
    with pytest.raises(KeyError):
        ours["nope"]
    with pytest.raises(TypeError):
        ours.update(3)


def test_container_is_deprecated():
    with pytest.warns(FutureWarning):
        c = nn.Container(act=nn.ReLU())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t = torch.nn.Container(act=torch.nn.ReLU())
    assert repr(c) == repr(t)


def test_module_paths():
    from mpitensor.nn.modules.container import ParameterDict, ParameterList
    from mpitensor.nn.modules.lazy import LazyModuleMixin
    from mpitensor.nn.modules.linear import LazyLinear

    from mpitensor.nn.parameter import UninitializedParameter
    assert issubclass(LazyLinear, LazyModuleMixin) and ParameterList and ParameterDict
    assert UninitializedParameter is nn.UninitializedParameter


def test_data_of_a_lazy_parameter_is_empty_as_in_torch() -> None:
    """d2l's ``net.weight.data.normal_(0, 0.01)`` on a LazyLinear before its first forward:
    ``.data`` is an empty tensor (torch's too), so nothing is written and the first forward
    initialises the layer as usual; writing through the placeholder itself raises."""
    torch = pytest.importorskip("torch")
    for lib in (mt, torch):
        lazy = lib.nn.LazyLinear(3)
        d = lazy.weight.data
        assert tuple(d.shape) == (0,)
        d.normal_(0, 0.01)
        lazy.bias.data.fill_(0)
        assert tuple(lazy(lib.ones(2, 4)).shape) == (2, 3)
        assert tuple(lazy.weight.shape) == (3, 4)
    with pytest.raises(ValueError, match="not initialized"):
        mt.nn.init.normal_(mt.nn.LazyLinear(3).weight)
    with pytest.raises(ValueError, match="not initialized"):
        mt.nn.init.zeros_(mt.nn.LazyLinear(3).bias)
