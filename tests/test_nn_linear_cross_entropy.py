"""F.linear_cross_entropy, nn.LinearCrossEntropyLoss and LinearCrossEntropyOptions against
torch: losses and input/weight/bias gradients in float32 and float64, on the full-logits path
and the chunked one, with class weights, label smoothing, ignore_index and K-dimensional
losses; reprs, state-dict keys and bad arguments."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import mpitensor as mt
import mpitensor.nn as nn
import mpitensor.nn.functional as F

from .nn_oracle import both, close, tol

torch = pytest.importorskip("torch")
rng = np.random.default_rng(5)
KWS = [dict(), dict(reduction="sum", label_smoothing=0.2),
       dict(weight=True, label_smoothing=0.1, ignore_index=2), dict(weight=True),
       dict(reduction="none")]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("chunk", [None, 3, 100])
@pytest.mark.parametrize("kw", KWS)
def test_functional(dtype, chunk, kw):
    t = rng.integers(0, 6, 7)
    t[1] = 2
    cw = rng.random(6) + 0.5

    def run(mod, fn, opts_cls, x, w, b):
        k = dict(kw)
        if k.pop("weight", False):
            k["weight"] = mod.tensor(cw.astype(dtype))
        opts = None if chunk is None else opts_cls(batch_chunk_size=chunk)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # 'none' leaves the chunked path, with a warning
            return fn(x, w, mod.tensor(t), linear_bias=b, options=opts, **k)

    both(lambda x, w, b: run(mt, F.linear_cross_entropy, F.LinearCrossEntropyOptions, x, w, b),
         lambda x, w, b: run(torch, torch.nn.functional.linear_cross_entropy,
                             torch.nn.LinearCrossEntropyOptions, x, w, b),
         [rng.standard_normal((7, 4)), rng.standard_normal((6, 4)), rng.standard_normal(6)],
         dtype, tol(dtype, 30))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kw", [dict(), dict(out_features=(3,), bias=True),
                                dict(bias=True, label_smoothing=0.1, ignore_index=1)])
def test_module(dtype, kw):
    tdt = torch.float32 if dtype == np.float32 else torch.float64
    theirs = torch.nn.LinearCrossEntropyLoss(4, 5, **kw).to(tdt)
    ours = nn.LinearCrossEntropyLoss(4, 5, **kw).to(mt.float32 if dtype == np.float32
                                                    else mt.float64)
    assert repr(ours) == repr(theirs) and list(ours.state_dict()) == list(theirs.state_dict())
    ours.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})
    t = rng.integers(0, 5, (6, *kw.get("out_features", ())))
    both(lambda x: ours(x, mt.tensor(t)), lambda x: theirs(x, torch.tensor(t)),
         [rng.standard_normal((6, 4))], dtype, tol(dtype, 30))
    close(ours.linear.weight.grad, theirs.linear.weight.grad, tol(dtype, 30), "weight grad")


def test_options_and_bad_arguments():
    assert repr(F.LinearCrossEntropyOptions(batch_chunk_size=2)) == \
        repr(torch.nn.LinearCrossEntropyOptions(batch_chunk_size=2))
    with pytest.raises(ValueError):
        F.LinearCrossEntropyOptions(acc_policy="fast")
    with pytest.raises(ValueError):
        F.LinearCrossEntropyOptions(batch_chunk_size=0)
    with pytest.raises(RuntimeError):
        torch.nn.functional.linear_cross_entropy(torch.zeros(2, 3, 4), torch.zeros(5, 4),
                                                 torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(RuntimeError):
        F.linear_cross_entropy(mt.zeros(2, 3, 4), mt.zeros(5, 4), mt.zeros(2, 3, dtype=mt.int64))
    with pytest.warns(UserWarning):
        F.linear_cross_entropy(mt.zeros(2, 4), mt.zeros(5, 4), mt.tensor([0, 1]),
                               reduction="none", options=F.LinearCrossEntropyOptions())
