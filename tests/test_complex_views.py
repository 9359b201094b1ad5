"""view_as_real, view_as_complex, complex and polar against torch (the oracle): values,
shared memory, strides torch accepts and refuses, and gradients (torch's convention for
complex numbers: the gradient of a product carries the other factor's conjugate)."""

from __future__ import annotations

import numpy as np
import pytest

import mpitensor as mt

torch = pytest.importorskip("torch")

# float32 results of one product and one cos/sin each: a few units of float32 rounding
TOL = {np.float32: dict(rtol=1e-6, atol=1e-6), np.float64: dict(rtol=1e-14, atol=1e-14)}


def _pair(a: np.ndarray, grad: bool = False):
    return mt.tensor(a, requires_grad=grad), torch.tensor(a, requires_grad=grad)


@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_view_as_complex_values_and_shared_memory(dt):
    a = np.arange(24, dtype=dt).reshape(3, 4, 2)
    x, xt = _pair(a)
    z, zt = mt.view_as_complex(x), torch.view_as_complex(xt)
    assert z.shape == tuple(zt.shape) == (3, 4)
    assert str(z.dtype).split(".")[-1] == str(zt.dtype).split(".")[-1]
    np.testing.assert_array_equal(z.numpy(), zt.numpy())
    x[1, 2, 1] = -7.0  # a write into the reals shows in the complex view, and back
    assert z[1, 2].item() == complex(a[1, 2, 0], -7.0)
    z[0, 0] = 3 + 4j
    assert (x[0, 0, 0].item(), x[0, 0, 1].item()) == (3.0, 4.0)


@pytest.mark.parametrize("dt", [np.complex64, np.complex128])
def test_view_as_real_values_and_shared_memory(dt):
    a = (np.arange(12) + 1j * np.arange(12, 24)).astype(dt).reshape(3, 4)
    z, zt = _pair(a)
    for view in (lambda t: t, lambda t: t.t(), lambda t: t[:, ::2], lambda t: t[1:]):
        r, rt = mt.view_as_real(view(z)), torch.view_as_real(view(zt))
        assert r.shape == tuple(rt.shape)
        np.testing.assert_array_equal(r.numpy(), rt.numpy())
    r = mt.view_as_real(z)
    r[2, 3, 1] = 100.0
    assert z[2, 3].item() == complex(a[2, 3].real, 100.0)
    assert mt.view_as_real(mt.tensor(1 + 2j)).tolist() == [1.0, 2.0]


def test_view_as_complex_of_views_torch_accepts():
    a = np.arange(48, dtype=np.float64).reshape(4, 6, 2)
    x, xt = _pair(a)
    for view in (lambda t: t.transpose(0, 1), lambda t: t[:, ::2], lambda t: t[1:, 2:]):
        np.testing.assert_array_equal(mt.view_as_complex(view(x)).numpy(),
                                      torch.view_as_complex(view(xt)).numpy())


def test_view_as_complex_refuses_what_torch_refuses():
    a = np.arange(24, dtype=np.float32)
    for bad in (lambda t: t.reshape(4, 6), lambda t: t.reshape(12, 2).t().reshape(2, 12)[:, :2],
                lambda t: t.reshape(2, 6, 2).transpose(0, 2), lambda t: t[1:23].reshape(11, 2),
                lambda t: t.reshape(3, 8)[:, 1:3]):
        with pytest.raises(RuntimeError):
            torch.view_as_complex(bad(torch.tensor(a)))
        with pytest.raises(RuntimeError, match="view_as_complex"):
            mt.view_as_complex(bad(mt.tensor(a)))
    with pytest.raises(TypeError, match="float32 or float64"):
        mt.view_as_complex(mt.ones(3, 2, dtype=mt.int64))
    with pytest.raises(TypeError, match="complex tensor"):
        mt.view_as_real(mt.ones(3))


@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_gradients_through_the_views(dt):
    rng = np.random.default_rng(0)
    a, w = rng.standard_normal((5, 3, 2)).astype(dt), rng.standard_normal((3, 2)).astype(dt)
    outs = []
    for lib in (mt, torch):
        x = lib.tensor(a, requires_grad=True)
        f = lib.view_as_complex(lib.tensor(w))
        z = lib.view_as_complex(x) * f  # a rotation, as rotary embeddings do
        y = lib.view_as_real(z).flatten(1)
        (y * lib.arange(6, dtype=y.dtype)).sum().backward()
        outs.append((y.detach().numpy(), x.grad.numpy()))
    for mine, theirs in zip(*outs):
        np.testing.assert_allclose(mine, theirs, **TOL[dt])


def test_complex_gradients_of_products_and_quotients():
    v, w = np.array([1 + 2j, 3 - 1j]), np.array([0.5 - 1j, 2 + 0.3j])
    for f in (lambda z, L: (z * z).real.sum(), lambda z, L: (z * L.tensor(w)).imag.sum(),
              lambda z, L: (L.tensor(w) / z).imag.sum() + (z / L.tensor(w)).real.sum()):
        z, zt = _pair(v, grad=True)
        f(z, mt).backward()
        f(zt, torch).backward()
        np.testing.assert_allclose(z.grad.numpy(), zt.grad.numpy(), rtol=1e-14, atol=1e-14)


@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_polar_and_complex(dt):
    rng = np.random.default_rng(1)
    r, th = rng.random((4, 3)).astype(dt) + 0.5, rng.standard_normal(3).astype(dt) * 3
    got, want = [], []
    for lib, out in ((mt, got), (torch, want)):
        a, b = lib.tensor(r, requires_grad=True), lib.tensor(th, requires_grad=True)
        p = lib.polar(a, b)
        c = lib.complex(a, b)
        (lib.view_as_real(p) * lib.tensor([1.5, -0.5], dtype=a.dtype)).sum().backward()
        (c.imag * 2).sum().backward()
        out.extend([p.detach().numpy(), c.detach().numpy(), a.grad.numpy(), b.grad.numpy()])
    assert got[0].dtype == want[0].dtype
    for mine, theirs in zip(got, want):
        np.testing.assert_allclose(mine, theirs, **TOL[dt])
    with pytest.raises(TypeError):
        mt.polar(mt.ones(2), mt.ones(2, dtype=mt.float64))


def test_freqs_cis_as_llama_computes_them():
    def freqs(lib):
        f = 1.0 / (10000.0 ** (lib.arange(0, 16, 2)[:8].float() / 16))
        t = lib.arange(32, device=f.device)
        f = lib.outer(t, f).float()
        return lib.polar(lib.ones_like(f), f)

    np.testing.assert_allclose(freqs(mt).numpy(), freqs(torch).numpy(), rtol=1e-5, atol=1e-5)


def test_gradient_of_a_real_tensor_made_complex_is_the_real_part():
    """``x.to(complex)``'s backward hands the real input the real part of its complex
    gradient, without NumPy's ComplexWarning (its astype drops the imaginary part too, but
    warns): d/dx sum |x c|^2 = 2 x |c|^2."""
    import warnings

    x = mt.tensor([1.0, 2.0], dtype=mt.float64, requires_grad=True)
    c = mt.tensor([1 + 2j, 3 - 1j])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (x.to(mt.complex128) * c).abs().pow(2).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [2 * 1 * 5, 2 * 2 * 10], rtol=1e-15)
    assert x.grad.dtype == mt.float64
