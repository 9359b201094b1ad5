"""Weight and spectral normalisation by forward pre-hooks: ``nn.utils.weight_norm`` /
``remove_weight_norm`` and ``nn.utils.spectral_norm`` / ``remove_spectral_norm``, torch's
(hook-based) forms, with torch's parameter and buffer names.

- ``weight_norm(module, name="weight", dim=0)``: the parameter becomes ``name_g`` (its norm
  over every dimension but ``dim``, kept as size-1 dimensions; ``dim=None``: the whole
  tensor's) and ``name_v`` (its direction); before each forward, ``name = name_v * name_g /
  ||name_v||``, through autograd.
- ``spectral_norm(module, name="weight", n_power_iterations=1, eps=1e-12, dim=None)``: the
  parameter becomes ``name_orig``, with buffers ``name_u`` and ``name_v`` (the singular
  vectors' estimates, drawn at random at first); before each forward in training mode,
  ``n_power_iterations`` steps of power iteration refine them (without gradient), and
  ``name = name_orig / sigma`` with ``sigma = u . (W v)`` (W: ``name_orig`` with ``dim`` first,
  flattened to a matrix; ``dim`` defaults to 1 for transposed convolutions, else 0).

Example:
    >>> import mpitensor as mt
    >>> layer = weight_norm(mt.nn.Linear(3, 2))
    >>> sorted(n for n, _ in layer.named_parameters())
    ['bias', 'weight_g', 'weight_v']
"""

from __future__ import annotations

from typing import Any, Optional

from mpitensor.autograd import no_grad
from mpitensor.tensor import Tensor

from ..parameter import Parameter

__all__ = ["weight_norm", "remove_weight_norm", "spectral_norm", "remove_spectral_norm"]


def _norm_except_dim(v: Tensor, dim: int) -> Tensor:
    if dim == -1:
        return v.norm()
    keep = [d for d in range(v.dim()) if d != dim]
    return v.pow(2).sum(dim=keep, keepdim=True).sqrt() if keep else v.abs()


def _weight_norm_value(module: Any, name: str, dim: int) -> Tensor:
    g, v = getattr(module, name + "_g"), getattr(module, name + "_v")
    return v * (g / _norm_except_dim(v, dim))


def _registry(module: Any, kind: str) -> dict:
    table = module.__dict__.setdefault("_mpitensor_norm_hooks", {})
    return table.setdefault(kind, {})


def weight_norm(module: Any, name: str = "weight", dim: Optional[int] = 0) -> Any:
    """Reparameterise ``module.<name>`` as magnitude ``<name>_g`` and direction ``<name>_v``.

    Raises:
        RuntimeError: ``name`` already has a weight norm on this module.
    """
    hooks = _registry(module, "weight_norm")
    if name in hooks:
        raise RuntimeError(f"weight_norm: {type(module).__name__}.{name} already has a weight "
                           f"norm hook")
    dim = -1 if dim is None else dim
    weight = getattr(module, name)
    if dim < -1:
        dim += weight.dim()
    del module._parameters[name]
    module.register_parameter(name + "_g", Parameter(_norm_except_dim(weight, dim).detach()))
    module.register_parameter(name + "_v", Parameter(weight.detach()))
    setattr(module, name, _weight_norm_value(module, name, dim))

    def hook(mod: Any, args: Any) -> None:
        setattr(mod, name, _weight_norm_value(mod, name, dim))

    hooks[name] = module.register_forward_pre_hook(hook)
    return module


def remove_weight_norm(module: Any, name: str = "weight") -> Any:
    """Put ``module.<name>`` back as one parameter, with its current value.

    Raises:
        ValueError: ``module`` has no weight norm on ``name`` (torch's class for it).
    """
    hooks = _registry(module, "weight_norm")
    if name not in hooks:
        raise ValueError(f"remove_weight_norm: weight_norm of {name!r} not found in "
                         f"{type(module).__name__}")
    handle = hooks.pop(name)
    handle.remove()
    with no_grad():
        value = getattr(module, name).detach()
    delattr(module, name)
    del module._parameters[name + "_g"]
    del module._parameters[name + "_v"]
    module.register_parameter(name, Parameter(value))
    return module


def _as_matrix(weight: Tensor, dim: int) -> Tensor:
    if dim != 0:
        order = [dim] + [d for d in range(weight.dim()) if d != dim]
        weight = weight.permute(*order)
    return weight.reshape(weight.shape[0], -1)


def _normalize(x: Tensor, eps: float) -> Tensor:
    return x / x.norm().clamp(min=eps)


def spectral_norm(module: Any, name: str = "weight", n_power_iterations: int = 1,
                  eps: float = 1e-12, dim: Optional[int] = None) -> Any:
    """Divide ``module.<name>`` by its largest singular value, estimated by power iteration.

    Raises:
        ValueError: ``n_power_iterations`` is not positive.
        RuntimeError: ``name`` already has a spectral norm on this module.
    """
    if n_power_iterations <= 0:
        raise ValueError(f"spectral_norm: n_power_iterations must be positive, got "
                         f"{n_power_iterations}")
    hooks = _registry(module, "spectral_norm")
    if name in hooks:
        raise RuntimeError(f"spectral_norm: {type(module).__name__}.{name} already has a "
                           f"spectral norm hook")
    if dim is None:
        dim = 1 if type(module).__name__.startswith("ConvTranspose") else 0
    weight = getattr(module, name)
    mat = _as_matrix(weight.detach(), dim)
    h, w = mat.shape
    with no_grad():
        u = _normalize(weight.new_empty(h).normal_(0, 1), eps)
        v = _normalize(weight.new_empty(w).normal_(0, 1), eps)
    del module._parameters[name]
    module.register_parameter(name + "_orig", Parameter(weight.detach()))
    setattr(module, name, weight.detach().clone())
    module.register_buffer(name + "_u", u)
    module.register_buffer(name + "_v", v)

    def compute(mod: Any, iterate: bool) -> Tensor:
        orig = getattr(mod, name + "_orig")
        mat = _as_matrix(orig, dim)
        u, v = getattr(mod, name + "_u"), getattr(mod, name + "_v")
        if iterate:
            with no_grad():
                for _ in range(n_power_iterations):
                    v.copy_(_normalize(mat.detach().t().mv(u), eps))
                    u.copy_(_normalize(mat.detach().mv(v), eps))
            u, v = u.clone(), v.clone()  # the buffers may change before backward
        sigma = u.dot(mat.mv(v))
        return orig / sigma

    def hook(mod: Any, args: Any) -> None:
        setattr(mod, name, compute(mod, mod.training))

    hooks[name] = module.register_forward_pre_hook(hook)
    return module


def remove_spectral_norm(module: Any, name: str = "weight") -> Any:
    """Put ``module.<name>`` back as one parameter (the normalised value, as in torch).

    Raises:
        ValueError: ``module`` has no spectral norm on ``name``.
    """
    hooks = _registry(module, "spectral_norm")
    if name not in hooks:
        raise ValueError(f"remove_spectral_norm: spectral_norm of {name!r} not found in "
                         f"{type(module).__name__}")
    hooks.pop(name).remove()
    value = getattr(module, name).detach()
    delattr(module, name)
    del module._parameters[name + "_orig"]
    del module._buffers[name + "_u"]
    del module._buffers[name + "_v"]
    module.register_parameter(name, Parameter(value))
    return module
