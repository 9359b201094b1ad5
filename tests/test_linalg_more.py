"""torch.linalg's factorizations, eigen-decompositions and solvers (cholesky, cholesky_ex,
inv_ex, solve_ex, solve_triangular, qr, svd, svdvals, eigh, eigvalsh, eig, eigvals,
lu_factor, lu_factor_ex, lu, lu_solve, householder_product, matrix_exp, lstsq, pinv,
matrix_rank, cond, tensorinv, tensorsolve, vander): values and gradients against torch 2.13
(the oracle, where installed), finite differences, bad inputs, and a user-style program.

Tolerances: as tests/test_linalg_legacy.py (whose matrix builders and comparisons this file
uses): well-conditioned matrices (singular values or eigenvalues spread over [1, 3], gaps of
at least 0.2 between eigenvalues, so the eigen-derivative's 1/(l_j - l_i) is at most 5), so
two backward-stable computations agree to ~n kappa^2 eps: 1e-10 in float64, 2e-3 in float32.
Eigen- and singular vectors are compared through quantities that do not depend on their
phases: |V|^2 entry by entry (the columns are unit vectors fixed up to a phase), the
reconstructions, and losses built from those.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import mpitensor as mt
from tests.test_linalg_legacy import (
    ALL,
    TOL,
    _normal,
    _orthonormal,
    _rng,
    abs2,
    arr,
    both,
    close,
    conditioned,
    fd_check,
    spd,
    torch,
    weights,
    wsum,
)

needs_torch = pytest.mark.skipif(torch is None, reason="torch (the oracle) is not installed")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
F64 = np.float64
SHAPES = [(4, 4), (2, 3, 4, 4)]


def against_torch(fn, inputs: list, dtype: type, grad: bool = True) -> None:
    """``fn(lib, *tensors)`` (a real scalar loss) under torch and mpitensor: the same value
    and the same gradient for every input (torch's gradients resolved where they come back
    as lazily conjugated views)."""
    ts, ms = zip(*(both(v, grad) for v in inputs))
    lt, lm = fn(torch, *ts), fn(mt, *ms)
    close(lm, lt.detach(), TOL[dtype])
    if not grad:
        return
    lt.backward()
    lm.backward()
    for t, m in zip(ts, ms):
        want = t.grad.resolve_conj()
        close(m.grad, want, TOL[dtype], max(np.abs(arr(want)).max(), 1.0))


def hermitian(shape: tuple, dtype: type, seed: int = 0, low: float = 1.0) -> np.ndarray:
    """A Hermitian matrix batch with eigenvalues evenly spread over [low, low + 2]."""
    *batch, n, _ = shape
    q = _orthonormal(_rng(seed), tuple(batch), n, dtype)
    lam = np.linspace(low, low + 2.0, n)
    return ((q * lam) @ np.swapaxes(q, -1, -2).conj()).astype(dtype)


def nonnormal(shape: tuple, dtype: type, seed: int = 0) -> np.ndarray:
    """``X diag(l) X^-1`` with distinct eigenvalues 1..n (well separated) and ``X`` close to
    orthogonal, so eigenvalues and eigenvectors are well conditioned."""
    rng = _rng(seed)
    *batch, n, _ = shape
    x = _orthonormal(rng, tuple(batch), n, dtype) + 0.1 * _normal(rng, shape, dtype)
    lam = np.arange(1.0, n + 1.0)
    return ((x * lam) @ np.linalg.inv(x)).astype(dtype)


# --------------------------------------------------------------------------------------------
# eigh / eigvalsh


@needs_torch
@pytest.mark.parametrize("dtype", ALL)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("uplo", ["L", "U"])
def test_eigh_values_and_gradients(dtype, shape, uplo):
    a = hermitian(shape, dtype)
    # only the UPLO triangle is read: spoil the other one
    a = a + (np.triu(np.ones(shape[-2:]), 1) if uplo == "L" else np.tril(np.ones(shape[-2:]), -1))
    a = a.astype(dtype)
    n = shape[-1]
    wl, wv = weights(shape[:-1], F64, 3), weights(shape, F64, 4)

    def loss(lib, x):
        lam, v = lib.linalg.eigh(x, UPLO=uplo)
        return (lib.tensor(wl) * lam).sum() + (lib.tensor(wv) * abs2(v)).sum()

    against_torch(loss, [a], dtype)
    against_torch(lambda lib, x: (lib.linalg.eigvalsh(x, uplo) * lib.arange(n)).sum(), [a],
                  dtype)
    t, m = both(a)
    lt, vt = torch.linalg.eigh(t, UPLO=uplo)
    lm, vm = mt.linalg.eigh(m, UPLO=uplo)
    assert lm.dtype == mt.float32 if np.dtype(dtype) in (np.float32, np.complex64) else \
        lm.dtype == mt.float64
    assert vm.dtype == m.dtype
    close(lm, lt, TOL[dtype], 3)
    close(abs2(vm), abs2(vt), TOL[dtype])


def test_eigh_finite_differences():
    a = hermitian((4, 4), F64, seed=2)
    w = weights((4, 4), F64, 5)
    # a loss of the symmetric matrix: the derivative of a symmetric input as eigh reads it
    def loss(x):
        s = x.tril() + x.tril(-1).mT
        lam, v = mt.linalg.eigh(s)
        return (lam * mt.arange(4.0, dtype=mt.float64)).sum() + (mt.tensor(w) * v * v).sum()

    x = mt.tensor(a, requires_grad=True)
    loss(x).backward()
    fd_check(loss, a)


@needs_torch
@pytest.mark.parametrize("dtype", ALL)
def test_eigh_projector_loss(dtype):
    """A loss of the spectral projector onto the two largest eigenvalues."""
    a = hermitian((2, 5, 5), dtype, seed=6)
    w = weights((2, 5, 5), F64, 8)

    def loss(lib, x):
        v = lib.linalg.eigh(x).eigenvectors[..., 3:]
        return wsum(lib, w, v @ v.mH)

    against_torch(loss, [a], dtype)


# --------------------------------------------------------------------------------------------
# eig / eigvals


@needs_torch
@pytest.mark.parametrize("dtype", ALL)
@pytest.mark.parametrize("shape", SHAPES)
def test_eig_values_and_gradients(dtype, shape):
    a = nonnormal(shape, dtype, seed=1)
    wr = weights(shape[:-1], F64, 4)

    def loss(lib, x):
        # invariant to the order of the eigenpairs and to each eigenvector's phase
        lam, v = lib.linalg.eig(x)
        rows = (lib.tensor(wr).unsqueeze(-1) * abs2(v)).sum(-2)
        return (lam ** 2).real.sum() + (lam ** 3).imag.sum() + (lam.real * rows).sum()

    against_torch(loss, [a], dtype)
    against_torch(lambda lib, x: (lib.linalg.eigvals(x) ** 3).real.sum(), [a], dtype)
    t, m = both(a)
    lam_t, _ = torch.linalg.eig(t)
    lam_m, v_m = mt.linalg.eig(m)
    want = mt.complex64 if np.dtype(dtype) in (np.float32, np.complex64) else mt.complex128
    assert lam_m.dtype == want and v_m.dtype == want
    close(np.sort(arr(lam_m), axis=-1), np.sort(arr(lam_t), axis=-1), TOL[dtype], 4)
    # A V = V diag(L), with unit columns
    close(m.to(want) @ v_m, v_m * lam_m.unsqueeze(-2), TOL[dtype], 4)
    close(abs2(v_m).sum(-2), np.ones(shape[:-1]), TOL[dtype])


def test_eig_complex_spectrum_finite_differences():
    """A real matrix with a complex pair of eigenvalues: the loss Re(sum w l) + sum |v|^2 w
    is real-differentiable; its gradient (real, as torch's) against central differences."""
    a = np.array([[0.5, -2.0, 0.3], [1.5, 0.2, 0.1], [0.2, 0.4, 3.0]])
    w = weights((3, 3), F64, 9)

    def loss(x):
        lam, v = mt.linalg.eig(x)
        c = mt.tensor([1.0, 2.0, -1.0], dtype=mt.float64)
        return (lam.real * c).sum() + (lam.imag * lam.imag).sum() + (
            mt.tensor(w) * abs2(v)).sum()

    fd_check(loss, a)


@needs_torch
@pytest.mark.parametrize("name", ["eigh", "eig"])
def test_phase_dependent_loss_raises_as_torch(name):
    a = hermitian((3, 3), np.complex128, seed=1)
    w = weights((3, 3), np.complex128, 2)   # Re sum(w * V) moves with each column's phase
    for lib, error in ((torch, RuntimeError), (mt, RuntimeError)):
        x = lib.tensor(a, requires_grad=True)
        v = getattr(lib.linalg, name)(x)[1]
        with pytest.raises(error, match="phase|ill-defined"):
            wsum(lib, w, v).backward()
    # a real input to eig: its complex eigenvectors have arbitrary phases too
    x = mt.tensor(nonnormal((3, 3), F64, seed=2), requires_grad=True)
    with pytest.raises(RuntimeError, match="phase"):
        wsum(mt, w, mt.linalg.eig(x)[1]).backward()


# --------------------------------------------------------------------------------------------
# svd / svdvals


@needs_torch
@pytest.mark.parametrize("dtype", ALL)
@pytest.mark.parametrize("shape", [(5, 3), (3, 5), (2, 4, 4), (2, 5, 3)])
@pytest.mark.parametrize("full", [True, False])
def test_svd_values_and_gradients(dtype, shape, full):
    a = conditioned(shape, dtype, seed=2)
    k = min(shape[-2:])
    wu = weights(shape[:-1] + (k,), F64, 3)
    wv = weights(shape[:-2] + (k, shape[-1]), F64, 4)

    def loss(lib, x):
        u, s, vh = lib.linalg.svd(x, full_matrices=full)
        return ((lib.arange(k) + 1.0) * s).sum() + (lib.tensor(wu) * abs2(u[..., :k])).sum() \
            + (lib.tensor(wv) * abs2(vh[..., :k, :])).sum()

    against_torch(loss, [a], dtype)
    t, m = both(a)
    ut, st, vt = torch.linalg.svd(t, full_matrices=full)
    um, sm, vm = mt.linalg.svd(m, full_matrices=full)
    assert tuple(um.shape) == tuple(ut.shape) and tuple(vm.shape) == tuple(vt.shape)
    close(sm, st, TOL[dtype], 3)
    assert sm.dtype == (mt.float32 if np.dtype(dtype).itemsize == 4 or dtype == np.complex64
                        else mt.float64)
    close((um[..., :k] * sm.unsqueeze(-2).to(um.dtype)) @ vm[..., :k, :], m, TOL[dtype], 3)


@needs_torch
@pytest.mark.parametrize("dtype", ALL)
@pytest.mark.parametrize("shape", [(5, 3), (2, 3, 5), (4, 4)])
def test_svdvals(dtype, shape):
    a = conditioned(shape, dtype, seed=3)
    k = min(shape[-2:])
    against_torch(lambda lib, x: ((lib.arange(k) + 1.0) * lib.linalg.svdvals(x)).sum(), [a],
                  dtype)
    close(mt.linalg.svdvals(mt.tensor(a)), torch.linalg.svdvals(torch.tensor(a)), TOL[dtype],
          3)


def test_svdvals_finite_differences():
    a = conditioned((4, 3), F64, seed=4)
    fd_check(lambda x: (mt.linalg.svdvals(x) ** 3).sum(), a)


# --------------------------------------------------------------------------------------------
# qr


@needs_torch
@pytest.mark.parametrize("dtype", ALL)
@pytest.mark.parametrize("shape", [(5, 3), (3, 5), (2, 4, 4)])
@pytest.mark.parametrize("mode", ["reduced", "complete", "r"])
def test_qr_modes(dtype, shape, mode):
    a = conditioned(shape, dtype, seed=5)
    t, m = both(a)
    qt, rt = torch.linalg.qr(t, mode=mode)
    qm, rm = mt.linalg.qr(m, mode=mode)
    assert tuple(qm.shape) == tuple(qt.shape) and tuple(rm.shape) == tuple(rt.shape)
    close(rm, rt, TOL[dtype], 3)
    if mode != "r":
        close(qm, qt, TOL[dtype])
    if mode == "r" or (mode == "complete" and shape[-2] > shape[-1]):
        x = mt.tensor(a, requires_grad=True)
        with pytest.raises(RuntimeError):
            r = mt.linalg.qr(x, mode=mode)
            (r.R.abs().sum() + r.Q.abs().sum()).backward()
        return
    w = weights(tuple(qt.shape), F64, 1), weights(tuple(rt.shape), F64, 2)
    against_torch(lambda lib, x: wsum(lib, w[0], lib.linalg.qr(x, mode)[0])
                  + wsum(lib, w[1], lib.linalg.qr(x, mode)[1]), [a], dtype)


# --------------------------------------------------------------------------------------------
# Cholesky, inverses and solves with info


@needs_torch
@pytest.mark.parametrize("dtype", ALL)
@pytest.mark.parametrize("upper", [False, True])
def test_cholesky_and_cholesky_ex(dtype, upper):
    a = spd((2, 4, 4), dtype, seed=6)
    w = weights((2, 4, 4), F64, 3)
    against_torch(lambda lib, x: wsum(lib, w, lib.linalg.cholesky(x, upper=upper)), [a],
                  dtype)
    against_torch(lambda lib, x: wsum(lib, w, lib.linalg.cholesky_ex(x, upper=upper).L),
                  [a], dtype)
    info = mt.linalg.cholesky_ex(mt.tensor(a)).info
    assert info.dtype == mt.int32 and arr(info).tolist() == [0, 0]


@needs_torch
def test_cholesky_ex_reports_the_leading_minor():
    a = np.stack([np.eye(3), np.diag([1.0, 2.0, -1.0]), -np.eye(3)])
    t, m = both(a)
    lt, it = torch.linalg.cholesky_ex(t)
    lm, im = mt.linalg.cholesky_ex(m)
    assert arr(im).tolist() == arr(it).tolist() == [0, 3, 1]
    close(lm[0], lt[0], 1e-12)
    close(lm[1, :2, :2], lt[1, :2, :2], 1e-12)
    with pytest.raises(mt.linalg.LinAlgError, match="batch element 1"):
        mt.linalg.cholesky_ex(m, check_errors=True)
    with pytest.raises(mt.linalg.LinAlgError, match="batch element 1"):
        mt.linalg.cholesky(m)


@needs_torch
@pytest.mark.parametrize("dtype", ALL)
def test_inv_ex_and_solve_ex(dtype):
    a = conditioned((3, 4, 4), dtype, seed=7)
    b = weights((3, 4, 2), dtype, 8)
    w = weights((3, 4, 4), F64, 3)
    against_torch(lambda lib, x: wsum(lib, w, lib.linalg.inv_ex(x).inverse), [a], dtype)
    against_torch(lambda lib, x, y: wsum(lib, w[..., :2], lib.linalg.solve_ex(x, y).result),
                  [a, b], dtype)
    against_torch(lambda lib, x, y: wsum(lib, w[..., :1, :], lib.linalg.solve_ex(
        x, y, left=False).result), [a, np.swapaxes(b[..., :1], -1, -2).copy()], dtype)
    inv, info = mt.linalg.inv_ex(mt.tensor(a))
    assert info.dtype == mt.int32 and arr(info).tolist() == [0, 0, 0]


@needs_torch
def test_singular_matrices_through_info():
    a = np.stack([np.eye(3), np.zeros((3, 3)), np.array([[1.0, 2, 3], [2, 4, 6], [1, 0, 1]])])
    t, m = both(a)
    for name in ("inv_ex", "lu_factor_ex"):
        it = getattr(torch.linalg, name)(t)[-1]
        im = getattr(mt.linalg, name)(m)[-1]
        assert arr(im).tolist() == arr(it).tolist()
    inv, info = mt.linalg.inv_ex(m)
    close(inv[0], np.eye(3), 0)
    assert np.isnan(arr(inv[1])).all()
    res, info = mt.linalg.solve_ex(m, mt.ones(3, 3, 1, dtype=mt.float64))
    want = torch.linalg.solve_ex(t, torch.ones(3, 3, 1, dtype=torch.float64)).info
    assert arr(info).tolist() == arr(want).tolist() == [0, 1, 3]
    assert np.isnan(arr(res[1])).all()
    close(res[0], np.ones((3, 1)), 0)
    for fn in (mt.linalg.inv_ex, lambda x, **k: mt.linalg.solve_ex(x, x, **k),
               mt.linalg.lu_factor_ex):
        with pytest.raises(mt.linalg.LinAlgError, match="batch element 1"):
            fn(m, check_errors=True)


@needs_torch
@pytest.mark.parametrize("dtype", ALL)
@pytest.mark.parametrize("upper", [False, True])
@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("unit", [False, True])
def test_solve_triangular(dtype, upper, left, unit):
    a = conditioned((2, 4, 4), dtype, seed=9) + 4 * np.eye(4)
    b = weights((2, 4, 3) if left else (2, 3, 4), dtype, 2)
    w = weights(b.shape, F64, 3)
    against_torch(lambda lib, x, y: wsum(lib, w, lib.linalg.solve_triangular(
        x, y, upper=upper, left=left, unitriangular=unit)), [a.astype(dtype), b], dtype)
    # batches broadcast: one matrix against a batch of right-hand sides
    against_torch(lambda lib, x, y: wsum(lib, w, lib.linalg.solve_triangular(
        x, y, upper=upper, left=left, unitriangular=unit)), [a[0].astype(dtype), b], dtype)


# --------------------------------------------------------------------------------------------
# LU


@needs_torch
@pytest.mark.parametrize("dtype", ALL)
@pytest.mark.parametrize("shape", [(4, 4), (2, 5, 3), (3, 5)])
def test_lu_factor_and_lu(dtype, shape):
    a = conditioned(shape, dtype, seed=10)
    t, m = both(a)
    lt, pt = torch.linalg.lu_factor(t)
    lm, pm = mt.linalg.lu_factor(m)
    close(lm, lt, TOL[dtype], 3)
    assert pm.dtype == mt.int32 and arr(pm).tolist() == arr(pt).tolist()
    for xt, xm in zip(torch.linalg.lu(t), mt.linalg.lu(m)):
        close(xm, xt, TOL[dtype], 3)
    w = weights(shape, F64, 3)
    against_torch(lambda lib, x: wsum(lib, w, lib.linalg.lu_factor(x).LU), [a], dtype)
    pw = weights(shape[:-1] + (min(shape[-2:]),), F64, 4)
    against_torch(lambda lib, x: wsum(lib, pw, lib.linalg.lu(x).L[..., :, :pw.shape[-1]]),
                  [a], dtype)


@needs_torch
@pytest.mark.parametrize("dtype", ALL)
@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("adjoint", [False, True])
def test_lu_solve(dtype, left, adjoint):
    a = conditioned((2, 4, 4), dtype, seed=11)
    b = weights((2, 4, 3) if left else (2, 3, 4), dtype, 5)
    w = weights(b.shape, F64, 6)

    def loss(lib, x, y):
        lu_, piv = lib.linalg.lu_factor(x)
        return wsum(lib, w, lib.linalg.lu_solve(lu_, piv, y, left=left, adjoint=adjoint))

    against_torch(loss, [a, b], dtype)


# --------------------------------------------------------------------------------------------
# householder_product, matrix_exp


@needs_torch
@pytest.mark.parametrize("dtype", ALL)
def test_householder_product_and_matrix_exp(dtype):
    a = conditioned((2, 5, 3), dtype, seed=12)
    tau = weights((2, 2), dtype, 3) * 0.5
    w = weights((2, 5, 3), F64, 4)
    against_torch(lambda lib, x, y: wsum(lib, w, lib.linalg.householder_product(x, y)),
                  [a, tau], dtype)
    sq = conditioned((2, 3, 3), dtype, seed=13) * 0.5
    against_torch(lambda lib, x: wsum(lib, w[:, :3], lib.linalg.matrix_exp(x)), [sq], dtype)


# --------------------------------------------------------------------------------------------
# lstsq


@needs_torch
@pytest.mark.parametrize("driver", [None, "gels", "gelsy", "gelsd", "gelss"])
@pytest.mark.parametrize("shape", [(6, 3), (3, 6), (2, 6, 3), (4, 4)])
@pytest.mark.parametrize("dtype", ALL)
def test_lstsq_outputs_as_torch(driver, shape, dtype):
    a = conditioned(shape, dtype, seed=14)
    b = weights(shape[:-1] + (2,), dtype, 3)
    t, m = both(a)
    bt, bm = both(b)
    rt = torch.linalg.lstsq(t, bt, driver=driver)
    rm = mt.linalg.lstsq(m, bm, driver=driver)
    assert rm._fields == ("solution", "residuals", "rank", "singular_values")
    for xm, xt in zip(rm, rt):
        assert tuple(xm.shape) == tuple(xt.shape), (xm.shape, xt.shape)
        assert str(xm.dtype).split(".")[-1] == str(xt.dtype).split(".")[-1]
        close(xm, xt, TOL[dtype], 3)
    w = weights(tuple(rt.solution.shape), F64, 4)
    against_torch(lambda lib, x, y: wsum(lib, w, lib.linalg.lstsq(x, y, driver=driver)[0]),
                  [a, b], dtype)


@needs_torch
def test_lstsq_rank_deficient_vector_and_rcond():
    a = conditioned((6, 3), F64, seed=15)
    a[:, 2] = a[:, 1]
    b = weights((6,), F64, 2)
    for driver in (None, "gelsd", "gelss"):
        rt = torch.linalg.lstsq(torch.tensor(a), torch.tensor(b), driver=driver)
        rm = mt.linalg.lstsq(mt.tensor(a), mt.tensor(b), driver=driver)
        for xm, xt in zip(rm, rt):
            close(xm, xt, 1e-10, 3)
    rt = torch.linalg.lstsq(torch.tensor(a), torch.tensor(b)[:, None], rcond=0.5,
                            driver="gelsd")
    rm = mt.linalg.lstsq(mt.tensor(a), mt.tensor(b)[:, None], rcond=0.5, driver="gelsd")
    for xm, xt in zip(rm, rt):
        close(xm, xt, 1e-10, 3)


def test_lstsq_finite_differences():
    a, b = conditioned((5, 3), F64, seed=16), weights((5, 2), F64, 1)
    w = weights((3, 2), F64, 2)
    fd_check(lambda x: (mt.linalg.lstsq(x, mt.tensor(b)).solution * mt.tensor(w)).sum(), a)
    fd_check(lambda y: (mt.linalg.lstsq(mt.tensor(a), y, driver="gelsd").residuals).sum(), b)


# --------------------------------------------------------------------------------------------
# pinv, matrix_rank, cond


@needs_torch
@pytest.mark.parametrize("dtype", ALL)
@pytest.mark.parametrize("shape", [(5, 3), (2, 3, 5), (4, 4)])
def test_pinv(dtype, shape):
    a = conditioned(shape, dtype, seed=17)
    w = weights(shape[:-2] + shape[-2:][::-1], F64, 3)
    against_torch(lambda lib, x: wsum(lib, w, lib.linalg.pinv(x)), [a], dtype)
    against_torch(lambda lib, x: wsum(lib, w, lib.linalg.pinv(x, atol=1.5)), [a], dtype)
    against_torch(lambda lib, x: wsum(lib, w, lib.linalg.pinv(x, rtol=0.6)), [a], dtype)
    against_torch(lambda lib, x: wsum(lib, w, lib.linalg.pinv(x, 0.6)), [a], dtype)
    against_torch(lambda lib, x: wsum(lib, w, lib.linalg.pinv(x, rcond=0.4)), [a], dtype)
    with pytest.raises(TypeError):
        mt.linalg.pinv(mt.tensor(a), 0.5, atol=0.1)
    if shape[-1] == shape[-2]:
        # only the lower triangle is read: the upper one is spoilt
        h = hermitian(shape, dtype, seed=3, low=-1.5) + np.triu(np.ones(shape[-2:]), 1)
        against_torch(lambda lib, x: wsum(lib, w, lib.linalg.pinv(x, hermitian=True)),
                      [h.astype(dtype)], dtype)


def test_pinv_finite_differences():
    a = conditioned((5, 3), F64, seed=18)
    w = weights((3, 5), F64, 1)
    fd_check(lambda x: (mt.linalg.pinv(x) * mt.tensor(w)).sum(), a)


@needs_torch
@pytest.mark.parametrize("dtype", ALL)
def test_matrix_rank(dtype):
    a = conditioned((3, 5, 4), dtype, seed=19)
    a[1, :, 3] = a[1, :, 0]
    a[2] = 0
    h = hermitian((4, 4), dtype, low=-1.0)
    t, m = both(a)
    cases = [({}, t, m), ({"atol": 2.0}, t, m), ({"rtol": 0.5}, t, m),
             ({"atol": 0.5, "rtol": 0.5}, t, m), ({"hermitian": True},) + both(h),
             ({"tol": 2.0},) + both(a)]
    for kw, xt, xm in cases:
        rt, rm = torch.linalg.matrix_rank(xt, **kw), mt.linalg.matrix_rank(xm, **kw)
        assert rm.dtype == mt.int64 and arr(rm).tolist() == arr(rt).tolist(), kw


@needs_torch
@pytest.mark.parametrize("dtype", ALL)
@pytest.mark.parametrize("p", [None, 2, -2, "fro", "nuc", math.inf, -math.inf, 1, -1])
def test_cond(dtype, p):
    a = conditioned((2, 4, 4), dtype, seed=20)
    # torch 2.13 cannot differentiate cond through its inverse (an in-place write breaks its
    # graph): those gradients are checked by finite differences instead
    by_svd = p in (None, 2, -2)
    against_torch(lambda lib, x: lib.linalg.cond(x, p).sum(), [a], dtype, grad=by_svd)
    if dtype == F64:
        fd_check(lambda x: mt.linalg.cond(x, p).sum(), a)
    out = mt.linalg.cond(mt.tensor(a), p)
    assert out.dtype == (mt.float32 if np.dtype(dtype).itemsize // (
        2 if np.dtype(dtype).kind == "c" else 1) == 4 else mt.float64)
    if p in (None, 2, -2):
        against_torch(lambda lib, x: lib.linalg.cond(x, p).sum(),
                      [conditioned((2, 5, 3), dtype, seed=21)], dtype)
    sing = np.stack([np.eye(3), np.diag([1.0, 0.0, 1.0])]).astype(dtype)
    if p not in (None, 2, -2):
        got = arr(mt.linalg.cond(mt.tensor(sing), p))
        np.testing.assert_array_equal(got, arr(torch.linalg.cond(torch.tensor(sing), p)))
        assert got[1] == np.inf


# --------------------------------------------------------------------------------------------
# tensorinv, tensorsolve, vander


@needs_torch
@pytest.mark.parametrize("dtype", ALL)
def test_tensorinv_tensorsolve(dtype):
    a = conditioned((6, 6), dtype, seed=22).reshape(2, 3, 6)
    w = weights((6, 2, 3), F64, 3)
    against_torch(lambda lib, x: wsum(lib, w, lib.linalg.tensorinv(x, ind=2)), [a], dtype)
    a2 = conditioned((6, 6), dtype, seed=23).reshape(2, 3, 3, 2)
    b = weights((2, 3), dtype, 4)
    w2 = weights((3, 2), F64, 5)
    against_torch(lambda lib, x, y: wsum(lib, w2, lib.linalg.tensorsolve(x, y)), [a2, b],
                  dtype)
    a3 = np.moveaxis(a2, 2, 0).copy()
    w3 = w2.reshape(2, 3)   # A3 with its dim 0 moved to the end is (2, 3, 2, 3): X is 2 x 3
    against_torch(lambda lib, x, y: wsum(lib, w3, lib.linalg.tensorsolve(x, y, dims=(0,))),
                  [a3, b], dtype)


@needs_torch
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex128, np.int64])
def test_vander(dtype):
    x = (np.array([[1.0, -2.0, 0.0, 3.0], [0.5, 2.0, -1.0, 1.5]]) * (
        1 + (1j if np.dtype(dtype).kind == "c" else 0))).astype(dtype)
    for n in (None, 2, 5):
        t, m = both(x)
        vt, vm = torch.linalg.vander(t, N=n), mt.linalg.vander(m, N=n)
        assert str(vm.dtype).split(".")[-1] == str(vt.dtype).split(".")[-1]
        close(vm, vt, 0)
    if dtype in (np.float64, np.complex128):
        w = weights((2, 4, 5), F64, 1)
        against_torch(lambda lib, v: wsum(lib, w, lib.linalg.vander(v, N=5)), [x], dtype)


# --------------------------------------------------------------------------------------------
# Bad inputs


def test_bad_inputs():
    sq, rect = mt.tensor(spd((3, 3), F64)), mt.ones(3, 4, dtype=mt.float64)
    for fn in (mt.linalg.eigh, mt.linalg.eigvalsh, mt.linalg.eig, mt.linalg.eigvals,
               mt.linalg.cholesky, mt.linalg.cholesky_ex, mt.linalg.inv_ex,
               mt.linalg.matrix_exp):
        with pytest.raises(ValueError, match="square"):
            fn(rect)
    for fn in (mt.linalg.eigh, mt.linalg.svd, mt.linalg.svdvals, mt.linalg.qr,
               mt.linalg.pinv, mt.linalg.lu_factor):
        with pytest.raises(TypeError):
            fn(mt.ones(3, 3, dtype=mt.int64))
        with pytest.raises(ValueError):
            fn(mt.ones(3, dtype=mt.float64))
    with pytest.raises(ValueError, match="UPLO"):
        mt.linalg.eigh(sq, UPLO="X")
    with pytest.raises(ValueError, match="mode"):
        mt.linalg.qr(sq, mode="full")
    with pytest.raises(ValueError, match="driver"):
        mt.linalg.lstsq(sq, sq, driver="gelsx")
    with pytest.raises(ValueError, match="rows"):
        mt.linalg.lstsq(sq, mt.ones(4, 2, dtype=mt.float64))
    with pytest.raises(TypeError):
        mt.linalg.vander(mt.ones(3), 4)   # N is keyword-only, as torch's
    with pytest.raises(ValueError, match="greater than 1"):
        mt.linalg.vander(mt.ones(3), N=1)
    with pytest.raises(ValueError, match="p must be"):
        mt.linalg.cond(sq, 3)
    with pytest.raises(ValueError, match="square"):
        mt.linalg.cond(rect, "fro")
    with pytest.raises(ValueError, match="ind"):
        mt.linalg.tensorinv(sq, ind=0)
    with pytest.raises(ValueError):
        mt.linalg.tensorinv(mt.ones(2, 3, 4), ind=1)
    with pytest.raises(ValueError):
        mt.linalg.tensorsolve(mt.ones(2, 3, 6), mt.ones(3, 2))
    with pytest.raises(NotImplementedError):
        mt.linalg.lu_factor(sq, pivot=False)
    with pytest.raises(ValueError, match="driver"):
        mt.linalg.svd(sq, driver="gesvd")


# --------------------------------------------------------------------------------------------
# A user-style program: PCA whitening, a least-squares head and a spectral-norm penalty


def _program(lib, data: dict) -> list:
    """Three training steps of a whitened linear model: the features are whitened with
    eigh of their covariance, a regression head is fitted by lstsq on the whitened
    features, and a trainable projection is penalised by its largest singular value."""
    x, y = lib.tensor(data["x"]), lib.tensor(data["y"])
    proj = lib.tensor(data["w"], requires_grad=True)
    opt = lib.optim.SGD([proj], lr=0.05)
    losses = []
    for _ in range(3):
        opt.zero_grad()
        h = x @ proj
        h = h - h.mean(0, keepdim=True)
        cov = h.mT @ h / (h.shape[0] - 1) + 1e-3 * lib.eye(h.shape[1], dtype=h.dtype)
        lam, vec = lib.linalg.eigh(cov)
        white = h @ vec / lam.sqrt()
        head = lib.linalg.lstsq(white, y).solution
        fit = ((white @ head - y) ** 2).mean()
        penalty = lib.linalg.svdvals(proj)[0]
        loss = fit + 0.1 * penalty
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


@needs_torch
def test_user_program_pca_lstsq_spectral_penalty():
    rng = _rng(42)
    data = {"x": rng.standard_normal((40, 6)), "y": rng.standard_normal((40, 2)),
            "w": rng.standard_normal((6, 4)) / 2}
    got, want = _program(mt, data), _program(torch, data)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-8)
    assert got[-1] != got[0]


# --------------------------------------------------------------------------------------------
# ldl_factor, ldl_factor_ex, ldl_solve


def _indefinite(n: int, dtype: type, seed: int, herm: bool = False) -> np.ndarray:
    """A symmetric (Hermitian where ``herm``) indefinite matrix; every third one has a small
    diagonal, so Bunch-Kaufman takes 2 x 2 pivots and interchanges."""
    rng = _rng(seed)
    a = _normal(rng, (n, n), dtype)
    if seed % 3 == 0:
        np.fill_diagonal(a, 0.01 * rng.standard_normal(n))
    return (a + (a.T.conj() if herm else a.T)).astype(dtype)


@needs_torch
@pytest.mark.parametrize("dtype", ALL)
@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("herm", [False, True])
def test_ldl_factor_and_solve_as_torch(dtype, n, herm):
    for seed in range(6):
        a = _indefinite(n, dtype, seed, herm)
        t, m = both(a)
        ldt, pt = torch.linalg.ldl_factor(t, hermitian=herm)
        ldm, pm = mt.linalg.ldl_factor(m, hermitian=herm)
        assert pm.dtype == mt.int32 and arr(pm).tolist() == arr(pt).tolist()
        close(ldm, ldt, TOL[dtype], 10)
        b = weights((n, 2), dtype, seed)
        got = mt.linalg.ldl_solve(ldm, pm, mt.tensor(b), hermitian=herm)
        close(got, torch.linalg.ldl_solve(ldt, pt, torch.tensor(b), hermitian=herm),
              TOL[dtype], 10)
        close(m @ got, b, TOL[dtype], 10)


@needs_torch
def test_ldl_batched_singular_and_errors():
    a = np.stack([_indefinite(4, F64, s) for s in range(3)])
    t, m = both(a)
    ldt, pt, it = torch.linalg.ldl_factor_ex(t)
    ldm, pm, im = mt.linalg.ldl_factor_ex(m)
    assert arr(pm).tolist() == arr(pt).tolist() and arr(im).tolist() == arr(it).tolist()
    close(ldm, ldt, 1e-10, 10)
    b = weights((3, 4, 2), F64, 1)
    x = mt.linalg.ldl_solve(ldm, pm, mt.tensor(b))
    close(mt.tensor(a) @ x, b, 1e-10, 10)
    sing = np.stack([np.eye(3), np.zeros((3, 3))])
    ld, piv, info = mt.linalg.ldl_factor_ex(mt.tensor(sing))
    assert arr(info).tolist() == [0, 1]
    with pytest.raises(mt.linalg.LinAlgError, match="batch element 1"):
        mt.linalg.ldl_factor(mt.tensor(sing))
    with pytest.raises(ValueError, match="square"):
        mt.linalg.ldl_factor(mt.ones(2, 3, dtype=mt.float64))
    x = mt.tensor(a, requires_grad=True)
    with pytest.raises(RuntimeError, match="not implemented"):
        mt.linalg.ldl_factor(x).LD.sum().backward()
    y = mt.tensor(b, requires_grad=True)
    with pytest.raises(RuntimeError, match="not implemented"):
        mt.linalg.ldl_solve(ldm, pm, y).sum().backward()


# --------------------------------------------------------------------------------------------
# Keyword forms, and the complex gradients of inv/solve/det/slogdet these build on


@needs_torch
def test_keyword_forms_as_torch():
    a, s = conditioned((4, 4), F64, seed=30), spd((4, 4), F64, seed=31)
    b = weights((4, 2), F64, 1)
    calls = [
        ("cholesky", {"input": s, "upper": True}), ("cholesky_ex", {"input": s, "upper": False}),
        ("inv_ex", {"A": a}), ("solve_ex", {"A": a, "B": b, "left": True}),
        ("solve_triangular", {"input": a, "B": b, "upper": False, "unitriangular": True}),
        ("qr", {"A": a, "mode": "complete"}), ("svd", {"A": a, "full_matrices": False}),
        ("svdvals", {"A": a}), ("eigh", {"input": s, "UPLO": "U"}),
        ("eigvalsh", {"input": s, "UPLO": "L"}), ("lu_factor", {"A": a, "pivot": True}),
        ("lu_factor_ex", {"A": a}), ("lu", {"A": a}), ("matrix_exp", {"input": a * 0.3}),
        ("eig", {"input": a}), ("eigvals", {"input": a}),
        ("tensorsolve", {"input": a, "other": b[:, 0], "dims": None}),
        ("lstsq", {"input": a, "b": b, "rcond": None, "driver": "gelsd"}),
        ("pinv", {"input": a, "atol": 0.0, "rtol": 0.1, "hermitian": False}),
        ("matrix_rank", {"input": a, "atol": 1.5}), ("cond", {"input": a, "p": "fro"}),
        ("tensorinv", {"input": a, "ind": 1}), ("vander", {"x": b[:, 0], "N": 3}),
        ("ldl_factor", {"input": s, "hermitian": True}), ("ldl_factor_ex", {"input": s}),
    ]
    for name, kw in calls:
        got = getattr(mt.linalg, name)(**{k: mt.tensor(v) if isinstance(v, np.ndarray) else v
                                         for k, v in kw.items()})
        want = getattr(torch.linalg, name)(**{k: torch.tensor(v) if isinstance(v, np.ndarray)
                                              else v for k, v in kw.items()})
        got = got if isinstance(got, tuple) else (got,)
        want = want if isinstance(want, tuple) else (want,)
        assert type(got).__name__ == type(want).__name__ or len(got) == 1, name
        for g, w in zip(got, want):
            close(g, w, 1e-10, 10)
    lu_, piv = torch.linalg.lu_factor(torch.tensor(a))
    close(mt.linalg.lu_solve(LU=mt.tensor(lu_.numpy()), pivots=mt.tensor(piv.numpy()),
                             B=mt.tensor(b), left=True, adjoint=True),
          torch.linalg.lu_solve(LU=lu_, pivots=piv, B=torch.tensor(b), adjoint=True), 1e-10)
    h = torch.geqrf(torch.tensor(a))
    close(mt.linalg.householder_product(input=mt.tensor(h.a.numpy()),
                                        tau=mt.tensor(h.tau.numpy())),
          torch.linalg.householder_product(input=h.a, tau=h.tau), 1e-10)
    close(mt.linalg.ldl_solve(LD=mt.tensor(s), pivots=mt.tensor(np.arange(1, 5, dtype=np.int32)),
                              B=mt.tensor(b), hermitian=False),
          torch.linalg.ldl_solve(LD=torch.tensor(s), pivots=torch.arange(1, 5, dtype=torch.int32),
                                 B=torch.tensor(b), hermitian=False), 1e-10)


@needs_torch
@pytest.mark.parametrize("dtype", [np.complex64, np.complex128])
def test_complex_gradients_of_inv_solve_det_slogdet(dtype):
    a = conditioned((2, 3, 3), dtype, seed=32)
    b = weights((2, 3, 2), dtype, 1)
    w = weights((2, 3, 3), np.complex128, 2)
    against_torch(lambda lib, x: wsum(lib, w, lib.linalg.inv(x)), [a], dtype)
    against_torch(lambda lib, x, y: wsum(lib, w[..., :2], lib.linalg.solve(x, y)), [a, b],
                  dtype)
    against_torch(lambda lib, x: wsum(lib, w[:, 0, :1], lib.linalg.det(x)[:, None]), [a],
                  dtype)
    against_torch(lambda lib, x: lib.linalg.slogdet(x)[1].sum(), [a], dtype)


@needs_torch
def test_tolerances_given_as_tensors_per_batch_element():
    a = conditioned((3, 4, 4), F64, seed=1)
    at, rt = np.array([0.5, 1.5, 2.5]), np.array([0.1, 0.6, 0.9])
    for lib_kw in ({"atol": at}, {"rtol": rt}, {"atol": at, "rtol": rt}):
        kt = {k: torch.tensor(v) for k, v in lib_kw.items()}
        km = {k: mt.tensor(v) for k, v in lib_kw.items()}
        assert arr(mt.linalg.matrix_rank(mt.tensor(a), **km)).tolist() == arr(
            torch.linalg.matrix_rank(torch.tensor(a), **kt)).tolist()
        close(mt.linalg.pinv(mt.tensor(a), **km), torch.linalg.pinv(torch.tensor(a), **kt),
              1e-10)
    close(mt.linalg.pinv(mt.tensor(a), mt.tensor(rt)),
          torch.linalg.pinv(torch.tensor(a), torch.tensor(rt)), 1e-10)


def test_batches_that_do_not_broadcast():
    a, b = mt.tensor(conditioned((2, 3, 3), F64)), mt.ones(3, 3, 1, dtype=mt.float64)
    lu_, piv = mt.linalg.lu_factor(a)
    ld, lpiv = mt.linalg.ldl_factor(mt.tensor(spd((2, 3, 3), F64)))
    for fn in (lambda: mt.linalg.solve_ex(a, b), lambda: mt.linalg.lstsq(a, b),
               lambda: mt.linalg.solve_triangular(a, b, upper=True),
               lambda: mt.linalg.lu_solve(lu_, piv, b), lambda: mt.linalg.ldl_solve(ld, lpiv, b)):
        with pytest.raises(ValueError, match="batch dimensions"):
            fn()
    # one matrix against a batch of right-hand sides, and a batch of vectors, still work
    x = mt.linalg.solve_triangular(a[0], b, upper=True)
    assert tuple(x.shape) == (3, 3, 1)
    assert tuple(mt.linalg.lstsq(a, mt.ones(2, 3, dtype=mt.float64)).solution.shape) == (2, 3)
    assert tuple(mt.linalg.solve_triangular(a, b[0], upper=False).shape) == (2, 3, 1)
