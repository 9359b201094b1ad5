"""A hook that communicates nothing (to measure DDP's cost without its all-reduces)."""

from __future__ import annotations

from typing import Any

from ..._grad_bucket import GradBucket
from ..._work_future import WorkFuture, completed_future

__all__ = ["noop_hook"]


def noop_hook(_: Any, bucket: GradBucket) -> WorkFuture:
    """Return the bucket unchanged: every rank keeps its own gradients (replicas diverge;
    for performance experiments only)."""
    return completed_future(bucket.buffer())
