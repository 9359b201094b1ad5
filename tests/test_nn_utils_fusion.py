"""nn.utils: fuse_conv_bn_eval / fuse_linear_bn_eval and their *_weights forms, skip_init and
the deprecated clip_grad_norm, against torch where it is installed."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import mpitensor as mt
from mpitensor import nn


def _torch() -> Any:
    return pytest.importorskip("torch")


def _copy_into(ours: Any, theirs: Any) -> None:
    ours.load_state_dict({k: mt.tensor(v.detach().numpy()) for k, v in
                          theirs.state_dict().items()})


def _trained_bn(lib: Any, cls: str, n: int) -> Any:
    bn = getattr(lib.nn, cls)(n).double()
    with lib.no_grad():
        bn.running_mean.copy_(lib.linspace(-1, 1, n, dtype=lib.float64))
        bn.running_var.copy_(lib.linspace(0.5, 2, n, dtype=lib.float64))
        bn.weight.copy_(lib.linspace(0.5, 1.5, n, dtype=lib.float64))
        bn.bias.copy_(lib.linspace(-0.2, 0.2, n, dtype=lib.float64))
    return bn.eval()


@pytest.mark.parametrize("conv, bn, shape, transpose", [
    ("Conv2d", "BatchNorm2d", (2, 3, 7, 7), False),
    ("Conv1d", "BatchNorm1d", (2, 3, 9), False),
    ("ConvTranspose2d", "BatchNorm2d", (2, 3, 5, 5), True),
])
def test_fused_convolution_matches_torch_and_the_pair(conv: str, bn: str, shape: tuple,
                                                      transpose: bool) -> None:
    torch = _torch()
    tconv = getattr(torch.nn, conv)(3, 4, 3).double().eval()
    tbn = _trained_bn(torch, bn, 4)
    mconv = getattr(nn, conv)(3, 4, 3, dtype="float64").eval()
    mbn = _trained_bn(mt, bn, 4)
    _copy_into(mconv, tconv)
    fused = nn.utils.fuse_conv_bn_eval(mconv, mbn, transpose=transpose)
    theirs = torch.nn.utils.fuse_conv_bn_eval(tconv, tbn, transpose=transpose)
    for name in ("weight", "bias"):
        np.testing.assert_allclose(getattr(fused, name).detach().numpy(),
                                   getattr(theirs, name).detach().numpy(), rtol=1e-12, atol=0)
        assert isinstance(getattr(fused, name), nn.Parameter)
    x = mt.tensor(np.random.default_rng(0).standard_normal(shape))
    want = mbn(mconv(x)).detach().numpy()
    np.testing.assert_allclose(fused(x).detach().numpy(), want, rtol=0,
                               atol=1e-12 * np.abs(want).max())
    assert mconv.weight is not fused.weight  # a new module; the old one is left as it was


def test_fused_linear_matches_torch() -> None:
    torch = _torch()
    tlin = torch.nn.Linear(5, 4).double().eval()
    mlin = nn.Linear(5, 4, dtype="float64").eval()
    _copy_into(mlin, tlin)
    fused = nn.utils.fuse_linear_bn_eval(mlin, _trained_bn(mt, "BatchNorm1d", 4))
    theirs = torch.nn.utils.fuse_linear_bn_eval(tlin, _trained_bn(torch, "BatchNorm1d", 4))
    np.testing.assert_allclose(fused.weight.detach().numpy(), theirs.weight.detach().numpy(),
                               rtol=1e-12)
    np.testing.assert_allclose(fused.bias.detach().numpy(), theirs.bias.detach().numpy(),
                               rtol=1e-12)


def test_fusion_refuses_training_mode_like_torch() -> None:
    torch = _torch()
    for lib in (mt, torch):
        with pytest.raises(AssertionError):
            lib.nn.utils.fuse_conv_bn_eval(lib.nn.Conv2d(3, 4, 3), lib.nn.BatchNorm2d(4))
        with pytest.raises(AssertionError):
            lib.nn.utils.fuse_linear_bn_eval(lib.nn.Linear(3, 4).eval(),
                                             lib.nn.BatchNorm1d(5).eval())


def test_skip_init() -> None:
    torch = _torch()
    layer = nn.utils.skip_init(nn.Linear, 4, 2, bias=False)
    assert tuple(layer.weight.shape) == (2, 4) and layer.bias is None
    assert np.isnan(layer.weight.detach().numpy()).all()  # unspecified: visible if used
    nn.init.zeros_(layer.weight)
    assert layer(mt.ones(1, 4)).tolist() == [[0.0, 0.0]]

    class NoDevice(nn.Module):
        def __init__(self, n: int) -> None:
            super().__init__()

    class NoDeviceT(torch.nn.Module):
        def __init__(self, n: int) -> None:
            super().__init__()

    with pytest.raises(RuntimeError):
        torch.nn.utils.skip_init(NoDeviceT, 3)
    with pytest.raises(RuntimeError, match="device"):
        nn.utils.skip_init(NoDevice, 3)


def test_deprecated_clip_grad_norm_warns_and_clips() -> None:
    p = nn.Parameter(mt.ones(4))
    p.grad = mt.full((4,), 3.0)
    with pytest.warns(FutureWarning, match="clip_grad_norm_"):
        total = nn.utils.clip_grad_norm([p], 1.0)
    assert abs(total.item() - 6.0) < 1e-6
    assert abs(float(p.grad.norm()) - 1.0) < 1e-5


# ------------------------------------------------------------------ weight and spectral norm
def _same_params(ours: Any, theirs: Any) -> None:
    assert list(ours.state_dict()) == list(theirs.state_dict())
    ours.load_state_dict({k: mt.tensor(v.detach().numpy()) for k, v in
                          theirs.state_dict().items()})


@pytest.mark.parametrize("cls, args, dim, shape", [
    ("Linear", (5, 4), 0, (3, 5)),
    ("Conv2d", (3, 4, 3), 0, (2, 3, 6, 6)),
    ("Conv2d", (3, 4, 3), None, (2, 3, 6, 6)),
    ("Linear", (5, 4), 1, (3, 5)),
])
def test_weight_norm_matches_torch(cls: str, args: tuple, dim: Any, shape: tuple) -> None:
    torch = _torch()
    theirs = torch.nn.utils.weight_norm(getattr(torch.nn, cls)(*args).double(), dim=dim)
    ours = nn.utils.weight_norm(getattr(nn, cls)(*args, dtype="float64"), dim=dim)
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in theirs.named_parameters()]
    _same_params(ours, theirs)
    x = np.random.default_rng(1).standard_normal(shape)
    yo, yt = ours(mt.tensor(x)), theirs(torch.tensor(x))
    np.testing.assert_allclose(yo.detach().numpy(), yt.detach().numpy(), rtol=1e-12, atol=1e-12)
    (yo ** 2).sum().backward()
    (yt ** 2).sum().backward()
    for (n, a), (_, b) in zip(ours.named_parameters(), theirs.named_parameters()):
        np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=1e-10, atol=1e-12,
                                   err_msg=n)
    nn.utils.remove_weight_norm(ours)
    torch.nn.utils.remove_weight_norm(theirs)
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in theirs.named_parameters()]
    np.testing.assert_allclose(ours.weight.detach().numpy(), theirs.weight.detach().numpy(),
                               rtol=1e-12)
    for lib, m in ((mt, ours), (torch, theirs)):
        with pytest.raises(ValueError):
            lib.nn.utils.remove_weight_norm(m)


@pytest.mark.parametrize("cls, args, shape", [
    ("Linear", (5, 4), (3, 5)),
    ("Conv2d", (3, 4, 3), (2, 3, 6, 6)),
    ("ConvTranspose2d", (3, 4, 3), (2, 3, 5, 5)),
])
def test_spectral_norm_matches_torch(cls: str, args: tuple, shape: tuple) -> None:
    torch = _torch()
    theirs = torch.nn.utils.spectral_norm(getattr(torch.nn, cls)(*args).double(),
                                          n_power_iterations=2)
    ours = nn.utils.spectral_norm(getattr(nn, cls)(*args, dtype="float64"),
                                  n_power_iterations=2)
    _same_params(ours, theirs)  # weight_orig, and the vectors u and v torch drew
    x = np.random.default_rng(2).standard_normal(shape)
    for _ in range(2):  # training: power iteration refines u and v at each forward
        yo, yt = ours(mt.tensor(x)), theirs(torch.tensor(x))
        np.testing.assert_allclose(yo.detach().numpy(), yt.detach().numpy(), rtol=1e-10,
                                   atol=1e-12)
    for k in ("weight_u", "weight_v"):
        np.testing.assert_allclose(ours.state_dict()[k].numpy(), theirs.state_dict()[k].numpy(),
                                   rtol=1e-10, atol=1e-14)
    (yo ** 2).sum().backward()
    (yt ** 2).sum().backward()
    np.testing.assert_allclose(ours.weight_orig.grad.numpy(), theirs.weight_orig.grad.numpy(),
                               rtol=1e-9, atol=1e-12)
    ours.eval()
    theirs.eval()
    before = ours.state_dict()["weight_u"].numpy().copy()
    np.testing.assert_allclose(ours(mt.tensor(x)).detach().numpy(),
                               theirs(torch.tensor(x)).detach().numpy(), rtol=1e-10, atol=1e-12)
    assert np.array_equal(ours.state_dict()["weight_u"].numpy(), before)  # eval: no iteration
    nn.utils.remove_spectral_norm(ours)
    torch.nn.utils.remove_spectral_norm(theirs)
    assert list(ours.state_dict()) == list(theirs.state_dict()) == ["bias", "weight"]
    np.testing.assert_allclose(ours.weight.detach().numpy(), theirs.weight.detach().numpy(),
                               rtol=1e-10, atol=1e-12)
    for lib in (mt, torch):
        with pytest.raises(ValueError):
            lib.nn.utils.spectral_norm(lib.nn.Linear(2, 2), n_power_iterations=0)
