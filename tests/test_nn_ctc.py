"""F.ctc_loss and nn.CTCLoss against torch: losses and gradients (through log_softmax and
straight into log_probs) in float32 and float64, every reduction, zero_infinity, padded,
concatenated and unbatched targets, lengths as tuples or tensors, and bad arguments."""

from __future__ import annotations

import numpy as np
import pytest

import mpitensor as mt
import mpitensor.nn as nn
import mpitensor.nn.functional as F

from .nn_oracle import both, tol

torch = pytest.importorskip("torch")
rng = np.random.default_rng(2)
T, N, C = 12, 4, 5
IL, TL = (12, 10, 3, 7), (6, 4, 3, 0)


def _targets():
    tg = rng.integers(1, C, (N, 6))
    tg[0, :3] = 2  # repeated labels need a blank between them
    return tg


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("zero_infinity", [False, True])
@pytest.mark.parametrize("as_tensors", [False, True])
def test_padded_targets_through_log_softmax(dtype, reduction, zero_infinity, as_tensors):
    tg = _targets()
    il, tl = (IL, TL) if not as_tensors else (np.array(IL), np.array(TL))

    def run(mod, fn, x):
        lens = (il, tl) if not as_tensors else (mod.tensor(il), mod.tensor(tl))
        return fn(x.log_softmax(2), mod.tensor(tg), *lens, reduction=reduction,
                  zero_infinity=zero_infinity)

    rtol = tol(dtype, T * 13) if dtype == np.float32 else 1e-12
    both(lambda x: run(mt, F.ctc_loss, x),
         lambda x: run(torch, torch.nn.functional.ctc_loss, x),
         [rng.standard_normal((T, N, C))], dtype, rtol)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_concatenated_targets_blank_and_raw_log_probs(dtype):
    tg = _targets()
    flat = np.concatenate([np.where(row == 3, 0, row)[:n] for row, n in zip(tg, TL)])
    rtol = tol(dtype, T * 13) if dtype == np.float32 else 1e-12
    # the gradient with respect to log_probs themselves is torch's formula, not autograd's
    both(lambda x: nn.CTCLoss(blank=3, reduction="sum")(x, mt.tensor(flat), IL, TL),
         lambda x: torch.nn.CTCLoss(blank=3, reduction="sum")(x, torch.tensor(flat), IL, TL),
         [np.log(rng.dirichlet(np.ones(C), (T, N)))], dtype, rtol)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_unbatched_and_impossible(dtype):
    rtol = tol(dtype, T * 13) if dtype == np.float32 else 1e-12
    x = rng.standard_normal((T, C))
    both(lambda v: F.ctc_loss(v.log_softmax(1), mt.tensor([1, 2, 2]), (T,), (3,)),
         lambda v: torch.nn.functional.ctc_loss(v.log_softmax(1), torch.tensor([1, 2, 2]),
                                                (T,), (3,)), [x], dtype, rtol)
    lp = mt.tensor(rng.standard_normal((3, 2, C)), requires_grad=True)
    out = F.ctc_loss(lp.log_softmax(2), mt.tensor([[1, 1], [1, 2]]), (2, 3), (2, 2),
                     reduction="none")
    assert np.isinf(out.detach().numpy()[0]) and np.isfinite(out.detach().numpy()[1])


def test_bad_arguments_raise_like_torch():
    lp = rng.standard_normal((5, 2, 4))
    tg = np.array([[1, 2, 3], [1, 1, 0]])
    cases = [(tg, (6, 5), (3, 2)), (tg, (5, 5), (4, 2)), (np.array([1, 2, 3, 1]), (5, 5), (3, 2)),
             (tg, (5, 5, 5), (3, 2))]
    for t, il, tl in cases:
        with pytest.raises(RuntimeError):
            torch.nn.functional.ctc_loss(torch.tensor(lp), torch.tensor(t), il, tl)
        with pytest.raises(RuntimeError):
            F.ctc_loss(mt.tensor(lp), mt.tensor(t), il, tl)
    with pytest.raises(ValueError):
        F.ctc_loss(mt.tensor(lp), mt.tensor(tg), (5, 5), (3, 2), reduction="avg")
    with pytest.raises(RuntimeError):
        F.ctc_loss(mt.tensor(lp), mt.tensor(tg), (5, 5), (3, 2), blank=4)
    assert repr(nn.CTCLoss()) == "CTCLoss()"


@pytest.mark.gpu
def test_gpu_ctc_matches_cpu():
    x = rng.standard_normal((T, N, C))
    tg = _targets()
    out = []
    for dev in ("cpu", "cuda"):
        a = mt.tensor(x, device=dev, requires_grad=True)
        loss = F.ctc_loss(a.log_softmax(2), mt.tensor(tg, device=dev), IL, TL)
        loss.backward()
        out.append((float(loss), a.grad.cpu().numpy()))
    assert abs(out[0][0] - out[1][0]) < 1e-10
    np.testing.assert_allclose(out[1][1], out[0][1], rtol=1e-10, atol=1e-12)
