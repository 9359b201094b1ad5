"""InstanceNorm1d/2d/3d, F.instance_norm and BatchNorm3d against torch: values, gradients,
running statistics, state-dict keys and reprs in float32 and float64, and bad inputs."""

from __future__ import annotations

import numpy as np
import pytest

import mpitensor as mt
import mpitensor.nn as nn
import mpitensor.nn.functional as F

from .nn_oracle import both, close, tol

torch = pytest.importorskip("torch")
rng = np.random.default_rng(1)
KWS = [dict(), dict(affine=True, track_running_stats=True),
       dict(track_running_stats=True, momentum=None), dict(affine=True, bias=False)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("cls,shape", [("InstanceNorm1d", (3, 4, 7)), ("InstanceNorm1d", (4, 7)),
                                       ("InstanceNorm2d", (2, 4, 5, 6)),
                                       ("InstanceNorm3d", (2, 4, 3, 5, 6)),
                                       ("InstanceNorm3d", (4, 3, 5, 6)),
                                       ("BatchNorm3d", (2, 4, 3, 5, 6))])
@pytest.mark.parametrize("kw", KWS)
def test_module_matches_torch(dtype, cls, shape, kw):
    tdt = torch.float32 if dtype == np.float32 else torch.float64
    ours = getattr(nn, cls)(4, **kw).to(mt.float32 if dtype == np.float32 else mt.float64)
    theirs = getattr(torch.nn, cls)(4, **kw).to(tdt)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert repr(ours) == repr(theirs)
    if ours.weight is not None:
        w = rng.standard_normal(4)
        ours.weight.data = mt.tensor(w.astype(dtype))
        theirs.weight.data = torch.tensor(w, dtype=tdt)
    terms = int(np.prod(shape)) // 4
    for train in (True, True, False):
        ours.train(train)
        theirs.train(train)
        both(ours, theirs, [rng.standard_normal(shape)], dtype, tol(dtype, terms))
        for k, v in theirs.state_dict().items():
            close(ours.state_dict()[k], v, tol(dtype, terms), k)
    if ours.weight is not None:
        close(ours.weight.grad, theirs.weight.grad, tol(dtype, terms * 3), "weight grad")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_functional_with_stats(dtype):
    rm, rv = rng.standard_normal(4), rng.random(4) + 0.5
    stats = {}

    def run(mod, x, w, b):
        m, v = mod.tensor(rm.astype(dtype)), mod.tensor(rv.astype(dtype))
        stats[mod.__name__] = (m, v)
        fn = F.instance_norm if mod is mt else torch.nn.functional.instance_norm
        return fn(x, m, v, w, b, True, 0.3, 1e-4)

    both(lambda x, w, b: run(mt, x, w, b), lambda x, w, b: run(torch, x, w, b),
         [rng.standard_normal((3, 4, 5, 6)), rng.standard_normal(4), rng.standard_normal(4)],
         dtype, tol(dtype, 90))
    for a, b in zip(stats["mpitensor"], stats["torch"]):
        close(a, b, tol(dtype, 90))


def test_bad_inputs():
    with pytest.raises(ValueError):
        nn.InstanceNorm2d(3)(mt.zeros(2, 3, 4, 4, 1))
    with pytest.raises(ValueError):
        nn.InstanceNorm1d(3, affine=True)(mt.zeros(2, 5, 4))
    with pytest.raises(ValueError):
        nn.BatchNorm3d(3)(mt.zeros(2, 3, 4, 4))
    with pytest.raises(ValueError):  # one value per plane
        F.instance_norm(mt.zeros(2, 3, 1))
    with pytest.raises(ValueError):
        torch.nn.functional.instance_norm(torch.zeros(2, 3, 1))
    with pytest.warns(UserWarning):
        nn.InstanceNorm1d(3)(mt.randn(2, 5, 4))


def test_instance_norm_is_not_a_batch_norm():
    from mpitensor.nn.modules.batchnorm import _BatchNorm
    assert not isinstance(nn.InstanceNorm2d(3), _BatchNorm)
    assert isinstance(nn.BatchNorm3d(3), _BatchNorm)
