"""torch's legacy linear algebra (torch.qr, svd, cholesky, cholesky_solve, cholesky_inverse,
lu, lu_unpack, lu_solve, triangular_solve, pinverse, matrix_exp, chain_matmul, geqrf, orgqr,
ormqr, svd_lowrank, pca_lowrank) and the top-level special functions (i0, igamma, igammac,
polygamma, mvlgamma), as functions and Tensor methods: values and gradients against torch
2.13 (the oracle, where installed), finite differences and identities (everywhere).

Tolerances come from the arithmetic. The matrices are built with known conditioning: the
test matrices have singular values in [1, 3] (condition number kappa <= 3) or are
``B B^H + n I`` (kappa <= ~10), and the gaps between singular values are at least 0.2, which
bounds the SVD gradient's 1/(s_i^2 - s_j^2) factors by 1/(0.4 s_min) ~ 3. A backward-stable
factorization or solve of an n x n matrix (n <= 6) then agrees with another one to about
n kappa^2 eps relative: with kappa^2 <= 100 and n <= 6, float64 (eps 2.2e-16) gives
~1.3e-13, so 1e-10 (times the size of the values) leaves a wide margin; float32 (eps 1.2e-7)
gives ~7e-5: 2e-3. Gradients are a few more products of the same factors: the same bounds.
Central differences with h = 1e-6 on O(1) smooth functions carry errors near
eps / h + h^2 ~ 1e-10 per entry: 1e-6.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

import mpitensor as mt

try:
    import torch
except ImportError:  # the oracle half of the tests is skipped; the rest runs
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch (the oracle) is not installed")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

F64, TOL = np.float64, {np.float32: 2e-3, np.float64: 1e-10, np.complex64: 2e-3,
                         np.complex128: 1e-10}
REAL = (np.float32, np.float64)
ALL = (np.float32, np.float64, np.complex64, np.complex128)


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def _normal(rng: np.random.Generator, shape: tuple, dtype: type) -> np.ndarray:
    a = rng.standard_normal(shape)
    if np.dtype(dtype).kind == "c":
        a = a + 1j * rng.standard_normal(shape)
    return a.astype(dtype)


def _orthonormal(rng: np.random.Generator, batch: tuple, n: int, dtype: type) -> np.ndarray:
    q, r = np.linalg.qr(_normal(rng, batch + (n, n), np.complex128 if np.dtype(dtype).kind ==
                                "c" else np.float64))
    return q


def conditioned(shape: tuple, dtype: type, seed: int = 0) -> np.ndarray:
    """A (batch of) matrices with singular values spread evenly over [1, 3]."""
    rng = _rng(seed)
    *batch, m, n = shape
    k = min(m, n)
    u = _orthonormal(rng, tuple(batch), m, dtype)[..., :k]
    v = _orthonormal(rng, tuple(batch), n, dtype)[..., :k]
    s = np.linspace(3.0, 1.0, k) if k > 1 else np.array([2.0])
    return ((u * s) @ np.swapaxes(v, -1, -2).conj()).astype(dtype)


def spd(shape: tuple, dtype: type, seed: int = 0) -> np.ndarray:
    """``B B^H + n I``: Hermitian positive-definite, condition number at most ~10."""
    b = _normal(_rng(seed), shape, dtype)
    n = shape[-1]
    return (b @ np.swapaxes(b, -1, -2).conj() / n + np.eye(n)).astype(dtype)


def both(a: np.ndarray, grad: bool = False) -> tuple:
    """The same values as a torch tensor and an mpitensor tensor."""
    t = torch.tensor(a, requires_grad=grad) if torch is not None else None
    return t, mt.tensor(a, requires_grad=grad)


def arr(x) -> np.ndarray:
    return x.detach().numpy() if hasattr(x, "detach") else np.asarray(x)


def close(got, want, tol: float, scale: float = 1.0) -> None:
    got, want = arr(got), arr(want)
    assert got.shape == want.shape, (got.shape, want.shape)
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)   # NaN where torch has NaN
    got, want = np.where(nan, 0, got), np.where(nan, 0, want)
    err = np.abs(got.astype(np.complex128) - want.astype(np.complex128)).max(initial=0)
    ref = max(np.abs(want).max(initial=0), 1.0) * scale
    assert err <= tol * ref, f"max error {err:.3g} > {tol:.1g} x {ref:.3g}"


def weights(shape: tuple, dtype: type, seed: int = 7) -> np.ndarray:
    return _normal(_rng(seed), shape, dtype)


def against_torch(fn, inputs: list, dtype: type, grad: bool = True) -> None:
    """``fn(lib, *tensors)`` (a real scalar loss) under torch and mpitensor: same value and
    same gradients for every input."""
    ts, ms = zip(*(both(a, grad) for a in inputs))
    lt, lm = fn(torch, *ts), fn(mt, *ms)
    tol = TOL[dtype]
    close(lm, lt, tol)
    if grad:
        lt.backward()
        lm.backward()
        for t, m in zip(ts, ms):
            close(m.grad, t.grad, tol, scale=max(np.abs(arr(t.grad)).max(), 1.0))


def fd_check(loss, a: np.ndarray, h: float = 1e-6, mask=None) -> None:
    """The gradient of ``loss(tensor)`` (real float64 ``a``) against central differences
    (at the entries where ``mask`` is True: those the function reads)."""
    x = mt.tensor(a, requires_grad=True)
    loss(x).backward()
    fd = np.zeros_like(a)
    mask = np.ones(a.shape, bool) if mask is None else mask
    for i in zip(*np.nonzero(mask)):
        d = np.zeros_like(a)
        d[i] = h
        fd[i] = (float(loss(mt.tensor(a + d))) - float(loss(mt.tensor(a - d)))) / (2 * h)
    close(np.where(mask, arr(x.grad), 0), fd, 1e-6, scale=max(np.abs(fd).max(), 1.0))


def wsum(lib, w: np.ndarray, x):
    """Re sum(w * x): a real loss that weighs every entry differently."""
    wt = lib.tensor(w)
    p = wt * x
    return (p.real if p.is_complex() else p).sum()


def abs2(x):
    return (x * x.conj()).real if x.is_complex() else x * x


# --------------------------------------------------------------------------------------------
# QR


@needs_torch
@pytest.mark.parametrize("dtype", ALL)
@pytest.mark.parametrize("shape", [(4, 3), (3, 3), (2, 3, 5), (2, 5, 2)])
def test_qr_values_and_gradients_match_torch(dtype, shape):
    a = conditioned(shape, dtype)
    q_shape = shape[:-1] + (min(shape[-2:]),)
    w1, w2 = weights(q_shape, dtype, 1), weights(q_shape[:-2] + (min(shape[-2:]), shape[-1]),
                                                dtype, 2)
    # LAPACK's signs on both sides (geqrf): Q and R themselves agree
    against_torch(lambda L, x: wsum(L, w1, L.qr(x)[0]) + wsum(L, w2, x.qr()[1]), [a], dtype)


@needs_torch
@pytest.mark.parametrize("dtype", REAL)
def test_qr_complete(dtype):
    a = conditioned((2, 5, 3), dtype)
    t, m = both(a)
    qt, rt = torch.qr(t, some=False)
    qm, rm = mt.qr(m, some=False)
    assert qm.shape == (2, 5, 5) and rm.shape == (2, 5, 3)
    close(qm @ rm, a, TOL[dtype])
    close(qm.mT @ qm, np.broadcast_to(np.eye(5), (2, 5, 5)), TOL[dtype])
    close(rm, rt, TOL[dtype])
    # square or wide: the complete Q is the reduced one, and it has a gradient
    w = weights((3, 3), dtype)
    against_torch(lambda L, x: wsum(L, w, L.qr(x, some=False)[0]), [conditioned((3, 3), dtype)],
                  dtype)


def test_qr_result_type_and_errors():
    r = mt.qr(mt.tensor(conditioned((3, 3), F64)))
    assert type(r).__name__ == "qr" and r._fields == ("Q", "R")
    assert "return_types.qr" in repr(r)
    x = mt.tensor(conditioned((5, 3), F64), requires_grad=True)
    q, _ = mt.qr(x, some=False)
    with pytest.raises(RuntimeError, match="some=True"):
        q.sum().backward()
    with pytest.raises(ValueError):
        mt.qr(mt.ones(3))
    with pytest.raises(TypeError):
        mt.qr(mt.ones(3, 3, dtype=mt.int64))


def test_qr_gradient_finite_differences():
    for shape in [(4, 3), (3, 5)]:
        w1, w2 = weights((shape[0], min(shape)), F64, 3), weights((min(shape), shape[1]), F64, 4)
        fd_check(lambda x, w1=w1, w2=w2: wsum(mt, w1, mt.qr(x)[0]) + wsum(mt, w2, mt.qr(x)[1]),
                 conditioned(shape, F64))


# --------------------------------------------------------------------------------------------
# SVD (singular vectors compared through quantities their signs and phases do not change)


def _svd_loss(lib, x, w, some=True):
    u, s, v = lib.svd(x, some=some)
    k = s.shape[-1]
    recon = (u[..., :, :k] * s.unsqueeze(-2)) @ v[..., :, :k].mH
    return (wsum(lib, w[0], abs2(u[..., :, :k])) + wsum(lib, w[1], s)
            + wsum(lib, w[2], abs2(v[..., :, :k])) + wsum(lib, w[3], recon))


@needs_torch
@pytest.mark.parametrize("dtype", ALL)
@pytest.mark.parametrize("shape", [(4, 3), (3, 3), (2, 3, 5)])
@pytest.mark.parametrize("some", [True, False])
def test_svd_values_and_gradients_match_torch(dtype, shape, some):
    a = conditioned(shape, dtype)
    *batch, m, n = shape
    k = min(m, n)
    real = np.float32 if dtype in (np.float32, np.complex64) else np.float64
    w = [weights(tuple(batch) + (m, k), real, 1), weights(tuple(batch) + (k,), real, 2),
         weights(tuple(batch) + (n, k), real, 3), weights(shape, dtype, 4)]
    against_torch(lambda L, x: _svd_loss(L, x, w, some), [a], dtype)
    u, s, v = mt.svd(mt.tensor(a), some=some)
    assert u.shape[-1] == (k if some else m) and v.shape[-1] == (k if some else n)
    close(s, np.linalg.svd(a, compute_uv=False), TOL[dtype])
    close((u[..., :k] * s.unsqueeze(-2)) @ v[..., :k].mH, a, TOL[dtype], 3.0)


@needs_torch
def test_svd_without_uv():
    a = conditioned((2, 4, 3), F64)
    t, m = both(a, True)
    ut, st, vt = torch.svd(t, compute_uv=False)
    um, sm, vm = m.svd(compute_uv=False)
    assert um.shape == (2, 4, 4) and vm.shape == (2, 3, 3)
    assert not um.numpy().any() and not vm.numpy().any()
    close(sm, st, 1e-12)
    (st * torch.arange(1.0, 4.0, dtype=torch.float64)).sum().backward()
    (sm * mt.arange(1.0, 4.0, dtype=mt.float64)).sum().backward()
    close(m.grad, t.grad, 1e-10)


def test_svd_gradient_finite_differences():
    for shape in [(4, 3), (3, 5), (3, 3)]:
        *_, m, n = shape
        k = min(m, n)
        w = [weights((m, k), F64, 1), weights((k,), F64, 2), weights((n, k), F64, 3),
             weights(shape, F64, 4)]
        fd_check(lambda x, w=w: _svd_loss(mt, x, w), conditioned(shape, F64))


# --------------------------------------------------------------------------------------------
# Cholesky, cholesky_solve, cholesky_inverse


@needs_torch
@pytest.mark.parametrize("dtype", ALL)
@pytest.mark.parametrize("upper", [False, True])
@pytest.mark.parametrize("batch", [(), (2,)])
def test_cholesky_matches_torch(dtype, upper, batch):
    n = 4
    b = _normal(_rng(1), batch + (n, n), dtype)
    w = weights(batch + (n, n), dtype)

    def loss(L, x):
        a = x @ x.mH / n + L.eye(n, dtype=x.dtype)
        return wsum(L, w, L.cholesky(a, upper=upper))

    against_torch(loss, [b], dtype)
    a = spd(batch + (n, n), dtype)
    low = mt.cholesky(mt.tensor(a), upper)
    rec = low.mH @ low if upper else low @ low.mH
    close(rec, a, TOL[dtype])
    assert np.allclose(np.triu(arr(low), 1) if not upper else np.tril(arr(low), -1), 0)


def test_cholesky_gradient_finite_differences():
    w = weights((4, 4), F64)
    fd_check(lambda x: wsum(mt, w, (x @ x.mT / 4 + mt.eye(4, dtype=mt.float64)).cholesky()),
             _normal(_rng(2), (4, 4), F64))


def test_cholesky_errors():
    with pytest.raises(mt.linalg.LinAlgError, match="positive-definite"):
        mt.cholesky(-mt.eye(3, dtype=mt.float64))
    bad = np.stack([np.eye(3), -np.eye(3)])
    with pytest.raises(mt.linalg.LinAlgError, match="batch element 1"):
        mt.tensor(bad).cholesky()
    with pytest.raises(ValueError, match="square"):
        mt.cholesky(mt.ones(3, 4))
    with pytest.raises(TypeError):
        mt.cholesky(mt.eye(3, dtype=mt.int32))


@needs_torch
@pytest.mark.parametrize("dtype", ALL)
@pytest.mark.parametrize("upper", [False, True])
def test_cholesky_solve_and_inverse_match_torch(dtype, upper):
    n = 4
    fac = np.linalg.cholesky(spd((n, n), dtype))
    fac = (fac.swapaxes(-1, -2).conj() if upper else fac).astype(dtype)
    rhs = _normal(_rng(3), (2, n, 3), dtype)     # batch dimensions broadcast
    w = weights((2, n, 3), dtype)
    wi = weights((n, n), dtype, 8)
    against_torch(lambda L, b, f: wsum(L, w, L.cholesky_solve(b, f, upper)), [rhs, fac], dtype)
    against_torch(lambda L, b, f: wsum(L, w, b.cholesky_solve(f, upper=upper)), [rhs, fac],
                  dtype)
    against_torch(lambda L, f: wsum(L, wi, L.cholesky_inverse(f, upper)), [fac], dtype)
    against_torch(lambda L, f: wsum(L, wi, f.cholesky_inverse(upper=upper)), [fac], dtype)
    a = fac.swapaxes(-1, -2).conj() @ fac if upper else fac @ fac.swapaxes(-1, -2).conj()
    close(mt.cholesky_inverse(mt.tensor(fac), upper), np.linalg.inv(a), TOL[dtype], 10)
    close(mt.cholesky_solve(mt.tensor(rhs), mt.tensor(fac), upper), np.linalg.solve(a, rhs),
          TOL[dtype], 10)


def test_cholesky_solve_gradient_finite_differences():
    fac = np.linalg.cholesky(spd((3, 3), F64))
    rhs = _normal(_rng(4), (3, 2), F64)
    w = weights((3, 2), F64)
    fd_check(lambda b: wsum(mt, w, mt.cholesky_solve(b, mt.tensor(fac))), rhs)
    # torch's gradient takes the factor as a full matrix in X = (L L^T)^-1 B; the solve reads
    # its lower triangle, where the two agree
    low = np.tril(np.ones((3, 3), bool))
    fd_check(lambda f: wsum(mt, w, mt.cholesky_solve(mt.tensor(rhs), f)), fac, mask=low)
    fd_check(lambda f: wsum(mt, weights((3, 3), F64), mt.cholesky_inverse(f)), fac, mask=low)
    fd_check(lambda f: wsum(mt, weights((3, 3), F64), mt.cholesky_inverse(f, upper=True)),
             fac.T.copy(), mask=low.T)


# --------------------------------------------------------------------------------------------
# triangular_solve


@needs_torch
@pytest.mark.parametrize("dtype", ALL)
@pytest.mark.parametrize("upper, transpose, unit", list(itertools.product([True, False],
                                                                         repeat=3)))
def test_triangular_solve_matches_torch(dtype, upper, transpose, unit):
    n = 4
    # a well-conditioned triangle: unit diagonal plus small off-diagonal entries
    a = (0.3 * _normal(_rng(5), (2, n, n), dtype) + 2 * np.eye(n)).astype(dtype)
    rhs = _normal(_rng(6), (n, 3), dtype)        # broadcast against A's batch
    w = weights((2, n, 3), dtype)
    against_torch(lambda L, b, x: wsum(L, w, L.triangular_solve(b, x, upper, transpose, unit)[0]),
                  [rhs, a], dtype)
    against_torch(lambda L, b, x: wsum(L, w, b.triangular_solve(
        x, upper=upper, transpose=transpose, unitriangular=unit).solution), [rhs, a], dtype)


def test_triangular_solve_result_and_finite_differences():
    a = np.triu(0.3 * _normal(_rng(5), (3, 3), F64)) + 2 * np.eye(3)
    rhs = _normal(_rng(6), (3, 2), F64)
    am = mt.tensor(a)
    r = mt.triangular_solve(mt.tensor(rhs), am)
    assert r._fields == ("solution", "cloned_coefficient")
    close(r.cloned_coefficient, a, 0)
    assert r.cloned_coefficient.data_ptr() != am.data_ptr()
    close(a @ arr(r.solution), rhs, 1e-12)
    w = weights((3, 2), F64)
    fd_check(lambda x: wsum(mt, w, mt.triangular_solve(mt.tensor(rhs), x)[0]), a)
    with pytest.raises(ValueError):
        mt.triangular_solve(mt.ones(4, 2), mt.eye(3))
    with pytest.raises(TypeError):
        mt.triangular_solve(mt.ones(3, 2), mt.eye(3, dtype=mt.float64))


# --------------------------------------------------------------------------------------------
# LU


@needs_torch
@pytest.mark.parametrize("dtype", ALL)
@pytest.mark.parametrize("shape", [(4, 4), (2, 5, 3), (3, 5), (2, 3, 3)])
def test_lu_matches_torch(dtype, shape):
    a = _normal(_rng(8), shape, dtype)
    t, m = both(a)
    lt, pt = torch.lu(t)
    lm, pm = mt.lu(m)
    assert pm.dtype == mt.int32 and pm.shape == tuple(pt.shape)
    np.testing.assert_array_equal(arr(pm), arr(pt))     # the same pivot choices as LAPACK
    close(lm, lt, TOL[dtype], 10)
    p, low, up = mt.lu_unpack(lm, pm)
    close(p @ low @ up, a, TOL[dtype], 10)
    for x, y in zip(torch.lu_unpack(lt, pt), (p, low, up)):
        close(y, x, TOL[dtype], 10)
    w = weights(shape, dtype)
    # the packed factors of a matrix with a clear pivot order: its gradient is smooth there
    against_torch(lambda L, x: wsum(L, w, L.lu(x)[0]), [a], dtype)
    against_torch(lambda L, x: wsum(L, w[..., :min(shape[-2:])], L.lu_unpack(*x.lu())[1]),
                  [a], dtype)


@needs_torch
@pytest.mark.parametrize("dtype", ALL)
def test_lu_solve_matches_torch(dtype):
    a = conditioned((2, 4, 4), dtype)
    rhs = _normal(_rng(9), (2, 4, 3), dtype)
    w = weights((2, 4, 3), dtype)
    against_torch(lambda L, b, x: wsum(L, w, L.lu_solve(b, *L.lu(x))), [rhs, a], dtype)
    against_torch(lambda L, b, x: wsum(L, w, b.lu_solve(*x.lu())), [rhs, a], dtype)
    close(mt.lu_solve(mt.tensor(rhs), *mt.lu(mt.tensor(a))), np.linalg.solve(a, rhs),
          TOL[dtype], 3)


def test_lu_infos_unpack_options_and_gradient():
    a = np.array([[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [1.0, 0.0, 1.0]])   # singular
    lu, piv, info = mt.lu(mt.tensor(a), get_infos=True)
    assert info.dtype == mt.int32 and int(info) == 3
    assert int(mt.lu(mt.zeros(3, 3), get_infos=True).info) == 1
    p, low, up = mt.lu_unpack(lu, piv)
    close(p @ low @ up, a, 1e-14)
    p2, l2, u2 = mt.lu_unpack(lu, piv, unpack_data=False)
    assert l2.numel() == 0 and u2.numel() == 0 and p2.shape == (3, 3)
    assert mt.lu_unpack(lu, piv, unpack_pivots=False).P.numel() == 0
    with pytest.raises(NotImplementedError):
        mt.lu(mt.eye(2), pivot=False)
    for shape in [(4, 4), (5, 3), (3, 5)]:
        w = weights(shape, F64)
        fd_check(lambda x, w=w: wsum(mt, w, mt.lu(x)[0]), _normal(_rng(10), shape, F64))


# --------------------------------------------------------------------------------------------
# pinverse, matrix_exp, chain_matmul


@needs_torch
@pytest.mark.parametrize("dtype", ALL)
@pytest.mark.parametrize("shape", [(4, 3), (3, 5), (2, 3, 3)])
def test_pinverse_matches_torch(dtype, shape):
    a = conditioned(shape, dtype)
    w = weights(shape[:-2] + (shape[-1], shape[-2]), dtype)
    against_torch(lambda L, x: wsum(L, w, L.pinverse(x)), [a], dtype)
    against_torch(lambda L, x: wsum(L, w, x.pinverse(rcond=1e-10)), [a], dtype)


def test_pinverse_rank_deficient_and_finite_differences():
    u = _orthonormal(_rng(1), (), 4, F64)
    a = (u[:, :2] * [3.0, 1.0]) @ _orthonormal(_rng(2), (), 3, F64)[:, :2].T   # rank 2
    p = arr(mt.pinverse(mt.tensor(a)))
    close(a @ p @ a, a, 1e-12)
    close(p @ a @ p, p, 1e-12)
    close(p, np.linalg.pinv(a), 1e-12)
    w = weights((3, 4), F64)
    fd_check(lambda x: wsum(mt, w, mt.pinverse(x)), conditioned((4, 3), F64))


@needs_torch
@pytest.mark.parametrize("dtype", ALL)
@pytest.mark.parametrize("scale", [0.01, 1.0, 8.0])
def test_matrix_exp_matches_torch(dtype, scale):
    a = (scale * _normal(_rng(11), (2, 4, 4), dtype) / 2).astype(dtype)
    w = weights((2, 4, 4), dtype)
    # |exp(A)| grows as exp(||A||): compare relative to the largest entry
    big = float(np.abs(np.exp(np.abs(a).sum(-1).max())))
    t, m = both(a, True)
    et, em = torch.matrix_exp(t), m.matrix_exp()
    close(em, et, TOL[dtype], big)
    wsum(torch, w, et).backward()
    wsum(mt, w, em).backward()
    close(m.grad, t.grad, TOL[dtype], big)


def test_matrix_exp_identities_and_finite_differences():
    # exp of a skew-symmetric matrix is a rotation; exp(diag) is diag(exp); 1x1 and 0x0
    rot = arr(mt.matrix_exp(mt.tensor([[0.0, -math.pi / 3], [math.pi / 3, 0.0]],
                                      dtype=mt.float64)))
    close(rot, [[0.5, -math.sqrt(3) / 2], [math.sqrt(3) / 2, 0.5]], 1e-15)
    # 30 / 2^3 < theta_13: three squarings, each doubling the relative error (~8 x 2 eps)
    close(mt.matrix_exp(mt.diag(mt.tensor([1.0, -2.0, 30.0], dtype=mt.float64))),
          np.diag(np.exp([1.0, -2.0, 30.0])), 1e-13)
    assert mt.matrix_exp(mt.zeros(3, 0, 0)).shape == (3, 0, 0)
    nil = np.triu(_normal(_rng(3), (4, 4), F64), 1)       # nilpotent: the series ends
    series = np.eye(4) + nil + nil @ nil / 2 + nil @ nil @ nil / 6
    close(mt.matrix_exp(mt.tensor(nil)), series, 1e-14)
    w = weights((3, 3), F64)
    for scale in (0.5, 6.0):   # no squaring, and three squarings
        fd_check(lambda x, scale=scale: wsum(mt, w, mt.matrix_exp(x)) / math.exp(scale * 3),
                 scale * _normal(_rng(4), (3, 3), F64) / 3, h=1e-7)
    with pytest.raises(ValueError):
        mt.matrix_exp(mt.ones(2, 3))


@needs_torch
def test_chain_matmul_matches_torch():
    mats = [_normal(_rng(i), s, F64) for i, s in enumerate([(2, 3), (3, 4), (4, 2)])]
    against_torch(lambda L, *xs: L.chain_matmul(*xs).sum(), mats, F64)
    close(mt.chain_matmul(mt.tensor(mats[0])), mats[0], 0)
    with pytest.raises(ValueError):
        mt.chain_matmul(mt.ones(2, 2, 2))
    with pytest.raises(ValueError):
        mt.chain_matmul()


# --------------------------------------------------------------------------------------------
# geqrf, orgqr, ormqr


@needs_torch
@pytest.mark.parametrize("dtype", ALL)
@pytest.mark.parametrize("shape", [(5, 3), (3, 3), (2, 4, 4), (3, 5)])
def test_geqrf_matches_torch(dtype, shape):
    a = conditioned(shape, dtype)
    t, m = both(a)
    at, taut = torch.geqrf(t)
    am, taum = m.geqrf()
    close(am, at, TOL[dtype], 3)
    close(taum, taut, TOL[dtype])
    if shape[-2] >= shape[-1]:
        close(mt.orgqr(am, taum), torch.linalg.qr(t)[0], TOL[dtype], 3)


@needs_torch
@pytest.mark.parametrize("dtype", ALL)
def test_orgqr_and_ormqr_match_torch(dtype):
    a = conditioned((2, 5, 3), dtype)
    packed, tau = (arr(x) for x in torch.geqrf(torch.tensor(a)))
    w = weights((2, 5, 3), dtype)
    against_torch(lambda L, x, t: wsum(L, w, L.orgqr(x, t)), [packed, tau], dtype)
    against_torch(lambda L, x, t: wsum(L, w, x.orgqr(t)), [packed, tau], dtype)
    for left, transpose in itertools.product([True, False], repeat=2):
        c = _normal(_rng(12), (2, 5, 2) if left else (2, 2, 5), dtype)
        wc = weights(c.shape, dtype, 13)
        against_torch(lambda L, x, t, y, wc=wc, lt=left, tr=transpose:
                      wsum(L, wc, L.ormqr(x, t, y, lt, tr)), [packed, tau, c], dtype)
        against_torch(lambda L, x, t, y, wc=wc, lt=left, tr=transpose:
                      wsum(L, wc, x.ormqr(t, y, left=lt, transpose=tr)), [packed, tau, c],
                      dtype)


def test_householder_identities_and_errors():
    a = conditioned((5, 3), F64)
    packed, tau = mt.geqrf(mt.tensor(a))
    assert mt.geqrf(mt.tensor(a))._fields == ("a", "tau")
    q = mt.orgqr(packed, tau)
    close(q @ packed.triu()[:3], a, 1e-13)
    full = mt.ormqr(packed, tau, mt.eye(5, dtype=mt.float64))
    close(full.mT @ full, np.eye(5), 1e-13)
    close(mt.ormqr(packed, tau, mt.tensor(a), transpose=True)[:3], arr(packed.triu()[:3]),
          1e-13)
    x = mt.tensor(a, requires_grad=True)
    with pytest.raises(RuntimeError, match="geqrf"):
        x.geqrf()[0].sum().backward()
    with pytest.raises(ValueError):
        mt.orgqr(mt.ones(3, 5, dtype=mt.float64), mt.ones(3, dtype=mt.float64))
    with pytest.raises(ValueError):
        mt.ormqr(packed, tau, mt.ones(4, 2, dtype=mt.float64))
    with pytest.raises(TypeError):
        mt.orgqr(packed, tau.float())
    w = weights((5, 3), F64)
    fd_check(lambda p: wsum(mt, w, mt.orgqr(p, tau)), arr(packed))
    fd_check(lambda t: wsum(mt, w, mt.orgqr(packed, t)), arr(tau))


# --------------------------------------------------------------------------------------------
# svd_lowrank, pca_lowrank


@needs_torch
@pytest.mark.parametrize("shape", [(8, 5), (5, 8), (2, 7, 6)])
def test_svd_lowrank_recovers_a_low_rank_matrix(shape):
    rng = _rng(14)
    *batch, m, n = shape
    a = _normal(rng, tuple(batch) + (m, 3), F64) @ _normal(rng, tuple(batch) + (3, n), F64)
    mt.manual_seed(0)
    u, s, v = mt.svd_lowrank(mt.tensor(a), q=4)
    assert u.shape == tuple(batch) + (m, 4) and v.shape == tuple(batch) + (n, 4)
    close(s[..., :3], torch.linalg.svdvals(torch.tensor(a))[..., :3], 1e-10)
    close((u * s.unsqueeze(-2)) @ v.mT, a, 1e-10, 10)
    # q = min(m, n): the basis spans the whole range, the SVD is exact, and so is its gradient
    t, x = both(conditioned(shape, F64), True)     # full rank: svdvals is smooth there
    torch.linalg.svdvals(t).sum().backward()
    mt.svd_lowrank(x, q=min(m, n), niter=1)[1].sum().backward()
    close(x.grad, t.grad, 1e-10)


@needs_torch
def test_pca_lowrank_centers():
    rng = _rng(15)
    a = _normal(rng, (20, 3), F64) @ _normal(rng, (3, 6), F64) + 5.0
    u, s, v = mt.pca_lowrank(mt.tensor(a), q=3)
    c = a - a.mean(0)
    close(s, np.linalg.svd(c, compute_uv=False)[:3], 1e-10)
    close((u * s) @ v.mT, c, 1e-10, 10)
    s2 = mt.pca_lowrank(mt.tensor(a), q=4, center=False)[1]     # rank 4 uncentered
    close(s2, np.linalg.svd(a, compute_uv=False)[:4], 1e-10)
    assert mt.pca_lowrank(mt.tensor(a))[1].shape == (6,)
    with pytest.raises(ValueError):
        mt.pca_lowrank(mt.tensor(a), q=7)


# --------------------------------------------------------------------------------------------
# Special functions at the top level


@needs_torch
@pytest.mark.parametrize("dtype", REAL)
def test_special_functions_match_torch(dtype):
    x = np.linspace(0.6, 9.0, 15).astype(dtype)
    y = np.linspace(0.1, 12.0, 15).astype(dtype)
    tol = 1e-5 if dtype == np.float32 else 1e-9    # torch's trigamma: ~5e-10 (test_special)
    for fn in [lambda L, a, b: L.i0(a), lambda L, a, b: a.i0(),
               lambda L, a, b: L.polygamma(2, a), lambda L, a, b: a.polygamma(1),
               lambda L, a, b: L.mvlgamma(a + 1, 3), lambda L, a, b: a.mvlgamma(p=1),
               lambda L, a, b: L.igamma(a, b), lambda L, a, b: a.igammac(b),
               lambda L, a, b: L.igammac(a, other=b)]:
        (tx, mx), (ty, my) = both(x), both(y)
        close(fn(mt, mx, my), fn(torch, tx, ty), tol)
    # gradients: in x for i0, polygamma, mvlgamma; in the second argument for igamma(c)
    for fn in [lambda L, a: L.i0(a).sum(), lambda L, a: L.polygamma(1, a).sum(),
               lambda L, a: L.mvlgamma(a + 1, 2).sum(),
               lambda L, a: L.igamma(L.tensor(x), a).sum(),
               lambda L, a: L.igammac(L.tensor(x), a).sum()]:
        tt, mm = both(y, True)
        fn(torch, tt).backward()
        fn(mt, mm).backward()
        close(mm.grad, tt.grad, tol)


def test_incomplete_gamma_to_float64_accuracy():
    """igamma and igammac against mpmath at 40 digits, over a and x from 1e-3 to 1e3: within
    1e-11 relative (the series and continued fraction lose a few hundred ulps at a ~ 1e3;
    torch's own are off by up to 2e-9 there)."""
    mpmath = pytest.importorskip("mpmath", reason="mpmath (the reference) is not installed")
    mpmath.mp.dps = 40
    grid = np.exp(np.linspace(math.log(1e-3), math.log(1e3), 17))
    a, x = (v.ravel() for v in np.meshgrid(grid, grid))
    lower = np.array([float(mpmath.gammainc(p, 0, q, regularized=True)) for p, q in zip(a, x)])
    upper = np.array([float(mpmath.gammainc(p, q, mpmath.inf, regularized=True))
                      for p, q in zip(a, x)])
    for got, want in [(mt.igamma(mt.tensor(a), mt.tensor(x)), lower),
                      (mt.tensor(a).igammac(mt.tensor(x)), upper)]:
        keep = want > 1e-290    # below, the result is subnormal or zero
        rel = np.abs(arr(got)[keep] - want[keep]) / want[keep]
        assert rel.max() < 1e-11, rel.max()


def test_special_methods_in_place_and_errors():
    x = mt.tensor([1.0, 2.5, 4.0], dtype=mt.float64)
    close(x.clone().i0_(), mt.special.i0(x), 0)
    close(x.clone().polygamma_(2), mt.special.polygamma(2, x), 0)
    close(x.clone().mvlgamma_(2), mt.special.multigammaln(x, 2), 0)
    close(x.clone().igamma_(x), mt.special.gammainc(x, x), 0)
    close(x.clone().igammac_(2.0), mt.special.gammaincc(x, 2.0), 0)
    close(mt.igamma(x, x) + mt.igammac(x, x), np.ones(3), 1e-15)
    with pytest.raises(TypeError):
        mt.tensor([1, 2]).i0_()    # a float result cannot be written into integers
    a = mt.tensor([2.0], dtype=mt.float64, requires_grad=True)
    with pytest.raises(RuntimeError, match="first argument"):
        mt.igamma(a, mt.tensor([1.0], dtype=mt.float64)).sum().backward()
    with pytest.raises(ValueError):
        mt.mvlgamma(mt.tensor([0.2]), 3)
    with pytest.raises(ValueError):
        mt.polygamma(-1, x)


# --------------------------------------------------------------------------------------------
# torch's names and keywords


@needs_torch
def test_keyword_calls_as_torch():
    a = spd((3, 3), F64)
    b = _normal(_rng(16), (3, 2), F64)
    piv_t = torch.lu(torch.tensor(a))

    def calls(L, A, B, piv):
        return [L.cholesky_solve(input=B, input2=L.cholesky(input=A, upper=False)),
                L.cholesky_inverse(input=A), L.lu_solve(input=B, LU_data=piv[0],
                                                         LU_pivots=piv[1]),
                L.triangular_solve(input=B, A=A, upper=False).solution,
                L.matrix_exp(input=A), L.pinverse(input=A, rcond=1e-8),
                L.orgqr(input=A, input2=L.geqrf(input=A).tau),
                L.ormqr(input=A, input2=L.geqrf(A).tau, input3=B, left=True, transpose=True),
                L.svd(input=A, some=False, compute_uv=True).S, L.qr(input=A, some=True).R,
                L.lu(A=A, pivot=True, get_infos=True).info,
                L.lu_unpack(LU_data=piv[0], LU_pivots=piv[1], unpack_data=True).U,
                B.cholesky_solve(input2=A), B.lu_solve(LU_data=piv[0], LU_pivots=piv[1]),
                B.triangular_solve(A=A).solution, A.orgqr(input2=L.geqrf(A).tau),
                A.cholesky(upper=True), A.cholesky_inverse(upper=True), A.pinverse(rcond=1e-8),
                L.polygamma(n=1, input=A), L.mvlgamma(input=A + 2, p=2),
                (A + 2).mvlgamma(p=2), (A + 1).polygamma(n=2),
                L.igamma(input=A + 1, other=A + 0.5), (A + 1).igamma(other=A)]

    tA, mA = both(a)
    tB, mB = both(b)
    piv_m = mt.lu(mA)
    for got, want in zip(calls(mt, mA, mB, piv_m), calls(torch, tA, tB, piv_t)):
        assert got.dtype == getattr(mt, str(want.dtype).split(".")[1])
        close(got, want, 1e-10, 10)


def test_every_name_is_public():
    names = ["qr", "svd", "cholesky", "cholesky_solve", "cholesky_inverse", "lu", "lu_solve",
             "lu_unpack", "triangular_solve", "pinverse", "matrix_exp", "chain_matmul", "geqrf",
             "orgqr", "ormqr", "svd_lowrank", "pca_lowrank", "i0", "igamma", "igammac",
             "polygamma", "mvlgamma"]
    methods = ["qr", "svd", "cholesky", "cholesky_solve", "cholesky_inverse", "lu", "lu_solve",
               "pinverse", "matrix_exp", "triangular_solve", "geqrf", "orgqr", "ormqr", "i0",
               "i0_", "igamma", "igamma_", "igammac", "igammac_", "polygamma", "polygamma_",
               "mvlgamma", "mvlgamma_"]
    assert all(n in mt.__all__ and callable(getattr(mt, n)) for n in names)
    assert all(callable(getattr(mt.Tensor, n)) for n in methods)
    for gone in ["solve", "eig", "symeig", "lstsq"]:   # only raise in torch: left out
        assert not hasattr(mt, gone) and not hasattr(mt.Tensor, gone)


# --------------------------------------------------------------------------------------------
# A user's program: a Gaussian process's marginal likelihood and its lengthscale's gradient


def gp_negative_log_likelihood(torch, x, y, log_lengthscale, noise=0.1):
    """The negative log marginal likelihood of a GP with an RBF kernel, as papers write it:
    whiten with the Cholesky factor, solve twice, sum the log-diagonal."""
    lengthscale = log_lengthscale.exp()
    d2 = (x.unsqueeze(1) - x.unsqueeze(0)).pow(2).sum(-1)
    k = torch.exp(-0.5 * d2 / lengthscale ** 2) + noise * torch.eye(x.shape[0],
                                                                      dtype=x.dtype)
    L = torch.cholesky(k)
    alpha = torch.cholesky_solve(y.unsqueeze(-1), L)
    white = torch.triangular_solve(y.unsqueeze(-1), L, upper=False).solution
    n = x.shape[0]
    nll = (0.5 * (y.unsqueeze(-1) * alpha).sum() + L.diagonal().log().sum()
           + 0.5 * n * math.log(2 * math.pi))
    return nll, white.pow(2).sum()


@needs_torch
def test_gaussian_process_program_under_both_libraries():
    rng = _rng(17)
    x = rng.uniform(-3, 3, (12, 2))
    y = np.sin(x[:, 0]) + 0.1 * rng.standard_normal(12)
    results = {}
    for lib in (torch, mt):
        ell = lib.tensor(0.3, dtype=lib.float64, requires_grad=True)
        nll, quad = gp_negative_log_likelihood(lib, lib.tensor(x), lib.tensor(y), ell)
        (nll + 0.01 * quad).backward()
        results[lib.__name__] = (float(nll), float(quad), float(ell.grad))
    t, m = results["torch"], results["mpitensor"]
    for a, b in zip(m, t):
        assert abs(a - b) <= 1e-8 * max(1.0, abs(b)), (m, t)
    # and the gradient is the derivative: central differences in the log-lengthscale
    h = 1e-6

    def f(v):
        nll, quad = gp_negative_log_likelihood(mt, mt.tensor(x), mt.tensor(y),
                                               mt.tensor(v, dtype=mt.float64))
        return float(nll) + 0.01 * float(quad)

    assert abs((f(0.3 + h) - f(0.3 - h)) / (2 * h) - m[2]) <= 1e-6 * max(1.0, abs(m[2]))


# --------------------------------------------------------------------------------------------
# Result dtypes and shapes, empty matrices included


@needs_torch
@pytest.mark.parametrize("dtype", ALL)
def test_result_dtypes_and_shapes_match_torch(dtype):
    a = conditioned((2, 3, 3), dtype)
    pos = spd((3, 3), dtype)
    b = _normal(_rng(18), (3, 2), dtype)

    def results(L, A, P, B):
        packed, tau = L.geqrf(A)
        return [*L.qr(A), *L.svd(A), *L.svd(A, compute_uv=False), L.cholesky(P),
                L.cholesky_solve(B, P), L.cholesky_inverse(P), *L.lu(A, get_infos=True),
                *L.lu_unpack(*L.lu(A)), L.lu_solve(B, *L.lu(A)), *L.triangular_solve(B, A),
                L.pinverse(A), L.matrix_exp(A), L.chain_matmul(A[0], A[1]), packed, tau,
                L.orgqr(packed, tau), L.ormqr(packed, tau, A), *L.svd_lowrank(A, q=2),
                *L.pca_lowrank(A, q=2)]

    (tA, mA), (tP, mP), (tB, mB) = both(a), both(pos), both(b)
    for got, want in zip(results(mt, mA, mP, mB), results(torch, tA, tP, tB)):
        assert str(got.dtype).split(".")[-1] == str(want.dtype).split(".")[-1]
        assert tuple(got.shape) == tuple(want.shape)


@needs_torch
@pytest.mark.parametrize("shape", [(0, 0), (0, 3, 3), (3, 0), (2, 0, 3)])
def test_empty_matrices_match_torch(shape):
    a = np.zeros(shape)
    t, m = both(a)
    pairs = [(mt.qr(m), torch.qr(t)), (mt.svd(m), torch.svd(t)), (mt.pinverse(m),
             torch.pinverse(t)), (mt.lu(m), torch.lu(t)), (mt.geqrf(m), torch.geqrf(t))]
    if shape[-1] == shape[-2]:
        pairs += [(mt.cholesky(m), torch.cholesky(t)), (mt.matrix_exp(m), torch.matrix_exp(t)),
                  (mt.lu_unpack(*mt.lu(m)), torch.lu_unpack(*torch.lu(t)))]
    for got, want in pairs:
        got, want = (got, want) if isinstance(got, tuple) else ((got,), (want,))
        assert [tuple(g.shape) for g in got] == [tuple(w.shape) for w in want]
