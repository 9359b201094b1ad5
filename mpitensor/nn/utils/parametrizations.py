"""``nn.utils.parametrizations``: weight norm, spectral norm and orthogonal matrices as
parametrizations (``nn.utils.parametrize``), with torch's state-dict keys.

- ``weight_norm(module, name="weight", dim=0)``: originals ``original0`` (the magnitude g, the
  norm over every dimension but ``dim``) and ``original1`` (the direction v); the weight is
  ``v * g / ||v||``.
- ``spectral_norm(module, name="weight", n_power_iterations=1, eps=1e-12, dim=None)``: the
  weight divided by its largest singular value, estimated by power iteration on the buffers
  ``_u`` and ``_v`` of ``parametrizations.weight.0`` (15 iterations at registration, then
  ``n_power_iterations`` per access in training mode only).
- ``orthogonal(module, name="weight", orthogonal_map=None, use_trivialization=True)``: an
  orthogonal (unitary) weight, ``base @ cayley(A)`` with ``A`` skew from the original's lower
  triangle. Only the Cayley map is available (mpitensor.linalg has no ``matrix_exp`` nor
  ``householder_product``), so ``orthogonal_map=None`` means ``"cayley"`` here and the two
  other maps raise ``NotImplementedError``.

Example:
    >>> import mpitensor as mt
    >>> m = weight_norm(mt.nn.Linear(3, 2))
    >>> sorted(k for k in m.state_dict())
    ['bias', 'parametrizations.weight.original0', 'parametrizations.weight.original1']
"""

from __future__ import annotations

from typing import Optional

from mpitensor._core.devices import xp as _xp
from mpitensor._ops.combine import cat as _cat
from mpitensor._ops.create import eye as _eye
from mpitensor._ops.linalg import solve as _solve
from mpitensor.autograd import no_grad
from mpitensor.tensor import Tensor

from .. import functional as F  # noqa: N812 - torch's spelling
from ..modules.module import Module
from . import parametrize
from .weight_norm import _norm_except_dim

__all__ = ["weight_norm", "spectral_norm", "orthogonal"]


class _WeightNorm(Module):
    def __init__(self, dim: Optional[int] = 0) -> None:
        super().__init__()
        self.dim = -1 if dim is None else dim

    def forward(self, weight_g: Tensor, weight_v: Tensor) -> Tensor:
        return weight_v * (weight_g / _norm_except_dim(weight_v, self.dim))

    def right_inverse(self, weight: Tensor) -> tuple:
        return _norm_except_dim(weight, self.dim), weight


def weight_norm(module: Module, name: str = "weight", dim: Optional[int] = 0) -> Module:
    """Parametrize ``module.<name>`` as magnitude ``original0`` times direction ``original1``.

    Example:
        >>> import mpitensor as mt
        >>> m = weight_norm(mt.nn.Linear(4, 2))
        >>> tuple(m.parametrizations.weight.original0.shape)
        (2, 1)
    """
    weight = getattr(module, name)
    if dim is not None and dim < -1:
        dim += weight.dim()
    parametrize.register_parametrization(module, name, _WeightNorm(dim), unsafe=True)
    return module


def _as_matrix(weight: Tensor, dim: int) -> Tensor:
    if dim != 0:
        weight = weight.permute(dim, *[d for d in range(weight.dim()) if d != dim])
    return weight.reshape(weight.shape[0], -1)


class _SpectralNorm(Module):
    def __init__(self, weight: Tensor, n_power_iterations: int = 1, dim: int = 0,
                 eps: float = 1e-12) -> None:
        super().__init__()
        ndim = weight.dim()
        if not -ndim <= dim < max(ndim, 1):
            raise IndexError(f"spectral_norm: dim {dim} is out of range for a {ndim}-D weight")
        if n_power_iterations <= 0:
            raise ValueError(f"spectral_norm: n_power_iterations must be positive, got "
                             f"{n_power_iterations}")
        self.dim = dim % ndim if ndim else 0
        self.eps = eps
        self.n_power_iterations = n_power_iterations
        if ndim > 1:
            mat = _as_matrix(weight.detach(), self.dim)
            h, w = mat.shape
            u = F.normalize(mat.new_empty(h).normal_(0, 1), dim=0, eps=eps)
            v = F.normalize(mat.new_empty(w).normal_(0, 1), dim=0, eps=eps)
            self.register_buffer("_u", u)
            self.register_buffer("_v", v)
            self._power_method(mat, 15)

    def _power_method(self, mat: Tensor, n: int) -> None:
        """``n`` steps refining the singular vectors in place, u first (no gradient)."""
        with no_grad():
            mat = mat.detach()
            for _ in range(n):
                self._u.copy_(F.normalize(mat.mv(self._v), dim=0, eps=self.eps))
                self._v.copy_(F.normalize(mat.mH.mv(self._u), dim=0, eps=self.eps))

    def forward(self, weight: Tensor) -> Tensor:
        if weight.dim() == 1:
            return F.normalize(weight, dim=0, eps=self.eps)
        mat = _as_matrix(weight, self.dim)
        if self.training:
            self._power_method(mat, self.n_power_iterations)
        u, v = self._u.clone(), self._v.clone()  # the buffers change before backward runs
        sigma = u.conj().dot(mat.mv(v))
        return weight / sigma

    def right_inverse(self, value: Tensor) -> Tensor:
        return value


def spectral_norm(module: Module, name: str = "weight", n_power_iterations: int = 1,
                  eps: float = 1e-12, dim: Optional[int] = None) -> Module:
    """Divide ``module.<name>`` by its spectral norm (largest singular value).

    ``dim`` defaults to 1 for transposed convolutions, else 0.

    Example:
        >>> import mpitensor as mt
        >>> m = spectral_norm(mt.nn.Linear(4, 3))
        >>> sorted(k for k in m.state_dict())[1:]
        ['parametrizations.weight.0._u', 'parametrizations.weight.0._v', \
'parametrizations.weight.original']
    """
    weight = getattr(module, name, None)
    if not isinstance(weight, Tensor):
        raise ValueError(f"module '{type(module).__name__}' has no parameter or buffer "
                         f"named '{name}'")
    if dim is None:
        kind = parametrize.type_before_parametrizations(module).__name__
        dim = 1 if kind.startswith("ConvTranspose") else 0
    parametrize.register_parametrization(
        module, name, _SpectralNorm(weight, n_power_iterations, dim, eps))
    return module


def _make_orthogonal(a: Tensor) -> Tensor:
    """The Q of ``a``'s QR factorisation with R's diagonal made positive (no gradient)."""
    arr = a.detach()._data
    xp = _xp(arr)
    q, r = xp.linalg.qr(arr)
    d = xp.diagonal(r, axis1=-2, axis2=-1)
    mag = xp.abs(d)
    sign = xp.where(mag == 0, 1, d / xp.where(mag == 0, 1, mag))
    return Tensor._wrap(xp.ascontiguousarray((q * sign[..., None, :]).astype(arr.dtype)))


def _is_orthogonal(q: Tensor, eps: Optional[float] = None) -> bool:
    arr = q.detach()._data
    xp = _xp(arr)
    n = arr.shape[-1]
    eps = 10 * n * float(xp.finfo(arr.dtype).eps) if eps is None else eps
    gram = xp.conj(xp.swapaxes(arr, -1, -2)) @ arr
    return bool(xp.allclose(gram, xp.eye(n, dtype=arr.dtype), atol=eps))


class _Orthogonal(Module):
    def __init__(self, weight: Tensor, use_trivialization: bool) -> None:
        super().__init__()
        self.shape = tuple(weight.shape)
        if use_trivialization:
            self.register_buffer("base", None)

    def forward(self, x: Tensor) -> Tensor:
        n, k = x.shape[-2], x.shape[-1]
        transposed = n < k
        if transposed:
            x, n, k = x.mT, k, n
        x = x.tril()
        if n != k:
            x = _cat([x, x.new_zeros(*x.shape[:-1], n - k)], dim=-1)
        a = x - x.mH
        ident = _eye(n, dtype=a.dtype, device=a.device)
        q = _solve(ident - a * 0.5, ident + a * 0.5)
        if n != k:
            q = q[..., :k]
        if getattr(self, "base", None) is not None:
            q = self.base @ q
        return q.mT if transposed else q

    def right_inverse(self, q: Tensor) -> Tensor:
        if tuple(q.shape) != self.shape:
            raise ValueError(f"orthogonal: expected a matrix of shape {list(self.shape)}, got "
                             f"{list(q.shape)}")
        if "base" not in self._buffers:
            raise NotImplementedError("orthogonal: assigning to the Cayley parametrization "
                                      "needs use_trivialization=True")
        q_init = q
        n, k = q.shape[-2], q.shape[-1]
        if n < k:
            q, n, k = q.mT, k, n
        with no_grad():
            if n == k:
                q = q.detach().clone() if _is_orthogonal(q) else _make_orthogonal(q)
            else:  # complete the columns to a square orthogonal matrix
                extra = q.new_empty(*q.shape[:-1], n - k).normal_()
                q = _make_orthogonal(_cat([q.detach(), extra], dim=-1))
            self.base = q
            neg_id = q_init.new_zeros(*q_init.shape)
            neg_id.diagonal(dim1=-2, dim2=-1).fill_(-1.0)
        return neg_id


def orthogonal(module: Module, name: str = "weight", orthogonal_map: Optional[str] = None, *,
               use_trivialization: bool = True) -> Module:
    """Parametrize ``module.<name>`` (a matrix, or a batch of them) as orthogonal.

    Args:
        orthogonal_map: ``"cayley"`` (or None, which means it here).
        use_trivialization: keep a ``base`` buffer so that the original starts at the
            current weight's orthogonal factor and assignment works.

    Raises:
        NotImplementedError: ``"matrix_exp"`` or ``"householder"``.
        ValueError: the tensor has fewer than 2 dimensions, or an unknown map.

    Example:
        >>> import mpitensor as mt
        >>> m = orthogonal(mt.nn.Linear(3, 3))
        >>> bool(((m.weight @ m.weight.T - mt.eye(3)).abs() < 1e-5).all())
        True
    """
    weight = getattr(module, name, None)
    if not isinstance(weight, Tensor) or weight.dim() < 2:
        raise ValueError(f"orthogonal: '{name}' of {type(module).__name__} must be a tensor "
                         f"of at least 2 dimensions")
    if orthogonal_map in ("matrix_exp", "householder"):
        raise NotImplementedError(
            f"orthogonal: orthogonal_map={orthogonal_map!r} needs linalg."
            f"{'matrix_exp' if orthogonal_map == 'matrix_exp' else 'householder_product'}, "
            f"which mpitensor does not have; use orthogonal_map='cayley'")
    if orthogonal_map not in (None, "cayley"):
        raise ValueError(f"orthogonal: orthogonal_map must be 'matrix_exp', 'cayley' or "
                         f"'householder', got {orthogonal_map!r}")
    parametrize.register_parametrization(module, name, _Orthogonal(weight, use_trivialization),
                                         unsafe=True)
    return module
