"""``torch.nn.modules.linear_cross_entropy_options``: the chunking options of
``nn.LinearCrossEntropyLoss`` and ``F.linear_cross_entropy`` (kept with their chunked path in
:mod:`mpitensor.nn._functional.linear_ce`)."""

from __future__ import annotations

from .._functional.linear_ce import LinearCrossEntropyOptions

__all__ = ["LinearCrossEntropyOptions"]
