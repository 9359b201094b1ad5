"""The option records of ``FullyShardedDataParallel`` (FSDP1): strategies, precision, offload,
prefetch and the state-dict settings, with torch's names, fields and defaults."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, auto
from typing import Any, NamedTuple, Optional, Sequence

__all__ = ["BackwardPrefetch", "CPUOffload", "FullOptimStateDictConfig", "FullStateDictConfig",
           "LocalOptimStateDictConfig", "LocalStateDictConfig", "MixedPrecision",
           "OptimStateDictConfig", "ShardedOptimStateDictConfig", "ShardedStateDictConfig",
           "ShardingStrategy", "StateDictConfig", "StateDictSettings", "StateDictType"]


class ShardingStrategy(Enum):
    """What is sharded across the ranks.

    * ``FULL_SHARD``: parameters, gradients and optimizer state; parameters are gathered
      before forward, freed after it, gathered again for backward.
    * ``SHARD_GRAD_OP``: the same, but the gathered parameters stay until backward ends.
    * ``NO_SHARD``: nothing; gradients are all-reduced, as DDP does.
    * ``HYBRID_SHARD``: ``FULL_SHARD`` within each row of a 2-D mesh, replicas across rows.
    * ``_HYBRID_SHARD_ZERO2``: ``SHARD_GRAD_OP`` within each row, replicas across rows.
    """

    FULL_SHARD = auto()
    SHARD_GRAD_OP = auto()
    NO_SHARD = auto()
    HYBRID_SHARD = auto()
    _HYBRID_SHARD_ZERO2 = auto()


class BackwardPrefetch(Enum):
    """When backward starts gathering the unit that runs before this one: when this unit's
    backward starts (``BACKWARD_PRE``) or once its gradients are ready (``BACKWARD_POST``)."""

    BACKWARD_PRE = auto()
    BACKWARD_POST = auto()


class StateDictType(Enum):
    """What ``state_dict()`` gives: whole tensors, DTensor shards, or each rank's pieces."""

    FULL_STATE_DICT = auto()
    LOCAL_STATE_DICT = auto()
    SHARDED_STATE_DICT = auto()


@dataclass
class MixedPrecision:
    """The dtypes an FSDP unit computes, reduces and keeps its buffers in.

    Args:
        param_dtype: dtype the parameters are gathered in and computed with (``None``: their
            own). The shards, their gradients and the optimizer keep the parameters' dtype.
        reduce_dtype: dtype of the gradient reduction (``None``: ``param_dtype``).
        buffer_dtype: dtype the floating buffers are kept in (``None``: their own); state
            dicts give them in their original dtype.
        keep_low_precision_grads: only ``False`` (gradients come back in the parameters'
            dtype).
        cast_forward_inputs: every unit casts its floating inputs to ``param_dtype``.
        cast_root_forward_inputs: the root unit casts its floating inputs to ``param_dtype``.
        _module_classes_to_ignore: modules of these classes are computed in full precision:
            with an auto-wrap policy each becomes a unit of its own, without mixed precision.

    Example:
        >>> mp = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        >>> model = FSDP(model, mixed_precision=mp)   # doctest: +SKIP
    """

    param_dtype: Optional[Any] = None
    reduce_dtype: Optional[Any] = None
    buffer_dtype: Optional[Any] = None
    keep_low_precision_grads: bool = False
    cast_forward_inputs: bool = False
    cast_root_forward_inputs: bool = True
    _module_classes_to_ignore: Optional[Sequence[type]] = None


@dataclass
class CPUOffload:
    """``offload_params=True``: the shards and their gradients (so the optimizer state) live
    in host memory; each gather copies them to the device. Parameters already in host memory
    (NumPy) stay where they are: that is the option's outcome there."""

    offload_params: bool = False


@dataclass
class StateDictConfig:
    """``offload_to_cpu``: the state dict's tensors are moved to host memory."""

    offload_to_cpu: bool = False


@dataclass
class FullStateDictConfig(StateDictConfig):
    """Whole tensors; ``rank0_only``: rank 0 gets them, the other ranks an empty dict."""

    rank0_only: bool = False


@dataclass
class LocalStateDictConfig(StateDictConfig):
    """Each rank's own pieces, under the parameters' names."""


@dataclass
class ShardedStateDictConfig(StateDictConfig):
    """DTensor shards (``_use_dtensor`` is accepted; the shards are always DTensors here)."""

    _use_dtensor: bool = False


@dataclass
class OptimStateDictConfig:
    """``offload_to_cpu``: the optimizer state dict's tensors are moved to host memory."""

    offload_to_cpu: bool = True


@dataclass
class FullOptimStateDictConfig(OptimStateDictConfig):
    """Whole state tensors; ``rank0_only``: the other ranks get an empty dict."""

    rank0_only: bool = False


@dataclass
class LocalOptimStateDictConfig(OptimStateDictConfig):
    """Each rank's pieces of the state tensors."""

    offload_to_cpu: bool = False


@dataclass
class ShardedOptimStateDictConfig(OptimStateDictConfig):
    """DTensor state tensors (``_use_dtensor`` is accepted; they are always DTensors)."""

    _use_dtensor: bool = False


class StateDictSettings(NamedTuple):
    """A module's state-dict type and configs, as ``get_state_dict_type`` returns them."""

    state_dict_type: StateDictType
    state_dict_config: StateDictConfig
    optim_state_dict_config: OptimStateDictConfig


_CONFIGS = {
    StateDictType.FULL_STATE_DICT: (FullStateDictConfig, FullOptimStateDictConfig),
    StateDictType.LOCAL_STATE_DICT: (LocalStateDictConfig, LocalOptimStateDictConfig),
    StateDictType.SHARDED_STATE_DICT: (ShardedStateDictConfig, ShardedOptimStateDictConfig),
}


def settings_for(state_dict_type: Any, config: Any = None,
                 optim_config: Any = None) -> StateDictSettings:
    """The settings of ``state_dict_type`` with the configs checked (defaults where None).

    Raises:
        ValueError: not a ``StateDictType``.
        TypeError: a config of another type's class.
    """
    if not isinstance(state_dict_type, StateDictType):
        raise ValueError(f"state_dict_type must be a StateDictType (FULL_STATE_DICT, "
                         f"SHARDED_STATE_DICT or LOCAL_STATE_DICT), got {state_dict_type!r}")
    model_cls, optim_cls = _CONFIGS[state_dict_type]
    config = model_cls() if config is None else config
    optim_config = optim_cls() if optim_config is None else optim_config
    for got, want, what in ((config, model_cls, ""), (optim_config, optim_cls, " optimizer")):
        if not isinstance(got, want):
            raise TypeError(f"{state_dict_type.name} takes a{what} {want.__name__}, got "
                            f"{type(got).__name__}")
    return StateDictSettings(state_dict_type, config, optim_config)
