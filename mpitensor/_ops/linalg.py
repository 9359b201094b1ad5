"""Linear algebra on tensors: products (``mm``, ``bmm``, ``mv``, ``dot``, ``vdot``, ``inner``,
``outer``, ``addmm`` and its family, ``kron``, ``tensordot``, ``einsum``), triangles and
diagonals (``tril``, ``triu``, ``diag``, ``diagonal``, ``diag_embed``, ``trace``), inverses and
determinants (``inverse``, ``det``, ``logdet``, ``slogdet``, ``matrix_power``, ``solve``), with
their gradients. Norms and distances are in ``mpitensor._ops.norms``.

The products check their operands' dimensions and dtypes as torch does, then run through the
``@`` operator (``mpitensor._ops.operators``), so BLAS computes them and autograd records them;
the ``add*`` forms are compositions of recorded ops. ``einsum`` is one
:class:`~mpitensor.autograd.Function`: each operand's gradient is itself an ``einsum``, with
identity matrices for subscripts repeated in one operand (diagonals) and ones for those summed
over in it alone. ``diagonal`` is a view, as in torch. The ``mpitensor.linalg`` namespace
(``mpitensor/linalg.py``) serves the ``linalg`` names of these functions.

Example:
    >>> import mpitensor as mt
    >>> a = mt.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    >>> mt.einsum("ij,ij->", a, a).backward()
    >>> a.grad
    tensor([[2., 4.],
            [6., 8.]])
"""

from __future__ import annotations

import operator
import string
from collections import namedtuple
from collections.abc import Sequence
from typing import Any, Union

import numpy as np

from mpitensor import autograd as _autograd
from mpitensor import dtypes as _dt
from mpitensor._core import autocast as _autocast
from mpitensor._core.devices import same_device, xp
from mpitensor._core.dims import wrap_dim
from mpitensor._core.half import computes_in_float32
from mpitensor._core.opkit import (
    NO_RECORD,
    assign_result,
    run,
    run_inplace,
    run_view,
    serve,
    tensor_methods,
    wrap,
)
from mpitensor._ops.operators import fit_grad
from mpitensor.autograd import ArrayFunction as Function
from mpitensor.tensor import Tensor

_grad_mode = _autograd._mode
_INT64 = _dt.int64


def _need_dims(t: Tensor, n: Union[int, tuple], what: str, name: str = "input") -> None:
    nd = t._data.ndim
    if nd != n if isinstance(n, int) else nd not in n:
        want = n if isinstance(n, int) else " or ".join(str(v) for v in n)
        raise ValueError(f"{what}: {name} must have {want} dimensions, got {nd}")


def _same_dtype(a: Tensor, b: Tensor, what: str) -> None:
    if a._data.dtype != b._data.dtype:
        raise TypeError(f"{what}: expected both operands to have the same dtype, got "
                        f"{_dt.dt_repr(a._data.dtype)} and {_dt.dt_repr(b._data.dtype)}")


def tensor_arg(v: Any, what: str) -> Tensor:
    if not isinstance(v, Tensor):
        raise TypeError(f"{what} takes tensors, got {type(v).__name__}")
    return v


def _operands(a: Tensor, b: Any, what: str, dims: tuple, name: str) -> Tensor:
    """``b`` as a tensor, after checking the numbers of dimensions (``dims``: a's, b's) and the
    dtypes of a product's two operands (``name``: what the error calls ``b``)."""
    b = tensor_arg(b, what)
    _need_dims(a, dims[0], what, "self")
    _need_dims(b, dims[1], what, name)
    _same_dtype(a, b, what)
    return b


def _scaled(v: Tensor, s: Any) -> Tensor:
    return v if s == 1 else v * s


class _Ignored(Function):
    """``prod`` alone, where ``beta * inp + prod`` has ``beta`` 0: ``inp`` (NaN in it too) is
    ignored, and gets a zero gradient, as in torch."""

    @staticmethod
    def forward(ctx: Any, prod: Any, inp: Any) -> Any:
        ctx.meta = (getattr(inp, "shape", ()), getattr(inp, "dtype", None))
        return prod

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        shape, dtype = ctx.meta
        gi = xp(g).zeros(shape, dtype=dtype) if ctx.needs_input_grad[1] else None
        return g, gi


def _add_scaled(inp: Any, beta: Any, prod: Tensor) -> Tensor:
    """``beta * inp + prod``; with ``beta`` 0 the input is ignored (NaN in it too), as torch."""
    if beta == 0:
        if isinstance(inp, Tensor) and _grad_mode.enabled and (
                inp._requires_grad or prod._requires_grad):
            return _Ignored.apply(prod, inp)
        return prod
    return _scaled(inp, beta) + prod


# --------------------------------------------------------------------------------------------
# einsum


@computes_in_float32  # half operands: float32 products and sums, one rounding (as bmm)
class Einsum(Function):
    """``einsum(eq, *operands)`` for a normalised equation (explicit output, no ellipsis):
    each operand's gradient is the ``einsum`` of the output's gradient with the others."""

    @staticmethod
    def forward(ctx: Any, eq: str, *xs: Any) -> Any:
        m = xp(xs[0])
        xs = same_device_all(xs)
        ins, out = eq.split("->")
        subs = ins.split(",")
        if ctx.needs_input_grad:
            ctx.meta = (subs, out, [(x.shape, x.dtype) for x in xs])
            ctx.save_for_backward(*xs)
        with np.errstate(all="ignore"):
            return m.asarray(m.einsum(eq, *xs, optimize=len(xs) > 2))

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        subs, out, metas = ctx.meta
        xs = ctx.saved_tensors
        need = ctx.needs_input_grad
        m = xp(g)
        sizes: dict = {}
        for s, (shape, _) in zip(subs, metas):
            for c, n in zip(s, shape):
                if sizes.get(c, 1) == 1:
                    sizes[c] = n
        used = set("".join(subs) + out)
        fresh = (c for c in string.ascii_letters if c not in used)
        grads: list = [None]
        for i, s in enumerate(subs):
            if not need[i + 1]:
                grads.append(None)
                continue
            target, extra_subs, extra = [], [], []
            for c in s:
                if c in target:  # a repeated subscript: a diagonal, through an identity
                    f = next(fresh)
                    target.append(f)
                    extra_subs.append(c + f)
                    extra.append(m.eye(sizes[c], dtype=g.dtype))
                else:
                    target.append(c)
            others = [subs[j] for j in range(len(subs)) if j != i]
            seen = set(out + "".join(others) + "".join(extra_subs))
            for c in set(target):
                if c not in seen:  # summed over in this operand alone: broadcast back
                    extra_subs.append(c)
                    extra.append(m.ones(sizes[c], dtype=g.dtype))
                    seen.add(c)
            eq = ",".join([out, *others, *extra_subs]) + "->" + "".join(target)
            # complex operands: the conjugates (gradients are conjugate Wirtinger derivatives)
            arrays = [g, *(xs[j].conj() if xs[j].dtype.kind == "c" else xs[j]
                           for j in range(len(xs)) if j != i), *extra]
            gi = m.einsum(eq, *arrays, optimize=len(arrays) > 2)
            shape, dtype = metas[i]
            if gi.shape != shape:  # size-1 dimensions broadcast in the forward
                gi = gi.sum(axis=tuple(d for d, n in enumerate(shape) if n == 1 and
                                       gi.shape[d] != 1), keepdims=True)
            if gi.dtype.kind == "c" and np.dtype(dtype).kind != "c":
                gi = gi.real  # a real operand's gradient: the real part
            grads.append(gi.astype(dtype, copy=False))
        return tuple(grads)


def same_device_all(xs: Sequence[Any]) -> tuple:
    """``xs`` checked to share one device (CPU zero-dim arrays may join GPU ones)."""
    if len(xs) < 2:
        return tuple(xs)
    first = xs[0]
    return (first, *(same_device(first, x)[1] for x in xs[1:]))


def _normalise_einsum(eq: str, shapes: list) -> str:
    """``eq`` with the ellipsis replaced by letters and the output made explicit.

    Raises:
        ValueError: the equation does not fit the operands.
    """
    eq = eq.replace(" ", "")
    ins, arrow, out = eq.partition("->")
    subs = ins.split(",")
    if len(subs) != len(shapes):
        raise ValueError(f"einsum(): the equation names {len(subs)} operands, "
                         f"{len(shapes)} were given")
    letters = set(c for c in eq if c.isalpha())
    spare = [c for c in string.ascii_letters if c not in letters]
    n_ell = 0
    for s, shape in zip(subs, shapes):
        named = len(s.replace("...", ""))
        if "..." in s:
            n_ell = max(n_ell, len(shape) - named)
        elif named != len(shape):
            raise ValueError(f"einsum(): subscripts {s!r} name {named} dimensions of an "
                             f"operand with {len(shape)}")
    ell = "".join(spare[:n_ell])
    new_subs = []
    for s, shape in zip(subs, shapes):
        if "..." in s:
            k = len(shape) - len(s.replace("...", ""))
            s = s.replace("...", ell[n_ell - k:] if k else "")
        new_subs.append(s)
    if arrow:
        out = out.replace("...", ell)
    else:
        counts: dict = {}
        for c in "".join(new_subs):
            counts[c] = counts.get(c, 0) + 1
        out = ell + "".join(sorted(c for c, k in counts.items() if k == 1 and c not in ell))
    for c in out:
        if c not in "".join(new_subs):
            raise ValueError(f"einsum(): output subscript {c!r} appears in no operand")
    return ",".join(new_subs) + "->" + out


def _contracts(equation: str, n: int) -> bool:
    """Whether an einsum sums an index shared by two operands (torch then computes it with
    bmm, which CPU autocast casts; without one it multiplies or reduces, which it does not)."""
    terms = equation.replace(" ", "").replace("...", "").split("->")
    ins = terms[0].split(",")[:n]
    letters = "".join(ins)
    out = terms[1] if len(terms) > 1 else "".join(c for c in set(letters)
                                                      if letters.count(c) == 1)
    return any(sum(c in t for t in ins) > 1 for c in set(letters) - set(out))


def einsum(equation: str, *operands: Any) -> Tensor:
    """Sum products of the operands' elements as the equation says (``numpy.einsum``).

    Args:
        equation: subscripts such as ``"ij,jk->ik"``; ``...`` stands for the remaining
            dimensions; without ``->`` the output is the subscripts appearing once, sorted.
        operands: tensors (or one list of them).

    Raises:
        ValueError: the equation does not fit the operands.

    Example:
        >>> import mpitensor as mt
        >>> mt.einsum("i,i->", mt.tensor([1.0, 2.0]), mt.tensor([3.0, 4.0]))
        tensor(11.)
    """
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    if _autocast.ON and _autocast.active() and isinstance(equation, str):
        kind = "einsum" if _contracts(equation, len(operands)) else "einsum_no_contraction"
        return _autocast.run(kind, einsum, equation, *operands)
    ts = [tensor_arg(t, "einsum()") for t in operands]
    eq = _normalise_einsum(equation, [t._data.shape for t in ts])
    if _grad_mode.enabled and any(t._requires_grad for t in ts):
        return Einsum.apply(eq, *ts)
    return wrap(Einsum.forward(NO_RECORD, eq, *(t._data for t in ts)))


def _full_contraction(a: Any, b: Any, dims: Any) -> bool:
    """Whether ``tensordot(a, b, dims)`` contracts every dimension of both (a 0-dim result:
    torch computes that as a dot product, which CPU autocast does not cast)."""
    na, nb = getattr(a, "ndim", -1), getattr(b, "ndim", -1)
    if isinstance(dims, (int, np.integer)):
        return int(dims) == na == nb
    try:
        return len(dims[0]) == na and len(dims[1]) == nb
    except TypeError:
        return False


def tensordot(a: Tensor, b: Tensor, dims: Any = 2) -> Tensor:
    """Contract ``a``'s and ``b``'s dimensions listed in ``dims``: an int ``n`` pairs ``a``'s
    last ``n`` with ``b``'s first ``n``; a pair of lists names them.

    Example:
        >>> import mpitensor as mt
        >>> mt.tensordot(mt.ones(2, 3), mt.ones(3, 4), dims=1).shape
        mpitensor.Size([2, 4])
    """
    if _autocast.ON and _autocast.active():
        kind = "tensordot_full" if _full_contraction(a, b, dims) else "tensordot"
        return _autocast.run(kind, tensordot, a, b, dims)
    a, b = tensor_arg(a, "tensordot()"), tensor_arg(b, "tensordot()")
    na, nb = a._data.ndim, b._data.ndim
    if isinstance(dims, Tensor):
        dims = dims.tolist()
    if isinstance(dims, (int, np.integer)):
        n = int(dims)
        if n < 0 or n > min(na, nb):
            raise ValueError(f"tensordot(): dims={n} does not fit tensors of {na} and {nb} "
                             f"dimensions")
        da, db = list(range(na - n, na)), list(range(n))
    else:
        da, db = dims
        da = [da] if isinstance(da, int) else list(da)
        db = [db] if isinstance(db, int) else list(db)
    da = [wrap_dim(d, na) for d in da]
    db = [wrap_dim(d, nb) for d in db]
    if len(da) != len(db):
        raise ValueError("tensordot(): both operands need the same number of contracted dims")
    letters = iter(string.ascii_letters)
    sa = [next(letters) for _ in range(na)]
    sb = [next(letters) for _ in range(nb)]
    for i, j in zip(da, db):
        if a._data.shape[i] != b._data.shape[j]:
            raise ValueError(f"tensordot(): contracted dimensions {i} and {j} have sizes "
                             f"{a._data.shape[i]} and {b._data.shape[j]}")
        sb[j] = sa[i]
    out = [c for i, c in enumerate(sa) if i not in da] + [
        c for j, c in enumerate(sb) if j not in db]
    return einsum(f"{''.join(sa)},{''.join(sb)}->{''.join(out)}", a, b)


# --------------------------------------------------------------------------------------------
# Triangles and diagonals


class Tri(Function):
    """``tril``/``triu`` (``lower``) of the last two dimensions: the gradient is cut alike."""

    @staticmethod
    def forward(ctx: Any, x: Any, k: int, lower: bool) -> Any:
        if x.ndim < 2:
            raise ValueError(f"{'tril' if lower else 'triu'}(): the input must have at least "
                             f"2 dimensions, got {x.ndim}")
        ctx.meta = (k, lower)
        m = xp(x)
        return m.tril(x, k) if lower else m.triu(x, k)

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        k, lower = ctx.meta
        m = xp(g)
        return (m.tril(g, k) if lower else m.triu(g, k)), None, None


def _writable_diagonal(x: Any, offset: int, d1: int, d2: int) -> Any:
    d = x.diagonal(offset, d1, d2)
    if isinstance(d, np.ndarray) and not d.flags.writeable and x.flags.writeable:
        d.flags.writeable = True  # a view into x, as torch's diagonal is
    return d


class Diagonal(Function):
    """``diagonal(x, offset, dim1, dim2)``: a view of the diagonal, moved to the last
    dimension; the gradient goes back onto the diagonal of zeros."""

    @staticmethod
    def forward(ctx: Any, x: Any, offset: int, d1: int, d2: int) -> Any:
        ctx.meta = (x.shape, x.dtype, offset, d1, d2)
        return _writable_diagonal(x, offset, d1, d2)

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        shape, dtype, offset, d1, d2 = ctx.meta
        gx = xp(g).zeros(shape, dtype=dtype)
        _writable_diagonal(gx, offset, d1, d2)[...] = g
        return gx, None, None, None


class DiagEmbed(Function):
    """``diag_embed(x, offset, dim1, dim2)``: the last dimension of ``x`` put on the
    diagonal of a new pair of dimensions ``dim1``, ``dim2``."""

    @staticmethod
    def forward(ctx: Any, x: Any, offset: int, d1: int, d2: int) -> Any:
        m = xp(x)
        n = x.shape[-1] + abs(offset) if x.ndim else 1 + abs(offset)
        nd = x.ndim + 1
        rest = [d for d in range(nd) if d not in (d1, d2)]
        shape = [0] * nd
        for d, s in zip(rest, x.shape[:-1]):
            shape[d] = s
        shape[d1] = shape[d2] = n
        out = m.zeros(tuple(shape), dtype=x.dtype)
        _writable_diagonal(out, offset, d1, d2)[...] = x
        ctx.meta = (offset, d1, d2)
        return out

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        offset, d1, d2 = ctx.meta
        return g.diagonal(offset, d1, d2).copy(), None, None, None


class Diag(Function):
    """``diag(x, k)``: a vector put on diagonal ``k`` of a square matrix, or diagonal ``k``
    of a matrix taken out as a vector (a copy)."""

    @staticmethod
    def forward(ctx: Any, x: Any, k: int) -> Any:
        if x.ndim not in (1, 2):
            raise ValueError(f"diag(): the input must be a vector or a matrix, got {x.ndim} "
                             f"dimensions")
        ctx.meta = (x.shape, x.dtype, k)
        return xp(x).diag(x, k)

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        shape, dtype, k = ctx.meta
        m = xp(g)
        if len(shape) == 1:
            return m.diagonal(g, k).copy(), None
        gx = m.zeros(shape, dtype=dtype)
        _writable_diagonal(gx, k, 0, 1)[...] = g
        return gx, None


# --------------------------------------------------------------------------------------------
# Inverses and determinants


def _mT(a: Any) -> Any:  # noqa: N802
    return a.swapaxes(-1, -2)


def _mH(a: Any) -> Any:  # noqa: N802 - the conjugate transpose: complex gradients need it
    return _mT(a).conj() if a.dtype.kind == "c" else _mT(a)


def _square(t: Tensor, what: str) -> Any:
    x = t._data
    if x.ndim < 2 or x.shape[-1] != x.shape[-2]:
        raise ValueError(f"{what}: expected a square matrix or a batch of them, got shape "
                         f"{list(x.shape)}")
    if _dt.kind_of(x.dtype) not in "fc":
        raise TypeError(f"{what}: expected a floating point or complex tensor, got "
                        f"{_dt.dt_repr(x.dtype)}")
    return x


@computes_in_float32
class Inverse(Function):
    """``inverse(A)``: d inv = -inv^T g inv^T."""

    @staticmethod
    def forward(ctx: Any, a: Any) -> Any:
        out = xp(a).linalg.inv(a)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        (inv,) = ctx.saved_tensors
        return (-(_mH(inv) @ g @ _mH(inv)),)


def _adjugate_t(m: Any, a: Any) -> Any:
    """The transposed adjugate ``det(A) inv(A)^T`` of a batch of square matrices, valid for
    singular ones too (through the SVD: adj(A) = det(U V^H) V adj(S) U^H)."""
    u, s, vh = m.linalg.svd(a)
    n = s.shape[-1]
    prod_others = m.stack([m.prod(m.delete(s, i, axis=-1), axis=-1) for i in range(n)], -1) \
        if m is np else m.stack([m.prod(m.concatenate([s[..., :i], s[..., i + 1:]], -1), -1)
                                 for i in range(n)], -1)
    sign = m.linalg.det(u) * m.linalg.det(vh)
    adj = _mH(vh) @ (prod_others[..., :, None] * _mH(u))
    return _mT(adj * sign[..., None, None])


@computes_in_float32
class Det(Function):
    """``det(A)``: d/dA = g adj(A)^T (``g det inv^T`` where ``A`` is invertible)."""

    @staticmethod
    def forward(ctx: Any, a: Any) -> Any:
        out = xp(a).asarray(xp(a).linalg.det(a))
        ctx.save_for_backward(a, out)
        return out

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        a, det = ctx.saved_tensors
        m = xp(g)
        adj = _adjugate_t(m, a)
        return (g[..., None, None] * (adj.conj() if adj.dtype.kind == "c" else adj),)


@computes_in_float32
class LogAbsDet(Function):
    """``log|det(A)|`` (``slogdet``'s second result; with ``signed`` True, ``logdet``, NaN for
    a negative determinant): d/dA = inv(A)^T."""

    @staticmethod
    def forward(ctx: Any, a: Any, signed: bool) -> Any:
        m = xp(a)
        sign, logabs = m.linalg.slogdet(a)
        ctx.save_for_backward(a)
        if signed:
            logabs = m.where(sign < 0, m.nan, logabs)
        return m.asarray(logabs)

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        (a,) = ctx.saved_tensors
        m = xp(g)
        with np.errstate(all="ignore"):
            return g[..., None, None] * _mH(m.linalg.pinv(a)), None


class Solve(Function):
    """``solve(A, B)``: X = A^-1 B; dB = A^-T g, dA = -dB X^T."""

    @staticmethod
    def forward(ctx: Any, a: Any, b: Any, vector: bool) -> Any:
        m = xp(a)
        a, b = same_device(a, b)
        bb = b[..., None] if vector else b
        x = m.linalg.solve(a, bb)
        ctx.meta = (vector, a.shape, a.dtype, b.shape, b.dtype)
        ctx.save_for_backward(a, x)
        return x[..., 0] if vector else x

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        vector, ashape, adtype, bshape, bdtype = ctx.meta
        a, x = ctx.saved_tensors
        m = xp(g)
        g1 = g[..., None] if vector else g
        gb = m.linalg.solve(_mH(a), g1)
        ga = -(gb @ _mH(x))
        need = ctx.needs_input_grad
        return (fit_grad(ga, ashape, adtype) if need[0] else None,
                fit_grad(gb[..., 0] if vector else gb, bshape, bdtype) if need[1] else None,
                None)


_SlogdetResult = namedtuple("slogdet", ["sign", "logabsdet"])
_SlogdetResult.__repr__ = lambda self: (  # type: ignore[method-assign]
    f"mpitensor.return_types.slogdet(\nsign={self.sign!r},\nlogabsdet={self.logabsdet!r})")


# --------------------------------------------------------------------------------------------
# The Tensor methods


@tensor_methods
class _LinalgMethods:
    def mm(self, mat2: Tensor) -> Tensor:
        """Return the matrix product of two 2-D tensors.

        Raises:
            ValueError: an operand is not 2-D, or the inner sizes differ.
            TypeError: the dtypes differ.
        """
        if _autocast.ON and _autocast.active():
            return _autocast.run("mm", Tensor.mm, self, mat2)
        mat2 = _operands(self, mat2, "mm()", (2, 2), "mat2")
        if self._data.shape[1] != mat2._data.shape[0]:
            raise ValueError(f"mm(): shapes {list(self._data.shape)} and "
                             f"{list(mat2._data.shape)} cannot be multiplied")
        return self @ mat2

    def bmm(self, mat2: Tensor) -> Tensor:
        """Return the batched matrix product of two 3-D tensors of one batch size."""
        if _autocast.ON and _autocast.active():
            return _autocast.run("bmm", Tensor.bmm, self, mat2)
        mat2 = _operands(self, mat2, "bmm()", (3, 3), "mat2")
        a, b = self._data.shape, mat2._data.shape
        if a[0] != b[0] or a[2] != b[1]:
            raise ValueError(f"bmm(): shapes {list(a)} and {list(b)} cannot be multiplied")
        return self @ mat2

    @_autocast.op("mv")
    def mv(self, vec: Tensor) -> Tensor:
        """Return the product of a 2-D tensor and a 1-D one."""
        vec = _operands(self, vec, "mv()", (2, 1), "vec")
        if self._data.shape[1] != vec._data.shape[0]:
            raise ValueError(f"mv(): shapes {list(self._data.shape)} and "
                             f"{list(vec._data.shape)} cannot be multiplied")
        return self @ vec

    @_autocast.op("dot")
    def dot(self, other: Tensor) -> Tensor:
        """Return the dot product of two 1-D tensors of one size and dtype."""
        other = _operands(self, other, "dot()", (1, 1), "other")
        if self._data.shape != other._data.shape:
            raise ValueError(f"dot(): the vectors have sizes {self._data.shape[0]} and "
                             f"{other._data.shape[0]}")
        return self @ other

    def vdot(self, other: Tensor) -> Tensor:
        """Return the dot product with ``self`` conjugated (as :meth:`dot` for reals)."""
        a = self.conj() if self.is_complex() else self
        return a.dot(other)

    def inner(self, other: Any) -> Tensor:
        """Return the sum of products over the last dimensions (a product for 0-d ones)."""
        other = tensor_arg(other, "inner()")
        if self._data.ndim == 0 or other._data.ndim == 0:
            return self * other
        return tensordot(self, other, ([-1], [-1]))

    def outer(self, vec2: Tensor) -> Tensor:
        """Return the outer product of two 1-D tensors."""
        vec2 = tensor_arg(vec2, "outer()")
        _need_dims(self, 1, "outer()", "self")
        _need_dims(vec2, 1, "outer()", "vec2")
        return self.unsqueeze(1) * vec2.unsqueeze(0)

    ger = outer

    @_autocast.op("addmm")
    def addmm(self, mat1: Tensor, mat2: Tensor, *, beta: Any = 1, alpha: Any = 1) -> Tensor:
        """Return ``beta * self + alpha * (mat1 @ mat2)`` (self ignored when beta is 0)."""
        return _add_scaled(self, beta, _scaled(mat1.mm(mat2), alpha))

    @_autocast.op("addbmm")
    def addbmm(self, batch1: Tensor, batch2: Tensor, *, beta: Any = 1,
               alpha: Any = 1) -> Tensor:
        """Return ``beta * self + alpha * sum_b(batch1[b] @ batch2[b])``."""
        return _add_scaled(self, beta, _scaled(batch1.bmm(batch2).sum(0), alpha))

    @_autocast.op("baddbmm")
    def baddbmm(self, batch1: Tensor, batch2: Tensor, *, beta: Any = 1,
                alpha: Any = 1) -> Tensor:
        """Return ``beta * self + alpha * bmm(batch1, batch2)``."""
        return _add_scaled(self, beta, _scaled(batch1.bmm(batch2), alpha))

    @_autocast.op("addmv")
    def addmv(self, mat: Tensor, vec: Tensor, *, beta: Any = 1, alpha: Any = 1) -> Tensor:
        """Return ``beta * self + alpha * (mat @ vec)``."""
        return _add_scaled(self, beta, _scaled(mat.mv(vec), alpha))

    @_autocast.op("addr")
    def addr(self, vec1: Tensor, vec2: Tensor, *, beta: Any = 1, alpha: Any = 1) -> Tensor:
        """Return ``beta * self + alpha * outer(vec1, vec2)``."""
        return _add_scaled(self, beta, _scaled(vec1.outer(vec2), alpha))

    def addmm_(self, mat1: Tensor, mat2: Tensor, *, beta: Any = 1, alpha: Any = 1) -> Tensor:
        """:meth:`addmm` in place; returns self."""
        return assign_result(self, self.addmm(mat1, mat2, beta=beta, alpha=alpha), "addmm_()")

    def addbmm_(self, batch1: Tensor, batch2: Tensor, *, beta: Any = 1,
                alpha: Any = 1) -> Tensor:
        """:meth:`addbmm` in place; returns self."""
        return assign_result(self, self.addbmm(batch1, batch2, beta=beta, alpha=alpha),
                             "addbmm_()")

    def baddbmm_(self, batch1: Tensor, batch2: Tensor, *, beta: Any = 1,
                 alpha: Any = 1) -> Tensor:
        """:meth:`baddbmm` in place; returns self."""
        return assign_result(self, self.baddbmm(batch1, batch2, beta=beta, alpha=alpha),
                             "baddbmm_()")

    def addmv_(self, mat: Tensor, vec: Tensor, *, beta: Any = 1, alpha: Any = 1) -> Tensor:
        """:meth:`addmv` in place; returns self."""
        return assign_result(self, self.addmv(mat, vec, beta=beta, alpha=alpha), "addmv_()")

    def addr_(self, vec1: Tensor, vec2: Tensor, *, beta: Any = 1, alpha: Any = 1) -> Tensor:
        """:meth:`addr` in place; returns self."""
        return assign_result(self, self.addr(vec1, vec2, beta=beta, alpha=alpha), "addr_()")

    def kron(self, other: Tensor) -> Tensor:
        """Return the Kronecker product (``numpy.kron``)."""
        other = tensor_arg(other, "kron()")
        if _grad_mode.enabled and (self._requires_grad or other._requires_grad):
            return Kron.apply(self, other)
        return wrap(Kron.forward(NO_RECORD, self._data, other._data))

    @_autocast.op("trace")
    def trace(self) -> Tensor:
        """Return the sum of the main diagonal of a 2-D tensor (integers sum in int64)."""
        _need_dims(self, 2, "trace()", "self")
        return self.diagonal().sum()

    def tril(self, diagonal: int = 0) -> Tensor:
        """Return the lower triangle (below and on ``diagonal``) of the last two dimensions."""
        return run(Tri, self, operator.index(diagonal), True)

    def triu(self, diagonal: int = 0) -> Tensor:
        """Return the upper triangle (above and on ``diagonal``) of the last two dimensions."""
        return run(Tri, self, operator.index(diagonal), False)

    def tril_(self, diagonal: int = 0) -> Tensor:
        """:meth:`tril` in place; returns self."""
        return run_inplace(self, Tri, "tril_()", operator.index(diagonal), True)

    def triu_(self, diagonal: int = 0) -> Tensor:
        """:meth:`triu` in place; returns self."""
        return run_inplace(self, Tri, "triu_()", operator.index(diagonal), False)

    def diag(self, diagonal: int = 0) -> Tensor:
        """Return a square matrix with this vector on ``diagonal``, or this matrix's
        ``diagonal`` as a vector."""
        return run(Diag, self, operator.index(diagonal))

    def diagonal(self, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Tensor:
        """Return a view of the diagonal ``offset`` of dimensions ``dim1`` and ``dim2``,
        as the last dimension.

        Raises:
            ValueError: ``dim1`` and ``dim2`` are the same dimension.
        """
        n = self._data.ndim
        d1, d2 = wrap_dim(dim1, n), wrap_dim(dim2, n)
        if d1 == d2:
            raise ValueError(f"diagonal(): dim1 and dim2 cannot be the same dimension ({d1})")
        return run_view(Diagonal, self, operator.index(offset), d1, d2)

    def diag_embed(self, offset: int = 0, dim1: int = -2, dim2: int = -1) -> Tensor:
        """Return a tensor with one more dimension whose ``dim1``/``dim2`` diagonals hold the
        last dimension of self."""
        n = self._data.ndim + 1
        d1, d2 = wrap_dim(dim1, n), wrap_dim(dim2, n)
        if d1 == d2:
            raise ValueError(f"diag_embed(): dim1 and dim2 cannot be the same dimension ({d1})")
        return run(DiagEmbed, self, operator.index(offset), d1, d2)

    def diagflat(self, offset: int = 0) -> Tensor:
        """Return the square matrix with the flattened self on diagonal ``offset``."""
        return self.reshape(-1).diag(offset)

    @_autocast.op("inverse")
    def inverse(self) -> Tensor:
        """Return the inverse of a square matrix (or of each in a batch).

        Raises:
            ValueError: not square; ``numpy.linalg.LinAlgError`` (a ValueError) for a
                singular matrix.
        """
        _square(self, "inverse()")
        return run(Inverse, self)

    def det(self) -> Tensor:
        """Return the determinant of a square matrix (or of each in a batch)."""
        _square(self, "det()")
        return run(Det, self)

    def logdet(self) -> Tensor:
        """Return ``log(det(self))``: NaN for a negative determinant, -inf for zero."""
        _square(self, "logdet()")
        return run(LogAbsDet, self, True)

    def slogdet(self) -> Any:
        """Return ``(sign, logabsdet)`` of the determinant; ``logabsdet`` is differentiable."""
        x = _square(self, "slogdet()")
        sign = xp(x).linalg.slogdet(x)[0]
        return _SlogdetResult(wrap(xp(x).asarray(sign)), run(LogAbsDet, self, False))

    def matrix_power(self, n: int) -> Tensor:
        """Return the square matrix to the integer power ``n`` (the inverse's for ``n < 0``;
        the identity for 0)."""
        n = operator.index(n)
        x = self._data
        if x.ndim < 2 or x.shape[-1] != x.shape[-2]:
            raise ValueError(f"matrix_power(): expected a square matrix or a batch of them, "
                             f"got shape {list(x.shape)}")
        if n == 0:
            m = xp(x)
            eye = m.broadcast_to(m.eye(x.shape[-1], dtype=x.dtype), x.shape).copy()
            return wrap(eye) if not self._requires_grad else self * 0 + wrap(eye)
        base = self.inverse() if n < 0 else self
        n = abs(n)
        result = None
        while n:  # by squaring: log2(n) products
            if n & 1:
                result = base if result is None else result @ base
            n >>= 1
            if n:
                base = base @ base
        return result

class Kron(Function):
    """``kron(a, b)``: the blocks ``a[i] * b``; each operand's gradient sums the other's
    products over the blocks."""

    @staticmethod
    def forward(ctx: Any, a: Any, b: Any) -> Any:
        a, b = same_device(a, b)
        nd = max(a.ndim, b.ndim)
        ar = a.reshape((1,) * (nd - a.ndim) + a.shape)
        br = b.reshape((1,) * (nd - b.ndim) + b.shape)
        ctx.meta = (a.shape, a.dtype, b.shape, b.dtype, ar.shape, br.shape)
        ctx.save_for_backward(a, b)
        return xp(a).kron(ar, br)

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        sa, da, sb, db, ra, rb = ctx.meta
        a, b = ctx.saved_tensors
        need = ctx.needs_input_grad
        nd = len(ra)
        inter = []
        for p, q in zip(ra, rb):
            inter += [p, q]
        gr = g.reshape(inter)
        a_axes = tuple(range(0, 2 * nd, 2))
        b_axes = tuple(range(1, 2 * nd, 2))
        ga = gb = None
        if need[0]:
            be = b.reshape([v for q in rb for v in (1, q)])
            ga = (gr * be).sum(axis=b_axes).reshape(sa).astype(da, copy=False)
        if need[1]:
            ae = a.reshape([v for p in ra for v in (p, 1)])
            gb = (gr * ae).sum(axis=a_axes).reshape(sb).astype(db, copy=False)
        return ga, gb


@_autocast.op("linalg_solve")
def solve(A: Tensor, B: Tensor, *, left: bool = True) -> Tensor:  # noqa: N803 - torch's names
    """Return ``X`` with ``A @ X = B`` (``left``) or ``X @ A = B``, for square ``A`` (batches
    broadcast); ``B`` may be a vector (``A.shape[:-1]``).

    Raises:
        ValueError: ``A`` is not square, or is singular (``numpy.linalg.LinAlgError``).
    """
    _square(A, "solve()")
    B = tensor_arg(B, "solve()")  # noqa: N806
    if not left:
        return solve(A.mT, B.mT).mT
    a, b = A._data, B._data
    vector = b.ndim == 1 or (b.ndim == a.ndim - 1 and b.shape == a.shape[:-1])
    if _grad_mode.enabled and (A._requires_grad or B._requires_grad):
        return Solve.apply(A, B, vector)
    return wrap(Solve.forward(NO_RECORD, a, b, vector))


serve({"einsum": einsum, "tensordot": tensordot})
