"""Learning-rate schedules, importable as ``torch.optim.lr_scheduler`` code expects.

A scheduler owns no rates of its own: it rewrites ``group["lr"]`` in its optimiser's parameter
groups each time :meth:`LRScheduler.step` is called (once per epoch, after ``optimizer.step()``),
and remembers in ``base_lrs`` where every group started. Each schedule computes the next rates
the way torch does (most from the current rates, step to step), so that the sequence is
bit-for-bit the one torch produces: ``StepLR``, ``MultiStepLR`` and ``ExponentialLR`` multiply by
powers of ``gamma``; ``CosineAnnealingLR`` follows torch's recursive cosine; ``LambdaLR`` scales
``base_lrs`` by user functions; ``OneCycleLR`` anneals per batch between ``max_lr`` and small
rates (and cycles the momentum the other way); ``ReduceLROnPlateau`` watches a metric instead of
the epoch count. ``LinearLR``, ``ConstantLR`` and ``PolynomialLR`` warm up or decay over
``total_iters`` epochs; ``CosineAnnealingWarmRestarts`` restarts the cosine (periods growing by
``T_mult``); ``CyclicLR`` cycles between two rates per batch; ``SequentialLR`` hands over from
one schedule to the next at milestones and ``ChainedScheduler`` applies several at every step.

Where each lives: ``_base`` (``LRScheduler`` and the shared argument checks), ``_decay`` (powers
of ``gamma`` and fixed-length ramps), ``_lambda`` (user functions), ``_cycles`` (cosine, one-cycle
and cyclic), ``_plateau`` (driven by a metric), ``_combined`` (schedules of schedules).
"""

from ._base import LRScheduler
from ._combined import ChainedScheduler, SequentialLR
from ._cycles import CosineAnnealingLR, CosineAnnealingWarmRestarts, CyclicLR, OneCycleLR
from ._decay import ConstantLR, ExponentialLR, LinearLR, MultiStepLR, PolynomialLR, StepLR
from ._lambda import LambdaLR, MultiplicativeLR
from ._plateau import ReduceLROnPlateau

__all__ = ["LRScheduler", "StepLR", "MultiStepLR", "ExponentialLR", "CosineAnnealingLR",
           "LambdaLR", "OneCycleLR", "ReduceLROnPlateau", "LinearLR", "ConstantLR",
           "PolynomialLR", "CosineAnnealingWarmRestarts", "CyclicLR", "SequentialLR",
           "ChainedScheduler", "MultiplicativeLR"]

_LRScheduler = LRScheduler  # the older name, still used by schedulers written for torch < 2.0
