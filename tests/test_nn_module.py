"""Unit tests of mpitensor.nn: Module, layers, containers, losses, init and models.LeNet.

Structure, naming, state_dict and init are asserted directly; where PyTorch is installed, the
same models built in torch serve as the oracle for key names, reprs, error messages, forward
values and gradients. GPU tests are marked ``gpu`` and skip where CuPy or a device is missing.
"""

from __future__ import annotations

import copy
import math
import pickle
from collections import OrderedDict

import numpy as np
import pytest

import mpitensor as mt
import mpitensor.nn as nn
import mpitensor.nn.functional as F  # noqa: N812
from mpitensor import backend
from mpitensor.models import LeNet
from mpitensor.nn import init


def arr(t) -> np.ndarray:
    return backend.to_numpy(t._data)


def _torch_lenet(torch):
    """The same LeNet-5 in torch (attribute names and forward as in mpitensor.models)."""
    tnn, tF = torch.nn, torch.nn.functional

    class TorchLeNet(tnn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = tnn.Conv2d(1, 6, 5, padding=2)
            self.conv2 = tnn.Conv2d(6, 16, 5)
            self.fc1 = tnn.Linear(400, 120)
            self.fc2 = tnn.Linear(120, 84)
            self.fc3 = tnn.Linear(84, 10)

        def forward(self, x):
            x = tF.max_pool2d(tF.relu(self.conv1(x)), 2)
            x = tF.max_pool2d(tF.relu(self.conv2(x)), 2)
            x = torch.flatten(x, 1)
            x = tF.relu(self.fc1(x))
            x = tF.relu(self.fc2(x))
            return tF.log_softmax(self.fc3(x), dim=1)

    return TorchLeNet()


class WithBuffers(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 2)
        self.register_buffer("running", mt.zeros(2))
        self.register_buffer("scratch", mt.zeros(4), persistent=False)
        self.register_buffer("steps", mt.zeros(1, dtype=mt.int64))
        self.scale = nn.Parameter(mt.ones(1))

    def forward(self, x):
        return self.fc(x)


class Shared(nn.Module):
    """One Linear registered under two names, plus a parameter shared by two modules."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(2, 2)
        self.b = self.a
        self.c = nn.Linear(2, 2)
        self.c.weight = self.a.weight


# --------------------------------------------------------------------------------------------
# Registration and attribute rules


class TestRegistration:
    def test_setattr_registers_in_order(self):
        m = WithBuffers()
        assert list(m._parameters) == ["scale"]
        assert list(m._buffers) == ["running", "scratch", "steps"]
        assert list(m._modules) == ["fc"]
        assert [n for n, _ in m.named_parameters()] == ["scale", "fc.weight", "fc.bias"]
        assert [n for n, _ in m.named_buffers()] == ["running", "scratch", "steps"]
        assert m.fc.weight is m._modules["fc"]._parameters["weight"]

    def test_reassign_and_delete(self):
        m = nn.Module()
        m.w = nn.Parameter(mt.zeros(2))
        with pytest.raises(TypeError, match="cannot assign 'mpitensor.tensor.Tensor' as "
                                            "parameter 'w'"):
            m.w = mt.zeros(2)
        m.w = None
        assert m.w is None and "w" in m._parameters
        assert list(m.parameters()) == []
        m.sub = nn.ReLU()
        with pytest.raises(TypeError, match="child module 'sub'"):
            m.sub = 3
        m.sub = nn.Identity()  # a module replaces a module
        assert isinstance(m.sub, nn.Identity)
        del m.sub
        assert "sub" not in m._modules
        with pytest.raises(AttributeError, match="has no attribute 'sub'"):
            _ = m.sub
        m.register_buffer("b", mt.ones(1))
        with pytest.raises(TypeError, match="as buffer 'b'"):
            m.b = 1.0
        m.b = mt.zeros(3)
        assert m.b.shape == (3,)
        # a parameter replaces a plain attribute and a buffer of the same name
        m.x = 3
        m.x = nn.Parameter(mt.zeros(1))
        assert "x" in m._parameters and "x" not in m.__dict__

    def test_register_errors(self):
        m = nn.Module()
        with pytest.raises(KeyError, match=r't contain "\.", got: a\.b'):
            m.register_parameter("a.b", nn.Parameter(mt.zeros(1)))
        with pytest.raises(KeyError, match="empty string"):
            m.register_buffer("", mt.zeros(1))
        with pytest.raises(TypeError, match="Parameter or None required"):
            m.register_parameter("w", mt.zeros(1))
        with pytest.raises(TypeError, match="is not a Module subclass"):
            m.add_module("x", 3)
        with pytest.raises(TypeError, match="Tensor or None required"):
            m.register_buffer("b", np.zeros(1))
        m.plain = 1
        with pytest.raises(KeyError, match="attribute 'plain' already exists"):
            m.register_buffer("plain", mt.zeros(1))

        class Early(nn.Module):
            def __init__(self):
                self.w = nn.Parameter(mt.zeros(1))

        with pytest.raises(AttributeError, match="before Module.__init__"):
            Early()
        with pytest.raises(TypeError, match="unexpected arguments"):
            nn.Module(3)

    def test_non_leaf_parameter_rejected(self):
        m = nn.Module()
        p = nn.Parameter(mt.zeros(2))
        p.grad_fn = object()  # as if made by a recorded op
        with pytest.raises(ValueError, match="non-leaf"):
            m.register_parameter("y", p)

    def test_forward_missing(self):
        with pytest.raises(NotImplementedError, match=r'Module \[Module\] is missing'):
            nn.Module()(1)

    def test_get_submodule_parameter_buffer(self):
        net = nn.Sequential(OrderedDict([("body", WithBuffers()), ("act", nn.ReLU())]))
        assert net.get_submodule("") is net
        assert net.get_submodule("body.fc") is net.body.fc
        assert net.get_parameter("body.fc.bias") is net.body.fc.bias
        assert net.get_buffer("body.running") is net.body.running
        with pytest.raises(AttributeError, match="has no attribute `nope`"):
            net.get_submodule("body.nope")
        with pytest.raises(AttributeError, match="is not an nn.Parameter"):
            net.get_parameter("body.running")
        with pytest.raises(AttributeError, match="is not a buffer"):
            net.get_buffer("body.scale")

    def test_dir_lists_members(self):
        m = WithBuffers()
        d = dir(m)
        assert {"fc", "scale", "running", "forward"} <= set(d)


# --------------------------------------------------------------------------------------------
# Iteration orders


class TestIteration:
    def test_lenet_orders(self):
        net = LeNet()
        assert [n for n, _ in net.named_children()] == ["conv1", "conv2", "fc1", "fc2", "fc3"]
        assert [n for n, _ in net.named_modules()] == ["", "conv1", "conv2", "fc1", "fc2", "fc3"]
        assert list(net.children()) == [net.conv1, net.conv2, net.fc1, net.fc2, net.fc3]
        assert list(net.modules())[0] is net
        names = [n for n, _ in net.named_parameters()]
        assert names == [f"{layer}.{k}" for layer in ("conv1", "conv2", "fc1", "fc2", "fc3")
                         for k in ("weight", "bias")]
        assert [p.shape for p in net.parameters()] == [
            (6, 1, 5, 5), (6,), (16, 6, 5, 5), (16,), (120, 400), (120,), (84, 120), (84,),
            (10, 84), (10,)]
        assert sum(p.numel() for p in net.parameters()) == 61706
        assert [n for n, _ in net.named_parameters(prefix="model")][0] == "model.conv1.weight"
        assert list(net.parameters(recurse=False)) == []

    def test_shared_modules_and_parameters_once(self):
        m = Shared()
        assert [n for n, _ in m.named_parameters()] == ["a.weight", "a.bias", "c.bias"]
        assert len(list(m.parameters())) == 3
        assert [n for n, _ in m.named_children()] == ["a", "c"]
        assert [n for n, _ in m.named_modules()] == ["", "a", "c"]
        assert [n for n, _ in m.named_modules(remove_duplicate=False)] == ["", "a", "b", "c"]
        all_names = [n for n, _ in m.named_parameters(remove_duplicate=False)]
        assert all_names == ["a.weight", "a.bias", "b.weight", "b.bias", "c.weight", "c.bias"]
        assert list(m.state_dict()) == all_names

    def test_orders_match_torch(self):
        torch = pytest.importorskip("torch")
        tnn = torch.nn

        class TShared(tnn.Module):
            def __init__(self):
                super().__init__()
                self.a = tnn.Linear(2, 2)
                self.b = self.a
                self.c = tnn.Linear(2, 2)
                self.c.weight = self.a.weight

        ours, theirs = Shared(), TShared()
        for fn in ("named_parameters", "named_modules", "named_children", "named_buffers"):
            assert [n for n, _ in getattr(ours, fn)()] == [n for n, _ in getattr(theirs, fn)()]
        assert list(ours.state_dict()) == list(theirs.state_dict())

    def test_apply_order(self):
        seen = []
        net = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.ReLU(), nn.Identity()))
        net.apply(lambda m: seen.append(type(m).__name__))
        assert seen == ["Linear", "ReLU", "Identity", "Sequential", "Sequential"]


# --------------------------------------------------------------------------------------------
# state_dict / load_state_dict


class TestStateDict:
    def test_keys_values_share_storage(self):
        m = WithBuffers()
        sd = m.state_dict()
        assert isinstance(sd, OrderedDict)
        assert list(sd) == ["scale", "running", "steps", "fc.weight", "fc.bias"]
        v = sd["fc.weight"]
        assert type(v) is mt.Tensor and not v.requires_grad
        assert v._data is m.fc.weight._data
        v[0, 0] = 42.0
        assert float(m.fc.weight[0, 0]) == 42.0
        kept = m.state_dict(keep_vars=True)
        assert kept["fc.weight"] is m.fc.weight
        dest = {}
        assert m.state_dict(destination=dest, prefix="m.") is dest
        assert list(dest)[0] == "m.scale"

    def test_keys_and_shapes_match_torch(self):
        torch = pytest.importorskip("torch")
        tnet = _torch_lenet(torch)
        ours = LeNet().state_dict()
        theirs = tnet.state_dict()
        assert list(ours) == list(theirs)
        assert [tuple(v.shape) for v in ours.values()] == [tuple(v.shape) for v in
                                                          theirs.values()]

        class TWithBuffers(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = torch.nn.Linear(3, 2)
                self.register_buffer("running", torch.zeros(2))
                self.register_buffer("scratch", torch.zeros(4), persistent=False)
                self.register_buffer("steps", torch.zeros(1, dtype=torch.int64))
                self.scale = torch.nn.Parameter(torch.ones(1))

        assert list(WithBuffers().state_dict()) == list(TWithBuffers().state_dict())
        loss_sd = nn.CrossEntropyLoss(weight=mt.ones(3)).state_dict()
        assert list(loss_sd) == list(torch.nn.CrossEntropyLoss(weight=torch.ones(3)).state_dict())

    def test_round_trip_in_place(self):
        mt.manual_seed(1)
        a, b = LeNet(), LeNet()
        ids = {n: (id(p), id(p._data)) for n, p in b.named_parameters()}
        res = b.load_state_dict(a.state_dict())
        assert res.missing_keys == [] and res.unexpected_keys == []
        assert repr(res) == "<All keys matched successfully>"
        for (n, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters()):
            np.testing.assert_array_equal(arr(pa), arr(pb))
            assert (id(pb), id(pb._data)) == ids[n]  # copied in place
            assert pb._data is not pa._data
            assert pb.requires_grad

    def test_numpy_values_and_casting(self):
        m = WithBuffers()
        sd = {k: arr(v).astype(np.float64) + 1 for k, v in m.state_dict().items()}
        sd["steps"] = np.array([7])
        m.load_state_dict(sd)
        assert m.fc.weight.dtype == mt.float32
        np.testing.assert_allclose(arr(m.fc.weight), sd["fc.weight"].astype(np.float32))
        assert int(m.steps[0]) == 7 and m.steps.dtype == mt.int64
        # torch's 0.3-era convention: a (1,)-shaped value loads into a 0-dim parameter
        z = nn.Module()
        z.p = nn.Parameter(mt.tensor(0.0))
        z.load_state_dict({"p": np.array([3.0])})
        assert float(z.p) == 3.0

    def test_assign(self):
        m = nn.Linear(2, 2)
        w_before = m.weight
        new = {"weight": mt.ones(2, 2, dtype=mt.float64), "bias": mt.zeros(2)}
        m.load_state_dict(new, assign=True)
        assert m.weight is not w_before and isinstance(m.weight, nn.Parameter)
        assert m.weight.dtype == mt.float32 and m.weight.requires_grad
        np.testing.assert_array_equal(arr(m.weight), np.ones((2, 2)))

    def test_errors_and_strict_false(self):
        m = LeNet()
        sd = m.state_dict()
        del sd["fc3.bias"]
        sd["fc4.weight"] = mt.zeros(1)
        sd["extra"] = mt.zeros(1)
        sd["conv1.weight"] = mt.zeros(6, 1, 3, 3)
        with pytest.raises(RuntimeError) as exc:
            m.load_state_dict(sd)
        assert str(exc.value) == (
            'load_state_dict into LeNet refused, nothing was loaded:\n'
            '  missing from the state dict (the model has them): "fc3.bias"\n'
            '  not in the model (the state dict has them): "fc4.weight", "extra"\n'
            "  conv1.weight: shape (6, 1, 3, 3) in the state dict, (6, 1, 5, 5) in the model\n"
            "strict=False loads the matching keys and returns the missing and unexpected ones; "
            "a wrong shape or type is an error either way")
        del sd["conv1.weight"]
        before = arr(m.conv2.weight).copy()
        sd["conv2.weight"] = mt.ones(16, 6, 5, 5)
        res = m.load_state_dict(sd, strict=False)
        assert res.missing_keys == ["conv1.weight", "fc3.bias"]
        assert res.unexpected_keys == ["fc4.weight", "extra"]
        assert "missing_keys=['conv1.weight', 'fc3.bias']" in repr(res)
        assert not np.array_equal(before, arr(m.conv2.weight))
        assert np.all(arr(m.conv2.weight) == 1)
        with pytest.raises(RuntimeError, match="expected mpitensor.Tensor or Tensor-like"):
            m.load_state_dict({**m.state_dict(), "fc1.bias": "nope"})
        with pytest.raises(TypeError, match="dict-like"):
            m.load_state_dict([1, 2])

    def test_failed_load_changes_nothing(self):
        m = nn.Linear(2, 2)
        w = arr(m.weight).copy()
        with pytest.raises(RuntimeError, match=r"bias: shape \(3,\) in the state dict"):
            m.load_state_dict({"weight": mt.ones(2, 2), "bias": mt.ones(3)})
        np.testing.assert_array_equal(arr(m.weight), w)

    def test_errors_name_what_torch_names(self):
        torch = pytest.importorskip("torch")
        tnet = _torch_lenet(torch)
        tsd = tnet.state_dict()
        del tsd["fc3.bias"]
        tsd["extra"] = torch.zeros(1)
        tsd["fc1.weight"] = torch.zeros(3, 3)
        with pytest.raises(RuntimeError) as texc:
            tnet.load_state_dict(tsd)
        m = LeNet()
        sd = m.state_dict()
        del sd["fc3.bias"]
        sd["extra"] = mt.zeros(1)
        sd["fc1.weight"] = mt.zeros(3, 3)
        with pytest.raises(RuntimeError) as exc:
            m.load_state_dict(sd)
        # the same keys and shapes as torch's message, in our words
        from .test_module_torch_parity import _load_problems

        assert _load_problems(str(exc.value)) == _load_problems(str(texc.value)) == {
            "missing": ["fc3.bias"], "unexpected": ["extra"], "shape": ["fc1.weight"]}
        assert "fc1.weight: shape (3, 3) in the state dict, (120, 400) in the model" in str(
            exc.value)

    def test_load_torch_state_dict_directly(self):
        torch = pytest.importorskip("torch")
        tnet = _torch_lenet(torch)
        m = LeNet()
        m.load_state_dict(tnet.state_dict())
        for (n, p), (tn, tp) in zip(m.named_parameters(), tnet.named_parameters()):
            assert n == tn
            np.testing.assert_array_equal(arr(p), tp.detach().numpy())

    def test_deepcopy_and_pickle(self):
        m = Shared()
        m.a.weight.grad = mt.ones(2, 2)
        c = copy.deepcopy(m)
        assert c.a is c.b and c.c.weight is c.a.weight
        assert c.a.weight is not m.a.weight
        np.testing.assert_array_equal(arr(c.a.weight), arr(m.a.weight))
        np.testing.assert_array_equal(arr(c.a.weight.grad), np.ones((2, 2)))
        p = pickle.loads(pickle.dumps(LeNet()))
        assert [n for n, _ in p.named_parameters()][-1] == "fc3.bias"
        assert isinstance(p.fc3.bias, nn.Parameter) and p.fc3.bias.requires_grad


# --------------------------------------------------------------------------------------------
# LeNet forward/backward parity with torch


@pytest.mark.parametrize("dtype,rtol,atol", [("float32", 1e-5, 1e-6), ("float64", 1e-10, 1e-12)])
def test_lenet_matches_torch(dtype, rtol, atol):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    tdt = getattr(torch, dtype)
    tnet = _torch_lenet(torch).to(tdt)
    net = LeNet().to(getattr(mt, dtype))
    net.load_state_dict(tnet.state_dict())
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 1, 28, 28)).astype(dtype)
    y = rng.integers(0, 10, 8)
    tout = tnet(torch.from_numpy(x))
    out = net(mt.tensor(x))
    assert out.dtype == getattr(mt, dtype) and out.shape == (8, 10)
    np.testing.assert_allclose(arr(out), tout.detach().numpy(), rtol=rtol, atol=atol)
    torch.nn.functional.nll_loss(tout, torch.from_numpy(y)).backward()
    loss = F.nll_loss(out, mt.tensor(y))
    loss.backward()
    for (n, p), (tn, tp) in zip(net.named_parameters(), tnet.named_parameters()):
        assert n == tn
        assert p.grad is not None and p.grad.shape == p.shape
        g, tg = arr(p.grad), tp.grad.numpy()
        np.testing.assert_allclose(g, tg, rtol=rtol * 10, atol=atol * 10 * np.abs(tg).max(),
                                   err_msg=n)


def test_layers_match_torch_modules():
    torch = pytest.importorskip("torch")
    tnn = torch.nn
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 4, 9, 9))
    pairs = [
        (nn.Conv2d(4, 6, 3, stride=2, padding=1, bias=False),
         tnn.Conv2d(4, 6, 3, stride=2, padding=1, bias=False)),
        (nn.Conv2d(4, 4, (3, 1), groups=2, dilation=(1, 2)),
         tnn.Conv2d(4, 4, (3, 1), groups=2, dilation=(1, 2))),
        (nn.MaxPool2d(3, stride=2, padding=1), tnn.MaxPool2d(3, stride=2, padding=1)),
        (nn.Sequential(nn.Flatten(), nn.Linear(324, 5), nn.ReLU(), nn.LogSoftmax(dim=1)),
         tnn.Sequential(tnn.Flatten(), tnn.Linear(324, 5), tnn.ReLU(), tnn.LogSoftmax(dim=1))),
        (nn.Sequential(nn.Flatten(0, 1), nn.Softmax(dim=-1)),
         tnn.Sequential(tnn.Flatten(0, 1), tnn.Softmax(dim=-1))),
        (nn.Identity(), tnn.Identity()),
    ]
    for ours, theirs in pairs:
        theirs = theirs.double()
        ours.double().load_state_dict(theirs.state_dict())
        assert repr(ours) == repr(theirs)
        np.testing.assert_allclose(arr(ours(mt.tensor(x))),
                                   theirs(torch.from_numpy(x)).detach().numpy(),
                                   rtol=1e-10, atol=1e-12)


@pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel")
@pytest.mark.parametrize("padding_mode,padding,kernel", [
    ("reflect", 2, 3), ("replicate", (1, 2), 3), ("circular", 1, (2, 3)),
    ("zeros", "same", 4), ("reflect", "same", (2, 3)), ("zeros", "valid", 3),
])
def test_conv2d_padding_modes_match_torch(padding_mode, padding, kernel):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 3, 7, 6))
    theirs = torch.nn.Conv2d(3, 4, kernel, padding=padding, padding_mode=padding_mode).double()
    ours = nn.Conv2d(3, 4, kernel, padding=padding, padding_mode=padding_mode).double()
    ours.load_state_dict(theirs.state_dict())
    assert repr(ours) == repr(theirs)
    xi = mt.tensor(x, requires_grad=True)
    ti = torch.tensor(x, requires_grad=True)
    out, tout = ours(xi), theirs(ti)
    np.testing.assert_allclose(arr(out), tout.detach().numpy(), rtol=1e-10, atol=1e-12)
    g = rng.standard_normal(tuple(out.shape))
    out.backward(mt.tensor(g))
    tout.backward(torch.from_numpy(g))
    np.testing.assert_allclose(arr(xi.grad), ti.grad.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(arr(ours.weight.grad), theirs.weight.grad.numpy(), rtol=1e-10,
                               atol=1e-12)


def test_conv2d_reflect_padding_too_large():
    conv = nn.Conv2d(1, 1, 3, padding=3, padding_mode="reflect")
    with pytest.raises(ValueError, match="padding smaller than the input size"):
        conv(mt.zeros(1, 1, 3, 3))


def test_loss_modules_match_torch():
    torch = pytest.importorskip("torch")
    tnn = torch.nn
    rng = np.random.default_rng(4)
    logits = rng.standard_normal((6, 5))
    logp = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    target = np.array([0, 4, 2, 2, 1, 3])
    w = rng.random(5) + 0.5
    cases = [
        (nn.NLLLoss(), tnn.NLLLoss(), logp, target),
        (nn.NLLLoss(weight=mt.tensor(w), ignore_index=2, reduction="sum"),
         tnn.NLLLoss(weight=torch.tensor(w), ignore_index=2, reduction="sum"), logp, target),
        (nn.NLLLoss(weight=mt.tensor(w)), tnn.NLLLoss(weight=torch.tensor(w)), logp, target),
        (nn.CrossEntropyLoss(reduction="none"), tnn.CrossEntropyLoss(reduction="none"), logits,
         target),
        (nn.CrossEntropyLoss(weight=mt.tensor(w), ignore_index=4),
         tnn.CrossEntropyLoss(weight=torch.tensor(w), ignore_index=4), logits, target),
        (nn.MSELoss(), tnn.MSELoss(), logits, logp),
        (nn.MSELoss(reduction="sum"), tnn.MSELoss(reduction="sum"), logits, logp),
    ]
    for ours, theirs, inp, tgt in cases:
        assert repr(ours) == repr(theirs)
        xi = mt.tensor(inp, requires_grad=True)
        ti = torch.tensor(inp, requires_grad=True)
        out = ours(xi, mt.tensor(tgt))
        tout = theirs(ti, torch.from_numpy(tgt))
        np.testing.assert_allclose(arr(out), tout.detach().numpy(), rtol=1e-10, atol=1e-12)
        gout = np.ones(tuple(out.shape))
        out.backward(mt.tensor(gout))
        tout.backward(torch.from_numpy(gout))
        np.testing.assert_allclose(arr(xi.grad), ti.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_legacy_reduction_flags():
    with pytest.warns(UserWarning, match="deprecated"):
        assert nn.MSELoss(size_average=False).reduction == "sum"
    with pytest.warns(UserWarning):
        assert nn.NLLLoss(reduce=False).reduction == "none"
    with pytest.warns(UserWarning):
        assert nn.CrossEntropyLoss(size_average=True, reduce=True).reduction == "mean"


# --------------------------------------------------------------------------------------------
# Initialisation


def _check_uniform(a: np.ndarray, bound: float):
    bound_dt = a.dtype.type(bound)  # the bound in the tensor's own precision
    assert np.abs(a).max() <= bound_dt
    n = a.size
    assert np.abs(a).max() > bound * (1 - 20 / n)  # the bound is reached, not a smaller one
    # mean 0, variance bound²/3, each within 5 standard errors
    assert abs(a.mean()) < 5 * bound / math.sqrt(3 * n)
    var_se = bound**2 * math.sqrt(4 / 45 / n)
    assert abs(a.astype(np.float64).var() - bound**2 / 3) < 5 * var_se


class TestInit:
    def test_lenet_default_init_distribution(self):
        mt.manual_seed(123)
        net = LeNet()
        fan_in = {"conv1": 25, "conv2": 150, "fc1": 400, "fc2": 120, "fc3": 84}
        for name, fi in fan_in.items():
            layer = getattr(net, name)
            _check_uniform(arr(layer.weight), 1 / math.sqrt(fi))
            b = arr(layer.bias)
            assert np.abs(b).max() <= np.float32(1 / math.sqrt(fi))
        # pooled over the biases (small each), the bias law is U(-1/sqrt(fan_in), ...)
        pooled = np.concatenate([arr(getattr(net, n).bias) * math.sqrt(fi)
                                 for n, fi in fan_in.items()])
        assert abs(pooled.mean()) < 5 / math.sqrt(3 * pooled.size)

    def test_matches_torch_bounds(self):
        torch = pytest.importorskip("torch")
        for ours, theirs in [(nn.Linear(7, 3), torch.nn.Linear(7, 3)),
                             (nn.Conv2d(3, 4, (2, 3)), torch.nn.Conv2d(3, 4, (2, 3)))]:
            assert init._calculate_fan_in_and_fan_out(ours.weight) == \
                torch.nn.init._calculate_fan_in_and_fan_out(theirs.weight)
        for nl, param in [("linear", None), ("conv2d", None), ("sigmoid", None), ("tanh", None),
                          ("relu", None), ("leaky_relu", None), ("leaky_relu", 0.2),
                          ("leaky_relu", math.sqrt(5)), ("selu", None)]:
            assert init.calculate_gain(nl, param) == torch.nn.init.calculate_gain(nl, param)

    def test_seeded_reproducibility(self):
        mt.manual_seed(7)
        a = LeNet()
        mt.manual_seed(7)
        b = LeNet()
        mt.manual_seed(8)
        c = LeNet()
        for pa, pb, pc in zip(a.parameters(), b.parameters(), c.parameters()):
            np.testing.assert_array_equal(arr(pa), arr(pb))
            assert not np.array_equal(arr(pa), arr(pc))
        g1, g2 = mt.Generator().manual_seed(5), mt.Generator().manual_seed(5)
        w1, w2 = mt.empty(10, 10), mt.empty(10, 10)
        init.kaiming_normal_(w1, generator=g1)
        init.kaiming_normal_(w2, generator=g2)
        np.testing.assert_array_equal(arr(w1), arr(w2))

    def test_functions(self):
        mt.manual_seed(0)
        w = mt.empty(200, 300)
        assert init.uniform_(w, -2.0, 3.0) is w
        a = arr(w)
        assert a.min() >= -2.0 and a.max() < 3.0 and abs(a.mean() - 0.5) < 0.05
        init.normal_(w, 1.5, 0.5)
        assert abs(arr(w).mean() - 1.5) < 0.01 and abs(arr(w).std() - 0.5) < 0.01
        init.xavier_uniform_(w, gain=2.0)
        _check_uniform(arr(w), 2.0 * math.sqrt(6 / 500))
        init.xavier_normal_(w)
        assert abs(arr(w).std() - math.sqrt(2 / 500)) < 0.02 * math.sqrt(2 / 500)
        init.kaiming_normal_(w, mode="fan_out", nonlinearity="relu")
        assert abs(arr(w).std() - math.sqrt(2 / 200)) < 0.02 * math.sqrt(2 / 200)
        init.kaiming_uniform_(w, nonlinearity="relu")
        _check_uniform(arr(w), math.sqrt(6 / 300))
        init.trunc_normal_(w, std=2.0, a=-1.0, b=1.5)
        assert arr(w).min() >= -1.0 and arr(w).max() <= 1.5 and arr(w).std() > 0.5
        init.constant_(w, 0.25)
        assert np.all(arr(w) == 0.25)
        init.ones_(w)
        assert np.all(arr(w) == 1)
        init.zeros_(w)
        assert np.all(arr(w) == 0)
        init.eye_(w)
        np.testing.assert_array_equal(arr(w), np.eye(200, 300))
        d = mt.empty(1000, 10, dtype=mt.float64)
        init.uniform_(d, -1.0, 1.0)
        assert d.dtype == mt.float64 and len(np.unique(arr(d))) == 10000

    def test_writes_in_place_without_grad(self):
        lin = nn.Linear(3, 4)
        data = lin.weight._data
        init.normal_(lin.weight)
        assert lin.weight._data is data and lin.weight.grad_fn is None
        assert lin.weight.requires_grad

    def test_errors(self):
        with pytest.raises(ValueError, match="fewer than 2 dimensions"):
            init.kaiming_uniform_(mt.empty(3))
        with pytest.raises(ValueError, match="Mode fan_avg not supported"):
            init.kaiming_normal_(mt.empty(3, 3), mode="fan_avg")
        with pytest.raises(ValueError, match="Unsupported nonlinearity gelu"):
            init.calculate_gain("gelu")
        with pytest.raises(ValueError, match="negative_slope"):
            init.calculate_gain("leaky_relu", "x")
        with pytest.raises(TypeError, match="floating point"):
            init.uniform_(mt.zeros(3, dtype=mt.int64))
        with pytest.warns(UserWarning, match="zero-element"):
            init.kaiming_uniform_(mt.empty(0, 3))


# --------------------------------------------------------------------------------------------
# Modes, devices, dtypes, gradients


class TestModesAndConversions:
    def test_train_eval_propagate(self):
        net = nn.Sequential(nn.Linear(4, 4), nn.Sequential(nn.Dropout(0.5), nn.ReLU()))
        assert all(m.training for m in net.modules())
        assert net.eval() is net
        assert not any(m.training for m in net.modules())
        net.train()
        assert all(m.training for m in net.modules())
        net.train(False)
        assert not net[1][0].training
        with pytest.raises(ValueError, match="boolean"):
            net.train("yes")

    def test_dropout_off_in_eval(self):
        mt.manual_seed(0)
        d = nn.Dropout(0.5)
        x = mt.ones(1000, dtype=mt.float64)
        y = arr(d(x))
        assert set(np.unique(y)) == {0.0, 2.0}
        assert 400 < (y == 0).sum() < 600
        d.eval()
        np.testing.assert_array_equal(arr(d(x)), np.ones(1000))
        net = nn.Sequential(nn.Dropout(0.9)).eval()
        np.testing.assert_array_equal(arr(net(x)), np.ones(1000))

    def test_to_float64_keeps_identity(self):
        net = LeNet()
        params = list(net.parameters())
        net.fc1.weight.grad = mt.ones(120, 400)
        assert net.to(mt.float64) is net
        assert list(net.parameters()) == params
        assert all(p is q for p, q in zip(net.parameters(), params))
        assert all(p.dtype == mt.float64 and p.requires_grad for p in params)
        assert isinstance(net.fc1.weight, nn.Parameter)
        assert net.fc1.weight.grad.dtype == mt.float64
        net.float()
        assert all(p.dtype == mt.float32 for p in params)
        net.to(dtype=mt.float64)
        assert net.conv1.bias.dtype == mt.float64
        net.to(mt.zeros(1))  # like a tensor: float32 on the cpu
        assert net.conv1.bias.dtype == mt.float32
        net.half()
        assert net.fc3.weight.dtype == mt.float16
        net.double().cpu()
        assert net.fc3.weight.dtype == mt.float64 and net.fc3.weight.device == "cpu"
        with pytest.raises(TypeError, match="floating point or complex"):
            net.to(mt.int64)
        with pytest.raises(TypeError, match="takes a device, a dtype or a tensor"):
            net.to(object())

    def test_to_casts_float_buffers_only(self):
        m = WithBuffers().to(mt.float64)
        assert m.running.dtype == mt.float64 and m.scratch.dtype == mt.float64
        assert m.steps.dtype == mt.int64

    def test_zero_grad_and_requires_grad(self):
        lin = nn.Linear(3, 2)
        lin.weight.grad = mt.ones(2, 3)
        lin.bias.grad = mt.ones(2)
        g = lin.weight.grad
        lin.zero_grad(set_to_none=False)
        assert lin.weight.grad is g and np.all(arr(g) == 0)
        lin.zero_grad()
        assert lin.weight.grad is None and lin.bias.grad is None
        lin.requires_grad_(False)
        assert not any(p.requires_grad for p in lin.parameters())
        lin.requires_grad_()
        assert all(p.requires_grad for p in lin.parameters())

    def test_backward_reaches_every_parameter(self):
        mt.manual_seed(0)
        net = nn.Sequential(nn.Conv2d(1, 2, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                            nn.Linear(8, 3), nn.LogSoftmax(dim=1))
        x = mt.randn(4, 1, 6, 6)
        F.nll_loss(net(x), mt.tensor([0, 1, 2, 0])).backward()
        assert all(p.grad is not None and p.grad.shape == p.shape for p in net.parameters())
        net.zero_grad()
        assert all(p.grad is None for p in net.parameters())


# --------------------------------------------------------------------------------------------
# Hooks


class TestHooks:
    def test_forward_pre_and_post_hooks(self):
        m = nn.Identity()
        calls = []
        h1 = m.register_forward_pre_hook(lambda mod, args: calls.append(("pre", args)))
        h2 = m.register_forward_pre_hook(lambda mod, args: (args[0] * 10,))
        h3 = m.register_forward_hook(lambda mod, args, out: out + 1)
        h4 = m.register_forward_hook(lambda mod, args, out: calls.append(("post", args, out)))
        assert m(2) == 21
        assert calls == [("pre", (2,)), ("post", (20,), 21)]
        for h in (h2, h3):
            h.remove()
        h3.remove()  # twice is fine
        assert m(2) == 2
        h1.remove()
        h4.remove()
        assert not m._forward_hooks and not m._forward_pre_hooks

    def test_prepend_kwargs_always_call(self):
        class Add(nn.Module):
            def forward(self, x, y=0):
                if x is None:
                    raise ValueError("boom")
                return x + y

        m = Add()
        order = []
        m.register_forward_hook(lambda mod, a, o: order.append("first"))
        m.register_forward_hook(lambda mod, a, o: order.append("prepended"), prepend=True)
        m.register_forward_pre_hook(
            lambda mod, args, kwargs: (args, {"y": kwargs.get("y", 0) + 100}), with_kwargs=True)
        m.register_forward_hook(lambda mod, a, kw, o: o * 2, with_kwargs=True)
        assert m(1, y=2) == 206
        assert order == ["prepended", "first"]
        seen = []
        with m.register_forward_hook(lambda mod, a, o: seen.append(o), always_call=True):
            with pytest.raises(ValueError, match="boom"):
                m(None)
        assert seen == [None]
        assert len(m._forward_hooks) == 3

    def test_hook_on_lenet_layer_sees_activation(self):
        net = nn.Sequential(nn.Linear(3, 5), nn.ReLU())
        acts = {}
        net[0].register_forward_hook(lambda mod, args, out: acts.update(fc=out.shape))
        net(mt.zeros(2, 3))
        assert acts == {"fc": (2, 5)}


# --------------------------------------------------------------------------------------------
# Containers


class TestContainers:
    def test_sequential(self):
        a, b, c = nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1)
        s = nn.Sequential(a, b, c)
        assert len(s) == 3 and list(s) == [a, b, c]
        assert s[0] is a and s[-1] is c
        sub = s[1:]
        assert isinstance(sub, nn.Sequential) and list(sub) == [b, c]
        assert [n for n, _ in sub.named_children()] == ["1", "2"]
        with pytest.raises(IndexError, match="out of range"):
            s[3]
        s.append(nn.Identity())
        assert len(s) == 4
        del s[1]
        assert [n for n, _ in s.named_children()] == ["0", "1", "2"] and s[1] is c
        s[2] = nn.ReLU()
        assert isinstance(s[2], nn.ReLU)
        s.insert(0, nn.Flatten())
        assert isinstance(s[0], nn.Flatten) and len(s) == 4
        popped = s.pop(0)
        assert isinstance(popped, nn.Flatten) and len(s) == 3
        both = s + nn.Sequential(nn.Identity())
        assert len(both) == 4
        od = nn.Sequential(OrderedDict([("fc", nn.Linear(2, 2)), ("act", nn.ReLU())]))
        assert list(od.state_dict()) == ["fc.weight", "fc.bias"]
        assert od.fc is od[0]

    def test_module_list(self):
        ml = nn.ModuleList([nn.Linear(2, 2), nn.ReLU()])
        ml.append(nn.Linear(2, 2))
        ml.extend([nn.Identity()])
        ml += [nn.ReLU()]
        assert len(ml) == 5 and isinstance(ml[-1], nn.ReLU)
        assert [n for n, _ in ml.named_parameters()] == ["0.weight", "0.bias", "2.weight",
                                                        "2.bias"]
        del ml[0]
        assert [n for n, _ in ml.named_children()] == ["0", "1", "2", "3"]
        assert isinstance(ml[1:], nn.ModuleList) and len(ml[1:]) == 3
        ml.insert(0, nn.Flatten())
        assert isinstance(ml[0], nn.Flatten) and len(ml) == 5
        with pytest.raises(NotImplementedError):
            ml(1)
        with pytest.raises(TypeError):
            ml.extend(3)

    def test_module_dict(self):
        d = nn.ModuleDict({"a": nn.Linear(2, 2)})
        d["b"] = nn.ReLU()
        d.update([("c", nn.Identity())])
        assert list(d) == ["a", "b", "c"] and "b" in d and len(d) == 3
        assert list(d.keys()) == ["a", "b", "c"]
        assert isinstance(d.pop("b"), nn.ReLU) and "b" not in d
        assert [n for n, _ in d.named_parameters()] == ["a.weight", "a.bias"]
        d.clear()
        assert len(d) == 0
        with pytest.raises(ValueError, match="length 3"):
            d.update([("x", nn.ReLU(), 1)])

    def test_container_reprs_match_torch(self):
        torch = pytest.importorskip("torch")
        tnn = torch.nn
        ours = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.ReLU(inplace=True),
            nn.MaxPool2d(2, ceil_mode=True), nn.Dropout(0.25), nn.Flatten(),
            nn.ModuleList([nn.Linear(4, 4) for _ in range(3)]),
            nn.ModuleDict({"sm": nn.Softmax(dim=1), "lsm": nn.LogSoftmax(dim=1)}),
            nn.AvgPool2d(2), nn.Identity(), nn.CrossEntropyLoss(), nn.MSELoss(),
            nn.Conv2d(2, 2, 3, padding="same", padding_mode="zeros", groups=2),
        )
        theirs = tnn.Sequential(
            tnn.Conv2d(3, 8, 3, padding=1, bias=False), tnn.ReLU(inplace=True),
            tnn.MaxPool2d(2, ceil_mode=True), tnn.Dropout(0.25), tnn.Flatten(),
            tnn.ModuleList([tnn.Linear(4, 4) for _ in range(3)]),
            tnn.ModuleDict({"sm": tnn.Softmax(dim=1), "lsm": tnn.LogSoftmax(dim=1)}),
            tnn.AvgPool2d(2), tnn.Identity(), tnn.CrossEntropyLoss(), tnn.MSELoss(),
            tnn.Conv2d(2, 2, 3, padding="same", padding_mode="zeros", groups=2),
        )
        assert repr(ours) == repr(theirs)
        tlenet = _torch_lenet(torch)
        assert repr(LeNet()) == repr(tlenet).replace("TorchLeNet", "LeNet")

    def test_parameter_repr_matches_torch(self):
        torch = pytest.importorskip("torch")
        values = [[0.5, -1.25], [2.0, 3.0]]
        ours = repr(nn.Parameter(mt.tensor(values, dtype=mt.float64)))
        theirs = repr(torch.nn.Parameter(torch.tensor(values, dtype=torch.float64)))
        assert ours == theirs.replace("torch.", "mpitensor.")
        assert repr(nn.Parameter(mt.tensor(values))) == repr(
            torch.nn.Parameter(torch.tensor(values)))
        assert str(nn.Parameter(mt.tensor(values))).startswith("Parameter containing:\ntensor(")


# --------------------------------------------------------------------------------------------
# Constructor validation


@pytest.mark.parametrize("make,match", [
    (lambda: nn.Linear(0, 3), "in_features must be a positive integer"),
    (lambda: nn.Linear(3, -1), "out_features must be a positive integer"),
    (lambda: nn.Linear(2.5, 3), "in_features"),
    (lambda: nn.Conv2d(1, 6, 0), "kernel_size must be positive"),
    (lambda: nn.Conv2d(1, 6, 3, stride=0), "stride must be positive"),
    (lambda: nn.Conv2d(1, 6, 3, padding=-1), "padding must be non-negative"),
    (lambda: nn.Conv2d(3, 6, 3, groups=2), "in_channels .3. must be divisible by groups"),
    (lambda: nn.Conv2d(2, 3, 3, groups=2), "out_channels .3. must be divisible by groups"),
    (lambda: nn.Conv2d(1, 6, 3, padding="full"), "invalid padding string"),
    (lambda: nn.Conv2d(1, 6, 3, padding="same", stride=2), "strided"),
    (lambda: nn.Conv2d(1, 6, 3, padding_mode="mirror"), "padding_mode must be one of"),
    (lambda: nn.Conv2d(1, 6, (3, 3, 3)), "kernel_size must be an int or a pair"),
    (lambda: nn.MaxPool2d(0), "kernel_size must be positive"),
    (lambda: nn.MaxPool2d(2, padding=2), "at most half"),
    (lambda: nn.AvgPool2d(2, padding=2), "at most half"),
    (lambda: nn.Dropout(1.5), "between 0 and 1"),
    (lambda: nn.Dropout(-0.1), "between 0 and 1"),
    (lambda: nn.NLLLoss(reduction="avg"), "not a valid value for reduction"),
    (lambda: nn.NLLLoss(weight=mt.ones(2, 2)), "must be 1-D"),
    (lambda: nn.CrossEntropyLoss(label_smoothing=2.0), "label_smoothing"),
    (lambda: nn.Flatten(1.0), "must be ints"),
    (lambda: nn.Softmax(dim="x"), "dim must be an int"),
    (lambda: LeNet(num_classes=0), "num_classes must be a positive integer"),
])
def test_constructor_rejects_bad_arguments(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_factory_kwargs():
    lin = nn.Linear(3, 2, dtype=mt.float64, device="cpu")
    assert lin.weight.dtype == mt.float64 and lin.bias.dtype == mt.float64
    conv = nn.Conv2d(2, 4, 3, bias=False, dtype=mt.float64)
    assert conv.bias is None and conv.weight.shape == (4, 2, 3, 3)
    assert list(conv.state_dict()) == ["weight"]
    with pytest.raises(TypeError, match="floating point dtype"):
        nn.Linear(2, 2, dtype=mt.int64)


def test_lenet_shapes_and_probabilities():
    mt.manual_seed(0)
    net = LeNet(num_classes=7, in_channels=3)
    assert net.conv1.weight.shape == (6, 3, 5, 5) and net.fc3.out_features == 7
    out = net(mt.randn(5, 3, 28, 28))
    assert out.shape == (5, 7)
    np.testing.assert_allclose(np.exp(arr(out)).sum(1), 1.0, rtol=1e-5)


# --------------------------------------------------------------------------------------------
# GPU


@pytest.mark.gpu
def test_cuda_round_trip_and_init_on_device():
    mt.manual_seed(0)
    net = LeNet()
    params = list(net.parameters())
    net.cuda()
    assert all(p is q for p, q in zip(net.parameters(), params))
    assert all(backend.is_cupy_array(p._data) for p in params)
    x = mt.randn(4, 1, 28, 28)
    out = net(x.cuda())
    assert backend.is_cupy_array(out._data)
    F.nll_loss(out, mt.tensor([1, 2, 3, 4]).cuda()).backward()
    assert all(backend.is_cupy_array(p.grad._data) for p in params)
    init.kaiming_uniform_(net.fc1.weight, a=math.sqrt(5))
    _check_uniform(arr(net.fc1.weight), 1 / 20)
    net.cpu()
    assert all(isinstance(p._data, np.ndarray) for p in params)
    assert all(p.grad is not None and isinstance(p.grad._data, np.ndarray) for p in params)
    sd = net.state_dict()
    net2 = LeNet().cuda()
    net2.load_state_dict(sd)
    np.testing.assert_array_equal(arr(net2.fc2.weight), arr(net.fc2.weight))
