"""F.affine_grid, F.grid_sample and F.conv_tbc against torch: values and gradients (input,
grid, theta, weights) in float32 and float64, every mode and padding mode, both
align_corners, and bad arguments."""

from __future__ import annotations

import numpy as np
import pytest

import mpitensor as mt
import mpitensor.nn.functional as F

from .nn_oracle import both, tol

torch = pytest.importorskip("torch")
TF = torch.nn.functional
rng = np.random.default_rng(7)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("nd", [2, 3])
@pytest.mark.parametrize("align", [True, False])
def test_affine_grid(dtype, nd, align):
    size = (2, 3, 4, 5) if nd == 2 else (2, 3, 3, 4, 5)
    both(lambda t: F.affine_grid(t, size, align_corners=align),
         lambda t: TF.affine_grid(t, size, align_corners=align),
         [rng.standard_normal((2, nd, nd + 1))], dtype, tol(dtype, 4))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("nd", [2, 3])
@pytest.mark.parametrize("align", [True, False])
@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
def test_grid_sample(dtype, nd, align, mode, padding):
    size = (2, 3, 4, 5) if nd == 2 else (2, 3, 3, 4, 5)
    out = (2, 3, 4, nd) if nd == 2 else (2, 2, 3, 4, nd)
    grid = rng.uniform(-1.4, 1.4, out)  # random points: none on a cell edge
    both(lambda x, g: F.grid_sample(x, g, mode, padding, align),
         lambda x, g: TF.grid_sample(x, g, mode, padding, align),
         [rng.standard_normal(size), grid], dtype,
         tol(dtype, 64) if dtype == np.float32 else 1e-12)


def test_grid_sample_bad_arguments():
    x, g = np.zeros((1, 1, 3, 3)), np.zeros((1, 2, 2, 2))
    for kw, err in [(dict(mode="cubic"), ValueError), (dict(padding_mode="wrap"), ValueError)]:
        with pytest.raises(err):
            TF.grid_sample(torch.tensor(x), torch.tensor(g), align_corners=False, **kw)
        with pytest.raises(err):
            F.grid_sample(torch_free(x), torch_free(g), align_corners=False, **kw)
    with pytest.raises(NotImplementedError):
        F.grid_sample(torch_free(x), torch_free(g), mode="bicubic", align_corners=False)
    with pytest.raises(RuntimeError):
        F.grid_sample(torch_free(x), torch_free(np.zeros((1, 2, 2, 3))), align_corners=False)
    with pytest.raises(ValueError):
        F.affine_grid(torch_free(np.zeros((1, 2, 3))), (1, 1, 2, 2, 2), align_corners=False)
    with pytest.warns(UserWarning):
        F.affine_grid(torch_free(np.zeros((1, 2, 3))), (1, 1, 2, 2))


def torch_free(a):
    return mt.tensor(a)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("pad", [0, 1, 2])
def test_conv_tbc(dtype, pad):
    both(lambda x, w, b: F.conv_tbc(x, w, b, pad), lambda x, w, b: torch.conv_tbc(x, w, b, pad),
         [rng.standard_normal((7, 2, 3)), rng.standard_normal((3, 3, 4)),
          rng.standard_normal(4)], dtype, tol(dtype, 20))
    with pytest.raises(RuntimeError):
        F.conv_tbc(torch_free(np.zeros((7, 2, 3))), torch_free(np.zeros((3, 2, 4))),
                   torch_free(np.zeros(4)))
