"""DDP communication hooks (``torch.distributed.algorithms.ddp_comm_hooks``).

Modules: :mod:`.default_hooks` (averaging, float16/bfloat16 compression and wrappers),
:mod:`.powerSGD_hook` (PowerSGD low-rank compression), :mod:`.debugging_hooks` (``noop_hook``).
:class:`DDPCommHookType` names the hooks for :func:`register_ddp_comm_hook`; the quantization
hooks of torch are not provided (their members are absent).
"""

from __future__ import annotations

import enum
from functools import partial
from typing import Any

from . import debugging_hooks as debugging
from . import default_hooks as default
from . import powerSGD_hook as powerSGD  # noqa: N812 - torch's name

__all__ = ["DDPCommHookType", "register_ddp_comm_hook"]


def _plain(model: Any, state: Any, comm_hook: Any) -> None:
    model.register_comm_hook(state, comm_hook)


def _power_sgd(model: Any, state: Any, comm_hook: Any, matrix_approximation_rank: int,
               start_powerSGD_iter: int = 1_000) -> None:  # noqa: N803 - torch's name
    ps = powerSGD.PowerSGDState(process_group=state,
                                matrix_approximation_rank=matrix_approximation_rank,
                                start_powerSGD_iter=start_powerSGD_iter)
    model.register_comm_hook(ps, comm_hook)


class DDPCommHookType(enum.Enum):
    """The registrable hooks; ``member.value(model=ddp, state=...)`` registers one (what
    :func:`register_ddp_comm_hook` does). PowerSGD members make a :class:`PowerSGDState`
    from ``state`` (the process group) with rank 1 or 2."""

    ALLREDUCE = enum.member(partial(_plain, comm_hook=default.allreduce_hook))
    FP16_COMPRESS = enum.member(partial(_plain, comm_hook=default.fp16_compress_hook))
    BF16_COMPRESS = enum.member(partial(_plain, comm_hook=default.bf16_compress_hook))
    POWER_SGD = enum.member(partial(_power_sgd, comm_hook=powerSGD.powerSGD_hook,
                                    matrix_approximation_rank=1))
    POWER_SGD_RANK2 = enum.member(partial(_power_sgd, comm_hook=powerSGD.powerSGD_hook,
                                          matrix_approximation_rank=2))
    BATCHED_POWER_SGD = enum.member(partial(
        _power_sgd, comm_hook=powerSGD.batched_powerSGD_hook, matrix_approximation_rank=1))
    BATCHED_POWER_SGD_RANK2 = enum.member(partial(
        _power_sgd, comm_hook=powerSGD.batched_powerSGD_hook, matrix_approximation_rank=2))
    NOOP = enum.member(partial(_plain, comm_hook=debugging.noop_hook))


def register_ddp_comm_hook(comm_hook_type: DDPCommHookType, model: Any,
                           state: Any = None) -> None:
    """Register the hook ``comm_hook_type`` names on the DDP ``model``, with ``state``.

    Raises:
        TypeError: ``comm_hook_type`` is not a :class:`DDPCommHookType`.
    """
    if not isinstance(comm_hook_type, DDPCommHookType):
        raise TypeError(f"register_ddp_comm_hook: comm_hook_type must be a DDPCommHookType, "
                        f"got {comm_hook_type!r}")
    comm_hook_type.value(model=model, state=state)
