"""``torch.nn.modules.lazy``: :class:`LazyModuleMixin`, the machinery of the lazy layers, whose
input size is read off the first batch they see. The layers themselves live with their
families, as in torch: ``LazyLinear`` in ``linear``, ``LazyConv{1,2,3}d`` and
``LazyConvTranspose{1,2,3}d`` in ``conv`` (made by :func:`_lazy_conv`), ``LazyBatchNorm{1,2,3}d``
in ``batchnorm`` and ``LazyInstanceNorm{1,2,3}d`` in ``instancenorm`` (by :func:`_lazy_norm`).

Until then their parameters (and running statistics) are
:class:`~mpitensor.nn.parameter.UninitializedParameter` placeholders, which refuse to be
computed with. The first forward (or a ``load_state_dict``, which takes the shapes from the
state dict) materialises them; the first forward then turns the module into the plain layer
(``cls_to_become``: ``LazyLinear`` becomes ``Linear``) and runs it.

Example:
    >>> import mpitensor as mt
    >>> import mpitensor.nn as nn
    >>> layer = nn.LazyLinear(3)
    >>> layer(mt.ones(2, 5)).shape
    mpitensor.Size([2, 3])
    >>> layer
    Linear(in_features=5, out_features=3, bias=True)
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

from mpitensor.tensor import Tensor

from ..parameter import UninitializedBuffer, UninitializedParameter, is_lazy
from ._common import _as_array

__all__ = ["LazyModuleMixin"]


class LazyModuleMixin:
    """Mixed in before a layer class: initialises the layer's placeholders from the first
    input (``initialize_parameters(*inputs)``, written by each lazy layer) or from a loaded
    state dict, then becomes ``cls_to_become``.

    Example:
        >>> import mpitensor.nn as nn
        >>> nn.LazyLinear(4).has_uninitialized_params()
        True
    """

    cls_to_become: Optional[type] = None

    def _start_lazy(self) -> None:
        self._initialize_hook = self.register_forward_pre_hook(_infer_parameters)

    def has_uninitialized_params(self) -> bool:
        """Whether any parameter or buffer of this module is still a placeholder."""
        return any(is_lazy(t) for t in (*self._parameters.values(), *self._buffers.values()))

    def initialize_parameters(self, *args: Any, **kwargs: Any) -> None:
        """Materialise the placeholders from the first input (each lazy layer's own)."""
        raise NotImplementedError(f"{type(self).__name__} does not say how to initialise its "
                                  f"parameters from an input")

    def _lazy_load_hook(self, state_dict: Mapping, prefix: str) -> None:
        for table in (self._parameters, self._buffers):
            for name, t in table.items():
                key = prefix + name
                if is_lazy(t) and key in state_dict:
                    t.materialize(tuple(_as_array(state_dict[key], key).shape))
        if not self.has_uninitialized_params():
            self._sizes_from_parameters()

    def _sizes_from_parameters(self) -> None:
        """Set the inferred size attribute from the materialised parameters."""


def _infer_parameters(module: Any, args: tuple) -> None:
    if module.has_uninitialized_params():
        module.initialize_parameters(*args)
        if module.has_uninitialized_params():
            raise RuntimeError(f"{type(module).__name__}: initialize_parameters() left "
                               f"parameters uninitialized")
    module._initialize_hook.remove()
    del module._initialize_hook
    if module.cls_to_become is not None:
        module.__class__ = module.cls_to_become


def _placeholders(module: Any, params: tuple, buffers: tuple) -> None:
    """Replace the named parameters/buffers (those that exist) by placeholders of their
    dtype, device and grad requirement."""
    for name in params:
        p = module._parameters.get(name)
        if p is not None:
            module._parameters[name] = UninitializedParameter(p.requires_grad, p.device, p.dtype)
    for name in buffers:
        b = module._buffers.get(name)
        if b is not None:
            module._buffers[name] = UninitializedBuffer(False, b.device, b.dtype)


class _LazyConvMixin(LazyModuleMixin):
    """The lazy convolutions: ``in_channels`` from the first input's channel dimension."""

    _nd = 0
    _transposed = False

    def _lazy_setup(self) -> None:
        _placeholders(self, ("weight", "bias"), ())
        self.in_channels = 0
        self._start_lazy()

    def reset_parameters(self) -> None:
        if not self.has_uninitialized_params():
            super().reset_parameters()

    def initialize_parameters(self, input: Tensor, *args: Any) -> None:  # noqa: A002
        """Materialise the weight and bias for the input's channel count."""
        nd = self._nd
        if input.ndim not in (nd + 1, nd + 2):
            raise RuntimeError(f"{type(self).__name__}: expected a {nd + 1}-D (unbatched) or "
                               f"{nd + 2}-D (batched) input, got shape {tuple(input.shape)}")
        c = int(input.shape[1] if input.ndim == nd + 2 else input.shape[0])
        if c % self.groups:
            raise ValueError(f"{type(self).__name__}: the input's {c} channels must be "
                             f"divisible by groups ({self.groups})")
        self.in_channels = c
        if self._transposed:
            shape = (c, self.out_channels // self.groups, *self.kernel_size)
        else:
            shape = (self.out_channels, c // self.groups, *self.kernel_size)
        self.weight.materialize(shape)
        if self.bias is not None:
            self.bias.materialize((self.out_channels,))
        self.reset_parameters()

    def _sizes_from_parameters(self) -> None:
        w = self.weight.shape
        self.in_channels = int(w[0] if self._transposed else w[1] * self.groups)


def _lazy_conv(base: type, transposed: bool) -> type:
    nd = base._nd
    if transposed:
        def __init__(self: Any, out_channels: int, kernel_size: Any, stride: Any = 1,
                     padding: Any = 0, output_padding: Any = 0, groups: int = 1,
                     bias: bool = True, dilation: Any = 1, padding_mode: str = "zeros",
                     device: Any = None, dtype: Any = None) -> None:
            base.__init__(self, groups, out_channels, kernel_size, stride, padding,
                          output_padding, groups, bias, dilation, padding_mode, device, dtype)
            self._lazy_setup()
    else:
        def __init__(self: Any, out_channels: int, kernel_size: Any, stride: Any = 1,
                     padding: Any = 0, dilation: Any = 1, groups: int = 1, bias: bool = True,
                     padding_mode: str = "zeros", device: Any = None,
                     dtype: Any = None) -> None:
            base.__init__(self, groups, out_channels, kernel_size, stride, padding, dilation,
                          groups, bias, padding_mode, device, dtype)
            self._lazy_setup()
    name = f"Lazy{base.__name__}"
    doc = (f":class:`~mpitensor.nn.{base.__name__}` whose ``in_channels`` is the channel "
           f"count of the first input ({nd + 2}-D batched or {nd + 1}-D unbatched).")
    return type(name, (_LazyConvMixin, base), {
        "__init__": __init__, "__doc__": doc, "cls_to_become": base, "_nd": nd,
        "_transposed": transposed, "__module__": base.__module__,
        "__qualname__": name})


class _LazyNormMixin(LazyModuleMixin):
    """The lazy batch/instance norms: ``num_features`` from the first input's channels."""

    def __init__(self, eps: float = 1e-5, momentum: Optional[float] = 0.1,
                 affine: bool = True, track_running_stats: bool = True, device: Any = None,
                 dtype: Any = None) -> None:
        self._norm_base.__init__(self, 1, eps, momentum, affine, track_running_stats, device, dtype)
        _placeholders(self, ("weight", "bias"), ("running_mean", "running_var"))
        self.num_features = 0
        self._start_lazy()

    def reset_parameters(self) -> None:
        if not self.has_uninitialized_params():
            super().reset_parameters()

    def initialize_parameters(self, input: Tensor) -> None:  # noqa: A002 - torch's name
        """Materialise the affine parameters and running statistics for the input's
        channels."""
        self._check_input_dim(input)
        unbatched = input.ndim == min(self._ranks) and len(self._ranks) > 1 and \
            isinstance(self, _InstanceLike)
        self.num_features = int(input.shape[0 if unbatched else 1])
        for t in (*self._parameters.values(), *self._buffers.values()):
            if is_lazy(t):
                t.materialize((self.num_features,))
        self.reset_parameters()

    def _sizes_from_parameters(self) -> None:
        for t in (self.weight, self.running_mean):
            if t is not None:
                self.num_features = int(t.shape[0])
                return


class _InstanceLike:
    """Marks the lazy instance norms, whose unbatched inputs have channels first."""

    __slots__ = ()


def _lazy_norm(base: type, instance: bool, norm_base: type) -> type:
    # norm_base: the class whose constructor takes num_features (the layer's own takes it first)
    name = f"Lazy{base.__name__}"
    if instance:
        def __init__(self: Any, eps: float = 1e-5, momentum: Optional[float] = 0.1,
                     affine: bool = True, track_running_stats: bool = True,
                     device: Any = None, dtype: Any = None) -> None:
            _LazyNormMixin.__init__(self, eps, momentum, affine, track_running_stats, device,
                                    dtype)
        bases: tuple = (_LazyNormMixin, _InstanceLike, base)
    else:
        __init__ = _LazyNormMixin.__init__
        bases = (_LazyNormMixin, base)
    doc = (f":class:`~mpitensor.nn.{base.__name__}` whose ``num_features`` is the channel "
           f"count of the first input (``affine`` and ``track_running_stats`` default to "
           f"True, as torch's lazy norms have them).")
    return type(name, bases, {"__init__": __init__, "__doc__": doc, "cls_to_become": base,
                              "_norm_base": norm_base, "__module__": base.__module__,
                              "__qualname__": name})


