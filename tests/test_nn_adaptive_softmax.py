"""nn.AdaptiveLogSoftmaxWithLoss against torch with the same weights: output, loss, input and
parameter gradients, log_prob, predict, unbatched rows, state-dict keys, repr, bad inputs."""

from __future__ import annotations

import numpy as np
import pytest

import mpitensor as mt
import mpitensor.nn as nn

from .nn_oracle import close, tol

torch = pytest.importorskip("torch")
rng = np.random.default_rng(4)


def _pair(dtype, **kw):
    args = dict(in_features=8, n_classes=20, cutoffs=[4, 9, 15], div_value=2.0)
    args.update(kw)
    theirs = torch.nn.AdaptiveLogSoftmaxWithLoss(**args).to(
        torch.float32 if dtype == np.float32 else torch.float64)
    ours = nn.AdaptiveLogSoftmaxWithLoss(**args).to(
        mt.float32 if dtype == np.float32 else mt.float64)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert repr(ours) == repr(theirs)
    ours.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})
    return ours, theirs


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("head_bias", [False, True])
@pytest.mark.parametrize("target", [[0, 5, 19, 3, 10, 9, 16], [1, 2, 3, 0, 0, 1, 2]])
def test_forward_backward_log_prob_predict(dtype, head_bias, target):
    ours, theirs = _pair(dtype, head_bias=head_bias)
    x = rng.standard_normal((7, 8)).astype(dtype)
    xa, xb = mt.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    oa, ob = ours(xa, mt.tensor(target)), theirs(xb, torch.tensor(target))
    r = tol(dtype, 40)
    close(oa.output, ob.output, r, "output")
    close(oa.loss, ob.loss, r, "loss")
    (oa.loss + 0.3 * oa.output.sum()).backward()
    (ob.loss + 0.3 * ob.output.sum()).backward()
    close(xa.grad, xb.grad, r, "input grad")
    for (name, p), (_, q) in zip(ours.named_parameters(), theirs.named_parameters()):
        close(p.grad, q.grad, r, name)
    close(ours.log_prob(mt.tensor(x)), theirs.log_prob(torch.tensor(x)), r, "log_prob")
    assert np.array_equal(ours.predict(mt.tensor(x)).numpy(),
                          theirs.predict(torch.tensor(x)).numpy())
    one_a, one_b = ours(mt.tensor(x[0]), mt.tensor(target[0])), theirs(torch.tensor(x[0]),
                                                                      torch.tensor(target[0]))
    assert tuple(one_a.output.shape) == tuple(one_b.output.shape) == ()
    close(one_a.output, one_b.output, r, "unbatched")


def test_bad_arguments():
    for cutoffs in ([], [5, 3], [0, 4], [4, 20], [4, 4]):
        with pytest.raises(ValueError):
            torch.nn.AdaptiveLogSoftmaxWithLoss(8, 20, cutoffs)
        with pytest.raises(ValueError):
            nn.AdaptiveLogSoftmaxWithLoss(8, 20, cutoffs)
    ours, theirs = _pair(np.float64)
    x = rng.standard_normal((3, 8))
    for xs, t in [(x, [0, 1]), (x, [0, 1, 20]), (x[None], [0, 1, 2])]:
        with pytest.raises(RuntimeError):
            theirs(torch.tensor(xs), torch.tensor(t))
        with pytest.raises(RuntimeError):
            ours(mt.tensor(xs), mt.tensor(t))
