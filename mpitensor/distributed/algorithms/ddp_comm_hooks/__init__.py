"""DDP communication hooks (``torch.distributed.algorithms.ddp_comm_hooks``).

Modules: :mod:`.default_hooks` (averaging, float16/bfloat16 compression and wrappers),
:mod:`.powerSGD_hook` (PowerSGD low-rank compression), :mod:`.debugging_hooks` (``noop_hook``).
:class:`DDPCommHookType` names the hooks for :func:`register_ddp_comm_hook`; the quantization
hooks of torch are not provided (their members are absent).
"""

from __future__ import annotations

import enum
from typing import Any

from . import debugging_hooks as debugging
from . import default_hooks as default
from . import powerSGD_hook as powerSGD  # noqa: N812 - torch's name

__all__ = ["DDPCommHookType", "register_ddp_comm_hook"]


class _Registration:
    """How a :class:`DDPCommHookType` member registers its hook (an object, not a function,
    so that it is an enum member on every Python)."""

    def __init__(self, hook: Any, power_sgd_rank: int = 0) -> None:
        self.hook = hook
        self.power_sgd_rank = power_sgd_rank  # 0: the state is used as it is

    def __call__(self, model: Any, state: Any = None, start_powerSGD_iter: int = 1_000  # noqa: N803
                 ) -> None:
        if self.power_sgd_rank:
            state = powerSGD.PowerSGDState(process_group=state,
                                           matrix_approximation_rank=self.power_sgd_rank,
                                           start_powerSGD_iter=start_powerSGD_iter)
        model.register_comm_hook(state, self.hook)

    def __repr__(self) -> str:
        return f"<register {self.hook.__name__}>"


class DDPCommHookType(enum.Enum):
    """The registrable hooks; ``member.value(model=ddp, state=...)`` registers one (what
    :func:`register_ddp_comm_hook` does). PowerSGD members make a :class:`PowerSGDState`
    from ``state`` (the process group) with rank 1 or 2."""

    ALLREDUCE = _Registration(default.allreduce_hook)
    FP16_COMPRESS = _Registration(default.fp16_compress_hook)
    BF16_COMPRESS = _Registration(default.bf16_compress_hook)
    POWER_SGD = _Registration(powerSGD.powerSGD_hook, 1)
    POWER_SGD_RANK2 = _Registration(powerSGD.powerSGD_hook, 2)
    BATCHED_POWER_SGD = _Registration(powerSGD.batched_powerSGD_hook, 1)
    BATCHED_POWER_SGD_RANK2 = _Registration(powerSGD.batched_powerSGD_hook, 2)
    NOOP = _Registration(debugging.noop_hook)


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
