"""``torch.nn.modules.batchnorm``: batch normalisation (``BatchNorm1d/2d/3d``, their lazy forms)
and ``SyncBatchNorm``, whose statistics cover every rank of a process group; ``_NormBase``
holds what batch and instance norm share (affine parameters, running statistics).

Example:
    >>> import mpitensor as mt
    >>> import mpitensor.nn as nn
    >>> bn = nn.BatchNorm2d(3)
    >>> list(bn.state_dict())
    ['weight', 'bias', 'running_mean', 'running_var', 'num_batches_tracked']
    >>> bn(mt.randn(4, 3, 5, 5)).shape
    mpitensor.Size([4, 3, 5, 5])
"""

from __future__ import annotations

import copy
import numbers
from typing import Any, Optional

import mpitensor.distributed as dist
from mpitensor import dtypes as _dt
from mpitensor.autograd import no_grad
from mpitensor.distributed import ProcessGroup
from mpitensor.tensor import Tensor, ones, zeros

from .. import functional as F  # noqa: N812 - torch's spelling
from .._functional.sync_batchnorm import sync_batch_norm
from ._common import _affine_params, _check_eps, _factory, _positive_int, _reset_affine
from .lazy import _lazy_norm
from .module import Module

__all__ = ["BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "SyncBatchNorm", "LazyBatchNorm1d",
           "LazyBatchNorm2d", "LazyBatchNorm3d"]


class _NormBase(Module):
    """Shared body of the batch- and instance-norm layers: the affine parameters, the running
    statistics and their resets; subclasses say which input ranks they take."""

    _ranks: tuple = ()

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: Optional[float] = 0.1,
                 affine: bool = True, track_running_stats: bool = True, device: Any = None,
                 dtype: Any = None, *, bias: bool = True) -> None:
        super().__init__()
        cls = type(self).__name__
        self.num_features = _positive_int(num_features, cls, "num_features")
        self.eps = _check_eps(cls, eps)
        if momentum is not None and (isinstance(momentum, bool)
                                     or not isinstance(momentum, numbers.Real)):
            raise ValueError(f"{cls}: momentum must be a number or None (a cumulative "
                             f"average), got {momentum!r}")
        self.momentum = momentum
        self.affine = bool(affine)
        self.track_running_stats = bool(track_running_stats)
        dt = _factory(dtype, cls)
        _affine_params(self, (self.num_features,), self.affine, self.affine and bool(bias), dt,
                       device)
        if self.track_running_stats:
            self.register_buffer("running_mean", zeros(self.num_features, dtype=dt,
                                                       device=device))
            self.register_buffer("running_var", ones(self.num_features, dtype=dt,
                                                     device=device))
            self.register_buffer("num_batches_tracked", zeros((), dtype=_dt.int64,
                                                              device=device))
        else:
            self.register_buffer("running_mean", None)
            self.register_buffer("running_var", None)
            self.register_buffer("num_batches_tracked", None)
        self.reset_parameters()

    def reset_running_stats(self) -> None:
        """Set the running mean to 0, the running variance to 1 and the batch count to 0."""
        if self.track_running_stats:
            with no_grad():
                self.running_mean.zero_()
                self.running_var.fill_(1)
                self.num_batches_tracked.zero_()

    def reset_parameters(self) -> None:
        """Reset the running statistics, and the affine parameters to weight 1, bias 0."""
        self.reset_running_stats()
        _reset_affine(self)

    def _check_input_dim(self, input: Tensor) -> None:  # noqa: A002 - torch's name
        if input.ndim not in self._ranks:
            want = " or ".join(f"{r}D" for r in self._ranks)
            raise ValueError(f"{type(self).__name__}: expected a {want} input, got a "
                             f"{input.ndim}D input of shape {tuple(input.shape)}")

    def extra_repr(self) -> str:
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, "
                f"affine={self.affine}, bias={self.bias is not None}, "
                f"track_running_stats={self.track_running_stats}")


def _ranked(base: type, name: str, ranks: tuple, what: str, shape: tuple) -> type:
    """The layer ``name`` of the family ``base`` for inputs of ``ranks`` dimensions; its
    docstring is ``what`` and an example normalising a ``shape`` input of 3 channels."""
    doc = (f"{what}\n\n    Example:\n        >>> import mpitensor as mt\n"
           f"        >>> {name}(3)(mt.randn{shape}).shape\n        mpitensor.Size({list(shape)})\n"
           f"    ")
    return type(name, (base,), {"__doc__": doc, "__module__": base.__module__, "_ranks": ranks})


class _BatchNorm(_NormBase):
    """Shared body of the batch-norm layers."""

    def _momentum_factor(self) -> float:
        """Count a training batch; return the weight of its statistics in the running ones."""
        factor = 0.0 if self.momentum is None else float(self.momentum)
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked._data += 1
            if self.momentum is None:  # a cumulative average of every batch so far
                factor = 1.0 / float(self.num_batches_tracked._data)
        return factor

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002 - torch's name
        self._check_input_dim(input)
        return self._local(input, self._momentum_factor())

    def _local(self, input: Tensor, factor: float) -> Tensor:  # noqa: A002 - torch's name
        """Batch norm with this rank's own batch statistics (or the running ones)."""
        # Batch statistics while training, and also in eval mode when none are tracked;
        # the running buffers are updated only while training.
        use_batch = self.training or (self.running_mean is None and self.running_var is None)
        track = not self.training or self.track_running_stats
        return F.batch_norm(input, self.running_mean if track else None,
                            self.running_var if track else None, self.weight, self.bias,
                            use_batch, factor, self.eps)


class BatchNorm1d(_BatchNorm):
    """Batch normalisation of (N, C) or (N, C, L) inputs, per channel, as ``torch.nn``'s.

    In training mode each channel is normalised by the batch's mean and (biased) variance,
    and the running statistics are updated with the unbiased variance:
    ``running = (1 - momentum) * running + momentum * batch`` (``momentum=None``: the
    cumulative average of all batches seen). In evaluation mode the running statistics are
    used (the batch's, when ``track_running_stats=False``).

    Args:
        num_features: the channel count C (> 0).
        eps: added to the variance for stability.
        momentum: the weight of each batch in the running update, or None.
        affine: learn a per-channel ``weight`` (init 1) and ``bias`` (init 0).
        track_running_stats: keep running statistics (buffers) for evaluation.
        device, dtype: where and in which float dtype to create parameters and buffers.
        bias: with ``affine``, whether to learn the bias too (keyword only).

    Raises:
        ValueError: a bad num_features, eps or momentum; in forward, an input of the wrong
            rank, or one value per channel in training.

    Example:
        >>> import mpitensor as mt
        >>> BatchNorm1d(4)(mt.randn(8, 4)).shape
        mpitensor.Size([8, 4])
    """

    _ranks = (2, 3)


BatchNorm2d = _ranked(_BatchNorm, "BatchNorm2d", (4,), """Batch normalisation of (N, C, H, W)
    inputs, per channel (arguments as :class:`BatchNorm1d`).

    The output keeps the input's memory layout (a conv2d output's batch-innermost one too), so
    a conv -> batch norm -> relu -> conv chain makes no layout copies.""", (2, 3, 4, 4))
BatchNorm3d = _ranked(_BatchNorm, "BatchNorm3d", (5,), """Batch normalisation of (N, C, D, H, W)
    inputs, per channel (arguments as :class:`BatchNorm1d`).""", (2, 3, 2, 4, 4))


class SyncBatchNorm(_BatchNorm):
    """Batch normalisation whose training statistics span the batches of a process group.

    In training mode, each channel of an (N, C, ...) input (2-D or more) is normalised with
    the mean and biased variance of the *global* batch: the concatenation of the batches of
    every rank of ``process_group`` (default: the default group). The forward pass makes one
    all_gather of each rank's per-channel count, mean and sum of squared deviations (combined
    in float64 on every rank alike, so no precision is lost to ``E[x^2] - E[x]^2``); the
    backward pass one all_reduce of the two per-channel sums the input gradient needs. Outputs
    and input gradients then equal those of a :class:`BatchNorm2d` (or 1d) run on the whole
    global batch in one process; ``weight`` and ``bias`` get this rank's share of their
    gradient, which DDP sums over the ranks with every other parameter's. The running
    statistics, updated with the global mean and unbiased variance, are the same on every
    rank. Local batch sizes may differ between ranks, and be 0 on some.

    Every member of the group must call it in the same order (it is a collective, as a
    ``dist.all_reduce`` is). Without communication, it is :class:`BatchNorm2d`:

    - in evaluation mode (running statistics, or the local batch's own statistics when
      ``track_running_stats=False``, as torch);
    - when no default process group is initialised, or the group has one rank;
    - on a rank that is not a member of ``process_group`` (its world size is -1).

    Differences from torch: it runs on the CPU (NumPy arrays; CuPy ones too) where torch's
    asks for GPU inputs; a group that holds one value per channel in all raises ValueError on
    every rank (torch checks only a lone rank); when every rank's batch is empty the
    statistics are left alone; a rank whose arguments are wrong raises before any traffic and
    its peers raise PeerFailedError instead of waiting. ``copy.deepcopy`` shares the process
    group (a handle on the ranks' communicator) instead of failing to copy it. Don't let a
    rank leave early with DDP's ``join()`` while the model holds SyncBatchNorm layers: the
    shadow steps of a joined rank don't run their collectives.

    Args:
        num_features: the channel count C (> 0).
        eps: added to the variance for stability.
        momentum: the weight of each batch in the running update, or None (the cumulative
            average of all batches seen).
        affine: learn a per-channel ``weight`` (init 1) and ``bias`` (init 0).
        track_running_stats: keep running statistics (buffers) for evaluation.
        process_group: the group whose batches are pooled (from ``dist.new_group``), or None
            for the default group at the time of each forward.
        device, dtype: where and in which float dtype to create parameters and buffers.
        bias: with ``affine``, whether to learn the bias too (keyword only).

    Raises:
        ValueError: a bad num_features, eps or momentum; in forward, an input of fewer than 2
            dimensions or with no channel, or one value per channel in all in training.
        TypeError: a ``process_group`` that is not a ProcessGroup (nor None).
        RuntimeError: in forward, an input whose channel count or dtype does not match.

    Example:
        >>> import mpitensor as mt
        >>> import mpitensor.nn as nn
        >>> net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU())
        >>> net = nn.SyncBatchNorm.convert_sync_batchnorm(net)  # then wrap it in DDP
        >>> net[1]
        SyncBatchNorm(8, eps=1e-05, momentum=0.1, affine=True, bias=True, track_running_stats=True)
        >>> net(mt.randn(4, 3, 6, 6)).shape  # no process group: as BatchNorm2d
        mpitensor.Size([4, 8, 4, 4])
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: Optional[float] = 0.1,
                 affine: bool = True, track_running_stats: bool = True,
                 process_group: Optional[ProcessGroup] = None, device: Any = None,
                 dtype: Any = None, *, bias: bool = True) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device,
                         dtype, bias=bias)
        if process_group is not None and not isinstance(process_group, ProcessGroup):
            raise TypeError(f"SyncBatchNorm: process_group must be a process group from "
                            f"mpitensor.distributed.new_group() or None (the default group), "
                            f"got {type(process_group).__name__}")
        self.process_group = process_group

    def _check_input_dim(self, input: Tensor) -> None:  # noqa: A002 - torch's name
        if input.ndim < 2:
            raise ValueError(f"SyncBatchNorm: expected an input of at least 2 dimensions "
                             f"(N, C, ...), got a {input.ndim}D input of shape "
                             f"{tuple(input.shape)}")
        if input.shape[1] == 0:
            raise ValueError(f"SyncBatchNorm: the input has no channel (shape "
                             f"{tuple(input.shape)}); dimension 1 must hold the "
                             f"{self.num_features} channels")

    def _sync_group(self) -> Optional[ProcessGroup]:
        """The group to pool the statistics over now, or None to run as BatchNorm."""
        if not self.training or not dist.is_initialized():
            return None
        group = self.process_group if self.process_group is not None else dist.group.WORLD
        return group if dist.get_world_size(group) > 1 else None

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002 - torch's name
        self._check_input_dim(input)
        factor = self._momentum_factor()
        group = self._sync_group()
        if group is None:
            return self._local(input, factor)
        track = self.track_running_stats
        return sync_batch_norm(input, self.running_mean if track else None,
                               self.running_var if track else None, self.weight, self.bias,
                               factor, self.eps, group)

    def __deepcopy__(self, memo: dict) -> SyncBatchNorm:
        group = self.__dict__.get("process_group")
        if group is not None:
            memo[id(group)] = group  # a handle on the ranks' communicator: shared, not copied
        dup = type(self).__new__(type(self))
        memo[id(self)] = dup
        dup.__setstate__(copy.deepcopy(self.__dict__, memo))
        return dup

    @classmethod
    def convert_sync_batchnorm(cls, module: Module,
                               process_group: Optional[ProcessGroup] = None) -> Module:
        """Replace every batch-norm layer in ``module`` (recursively) by a SyncBatchNorm.

        Each new layer takes over the old one's parameters and buffers (the same tensor
        objects, so ``requires_grad``, values and an optimiser's references stay), its
        options and its training flag. Other modules are changed in place.

        Args:
            module: a module, or a batch-norm layer itself.
            process_group: the group the new layers pool their statistics over (None: the
                default group).

        Returns:
            ``module`` with its batch-norm layers replaced, or the new SyncBatchNorm when
            ``module`` is a batch-norm layer.

        Example:
            >>> import mpitensor.nn as nn
            >>> net = nn.SyncBatchNorm.convert_sync_batchnorm(
            ...     nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)))
            >>> type(net[1]).__name__
            'SyncBatchNorm'
        """
        out = module
        if isinstance(module, _BatchNorm):
            out = cls(module.num_features, module.eps, module.momentum, module.affine,
                      module.track_running_stats, process_group,
                      bias=module.affine and module.bias is not None)
            for name in ("weight", "bias"):
                out._parameters[name] = module._parameters.get(name)
            for name in ("running_mean", "running_var", "num_batches_tracked"):
                out._buffers[name] = module._buffers.get(name)
            out.training = module.training
        for name, child in list(module._modules.items()):
            if child is not None:
                out._modules[name] = cls.convert_sync_batchnorm(child, process_group)
        return out


LazyBatchNorm1d = _lazy_norm(BatchNorm1d, False, _NormBase)


LazyBatchNorm2d = _lazy_norm(BatchNorm2d, False, _NormBase)


LazyBatchNorm3d = _lazy_norm(BatchNorm3d, False, _NormBase)
