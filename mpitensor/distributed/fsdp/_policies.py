"""The policies ``fully_shard`` takes: mixed precision and where the shards live."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

__all__ = ["MixedPrecisionPolicy", "OffloadPolicy", "CPUOffloadPolicy"]


@dataclass(frozen=True)
class MixedPrecisionPolicy:
    """Dtypes of the gathered parameters, of the gradient reduction and of the outputs.

    Args:
        param_dtype: dtype the parameters are gathered in and computed with (``None``: their
            own). The sharded parameters, their gradients and the optimizer keep their dtype.
        reduce_dtype: dtype the gradients are reduce-scattered in (``None``: ``param_dtype``).
        output_dtype: dtype the module's floating outputs are cast to (``None``: unchanged).
        cast_forward_inputs: cast the module's floating inputs to ``param_dtype``.

    Example:
        >>> mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        >>> fully_shard(model, mp_policy=mp)
    """

    param_dtype: Optional[Any] = None
    reduce_dtype: Optional[Any] = None
    output_dtype: Optional[Any] = None
    cast_forward_inputs: bool = True


@dataclass
class OffloadPolicy:
    """The default: the shards stay on the parameters' device."""


@dataclass
class CPUOffloadPolicy(OffloadPolicy):
    """Keep the sharded parameters, their gradients and so the optimizer state in host memory;
    each gather copies the shard to the device first, and each reduced gradient comes back.

    On CuPy parameters this moves the shards to host memory. On NumPy parameters the data are
    already in host memory, so the policy is accepted and changes nothing: that is its correct
    outcome, not a missing feature.

    Args:
        pin_memory: accepted for torch's signature; host buffers here are ordinary memory.
    """

    pin_memory: bool = True
