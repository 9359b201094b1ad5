"""The sparse COO tensor: :class:`SparseTensor` (coordinates ``_idx`` and values ``_vals``),
its kernels, arithmetic, maps and sums, :func:`sparse_coo_tensor`, and ``Tensor.to_sparse``.

The ``_data`` of a sparse tensor is a placeholder (:class:`_SparseData`) that refuses every
array operation, so a dense op reached with a sparse tensor fails at once.
"""

from __future__ import annotations

import operator
from typing import Any, Optional

import numpy as np

from mpitensor import backend as _backend
from mpitensor import dtypes as _dt
from mpitensor._base import determinism as _determinism
from mpitensor._core import promotion as _promotion
from mpitensor._core.devices import move, parse_device
from mpitensor._core.dims import wrap_dim
from mpitensor._core.opkit import tensor_methods, wrap
from mpitensor._ops.cast import to_args
from mpitensor._ops.create import layout, strided
from mpitensor.autograd import ArrayFunction as Function
from mpitensor.tensor import Size, Tensor

__all__ = ["SparseTensor", "sparse_coo", "sparse_coo_tensor", "sparse_csr"]

sparse_coo = layout("sparse_coo")
sparse_csr = layout("sparse_csr")

_USE_DENSE = "call .to_dense() first if a dense result is what you want"


def refusal(what: str) -> NotImplementedError:
    return NotImplementedError(
        f"{what} does not support sparse COO tensors (torch's sparse layout does not run it "
        f"either, or mpitensor does not yet); {_USE_DENSE}")


class SparseData:
    """The ``_data`` of a sparse tensor: it answers the metadata questions (shape, dtype,
    ndim, size) and refuses every array operation, so dense ops fail loudly on sparse input."""

    # tensor: the sparse tensor whose placeholder this is (read by optimisers of sparse grads)
    __slots__ = ("shape", "dtype", "ndim", "size", "itemsize", "tensor")

    def __init__(self, shape: tuple, dtype: np.dtype) -> None:
        self.shape = tuple(shape)
        self.dtype = dtype
        self.ndim = len(shape)
        self.size = int(np.prod(shape, dtype=np.int64))
        self.itemsize = dtype.itemsize

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # protocol probes (copy, pickle, hasattr) see no such thing
            raise AttributeError(name)
        raise refusal(f"this operation (it reads the dense array's {name!r})")

    def __array__(self, *args: Any, **kwargs: Any) -> Any:
        raise refusal("this operation (it needs the dense array)")

    def __array_ufunc__(self, ufunc: Any, method: str, *args: Any, **kwargs: Any) -> Any:
        raise refusal(f"{ufunc.__name__}")

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        raise refusal(f"{func.__name__}")

    def __getitem__(self, key: Any) -> Any:
        raise refusal("indexing")

    def __setitem__(self, key: Any, value: Any) -> None:
        raise refusal("writing into")

    def __len__(self) -> int:
        return self.shape[0]


def _refusing(name: str) -> Any:
    def fn(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise refusal(f"the dense operator {name}")

    return fn


for _op in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "and", "or",
            "xor", "lt", "le", "gt", "ge", "neg", "pos", "abs", "invert", "float", "int",
            "index", "bool"):
    setattr(SparseData, f"__{_op}__", _refusing(_op))
    if _op not in ("lt", "le", "gt", "ge", "neg", "pos", "abs", "invert", "float", "int",
                   "index", "bool"):
        setattr(SparseData, f"__r{_op}__", _refusing(_op))
        setattr(SparseData, f"__i{_op}__", _refusing(_op))


# --------------------------------------------------------------------------------------------
# kernels on raw arrays, with their gradients


def add_at(out: Any, index: Any, src: Any) -> None:
    """``out[index] += src`` with repeated indices adding up (NumPy or CuPy)."""
    if isinstance(out, np.ndarray):
        np.add.at(out, index, src)
    elif not _determinism.add_at(out, index, src):  # atomics unless deterministic
        import cupyx  # noqa: PLC0415 - only for GPU arrays

        cupyx.scatter_add(out, index, src)


class ScatterAdd(Function):
    """A dense array of ``shape`` whose entries at ``index`` (a tuple of index arrays) are the
    sums of the ``src`` rows given for them; the gradient of ``src`` is the gather."""

    @staticmethod
    def forward(ctx: Any, src: Any, index: tuple, shape: tuple) -> Any:
        ctx.index = index
        xp = _backend.array_module(src)
        out = xp.zeros(shape, dtype=src.dtype)
        add_at(out, index, src)
        return out

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        return g[ctx.index], None, None


class Gather(Function):
    """The rows ``x[index]`` of a dense array (``index`` a tuple of index arrays); the gradient
    of ``x`` scatters back, adding where an index repeats."""

    @staticmethod
    def forward(ctx: Any, x: Any, index: tuple) -> Any:
        ctx.index, ctx.shape = index, x.shape
        return x[index]

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        xp = _backend.array_module(g)
        out = xp.zeros(ctx.shape, dtype=g.dtype)
        add_at(out, ctx.index, g)
        return out, None


# --------------------------------------------------------------------------------------------
# the sparse tensor


def is_sparse_tensor(x: Any) -> bool:
    return isinstance(x, SparseTensor)


def _xp_of(t: Tensor) -> Any:
    return _backend.array_module(t._data)


class SparseTensor(Tensor):
    """A sparse COO tensor (``layout == mpitensor.sparse_coo``); make one with
    :func:`sparse_coo_tensor` or :meth:`Tensor.to_sparse`.

    Example:
        >>> import mpitensor as mt
        >>> s = mt.sparse_coo_tensor([[0, 1], [1, 0]], [2.0, 3.0], (2, 2))
        >>> s.to_dense()
        tensor([[0., 2.],
                [3., 0.]])
    """

    # _src: for the result of to_sparse() of a tensor that requires grad, that tensor; torch's
    # mm and @ pass it a dense gradient (not one masked to the entries), got by multiplying it
    __slots__ = ("_idx", "_vals", "_size", "_coalesced", "_src")

    is_sparse = True
    layout = sparse_coo

    @classmethod
    def _make(cls, idx: Any, vals: Tensor, size: tuple, coalesced: bool) -> SparseTensor:
        t = cls._wrap(SparseData(size, vals._data.dtype))
        t._data.tensor = t
        t._idx = idx
        t._vals = vals
        t._size = tuple(int(s) for s in size)
        t._coalesced = bool(coalesced)
        t._src = None
        return t

    def __getstate__(self) -> dict:
        leaf = self.requires_grad and self.grad_fn is None
        return {"indices": self._idx, "values": self._vals.detach(), "size": self._size,
                "coalesced": self._coalesced, "requires_grad": leaf}

    def __setstate__(self, state: dict) -> None:
        # pickle and copy.deepcopy: the tensor is rebuilt as _make builds one
        vals = state["values"]
        if state.get("requires_grad"):
            vals.requires_grad_(True)
        made = type(self)._make(state["indices"], vals, state["size"], state["coalesced"])
        for name in ("_vc", "_view", *_SPARSE_SLOTS, *getattr(type(self), "__slots__", ())):
            setattr(self, name, getattr(made, name))
        self._data = SparseData(made._size, vals._data.dtype)
        self._data.tensor = self

    def _with_values(self, vals: Tensor, coalesced: Optional[bool] = None) -> SparseTensor:
        return type(self)._make(self._idx, vals, self._size,
                                  self._coalesced if coalesced is None else coalesced)

    # ---- metadata -----------------------------------------------------------------------------

    @property
    def shape(self) -> Size:
        """The shape, as a :class:`Size`."""
        return Size(self._size)

    def size(self, dim: Optional[int] = None) -> Any:
        """Return the shape, or the length of dimension ``dim``."""
        if dim is None:
            return Size(self._size)
        return self._size[wrap_dim(dim, len(self._size))]

    def dim(self) -> int:
        """Return the number of dimensions (sparse and dense)."""
        return len(self._size)

    ndimension = dim

    @property
    def ndim(self) -> int:
        """The number of dimensions."""
        return len(self._size)

    # dtype, device, is_cuda, is_cpu: the values' (see _values_property below)

    def sparse_dim(self) -> int:
        """Return the number of sparse dimensions."""
        return int(self._idx.shape[0])

    def dense_dim(self) -> int:
        """Return the number of dense dimensions (those of each value)."""
        return len(self._size) - int(self._idx.shape[0])

    def _nnz(self) -> int:
        """Return the number of stored entries (duplicates counted until coalesced)."""
        return int(self._idx.shape[1])

    def is_coalesced(self) -> bool:
        """True when the coordinates are sorted and unique."""
        return self._coalesced

    def is_contiguous(self, memory_format: Any = None) -> bool:
        """False, as torch answers for sparse tensors."""
        return False

    def stride(self, dim: Optional[int] = None) -> Any:
        raise refusal("stride()")

    def __len__(self) -> int:
        if not self._size:
            raise TypeError("len() of a 0-d tensor")
        return self._size[0]

    # ---- autograd state (that of the values) -------------------------------------------------

    @property
    def requires_grad(self) -> bool:
        """Whether the values require gradients."""
        return self._vals._requires_grad

    @requires_grad.setter
    def requires_grad(self, value: bool) -> None:
        self._vals.requires_grad = value

    @property
    def _requires_grad(self) -> bool:
        return self._vals._requires_grad

    @_requires_grad.setter
    def _requires_grad(self, value: bool) -> None:
        if value:  # set by the base constructor only with False
            raise RuntimeError("set requires_grad on a sparse tensor through requires_grad_()")

    @property
    def grad_fn(self) -> Any:
        """The autograd node that made the values (None for a leaf)."""
        return self._vals.grad_fn

    @grad_fn.setter
    def grad_fn(self, value: Any) -> None:
        if value is not None:
            raise RuntimeError("a sparse tensor's grad_fn is that of its values")

    @property
    def grad(self) -> Any:
        """The gradient of a sparse leaf: sparse, with this tensor's coordinates."""
        g = getattr(self, "_vals", None)
        g = None if g is None else g.grad
        if g is None:
            return None
        if self._coalesced or self._idx.shape[1] == 0:
            return type(self)._make(self._idx, g, self._size, self._coalesced)
        # the gradient of the dense tensor at each stored place: every copy of a repeated
        # entry got the same one, so the first copy of each speaks for all, as torch's
        # coalesced gradient of an uncoalesced leaf does
        xp = _backend.array_module(self._idx)
        sd = self._idx.shape[0]
        lin = xp.ravel_multi_index(tuple(self._idx), self._size[:sd]) if sd else \
            xp.zeros(self._idx.shape[1], dtype=np.int64)
        _, first = xp.unique(lin, return_index=True)
        return SparseTensor._make(self._idx[:, first], wrap(g._data[first]), self._size, True)

    @grad.setter
    def grad(self, value: Any) -> None:
        vals = getattr(self, "_vals", None)
        if vals is None:  # the base constructor's first write
            return
        if value is None:
            vals.grad = None
            return
        if not (is_sparse_tensor(value) and value._idx.shape == self._idx.shape
                and bool((value._idx == self._idx).all())):
            raise RuntimeError("a sparse tensor's grad can be set only to None or to a sparse "
                               "tensor with the same indices")
        vals.grad = value._vals

    def detach(self) -> SparseTensor:
        """Return this sparse tensor outside autograd (sharing its values' memory)."""
        return self._with_values(self._vals.detach())

    def requires_grad_(self, requires_grad: bool = True) -> SparseTensor:
        """Make this sparse tensor a leaf that requires (or not) gradients; returns self."""
        self._vals.requires_grad_(requires_grad)
        return self

    def backward(self, gradient: Any = None, retain_graph: Optional[bool] = None,
                 create_graph: bool = False, inputs: Any = None) -> None:
        raise refusal("backward() from a sparse tensor (reduce it first, e.g. s.to_dense()"
                      ".sum())")

    # ---- conversions --------------------------------------------------------------------------

    def to_dense(self, dtype: Any = None, *, masked_grad: bool = True) -> Tensor:
        """Return the dense tensor (duplicate entries add up); differentiable.

        Example:
            >>> import mpitensor as mt
            >>> mt.sparse_coo_tensor([[0, 0]], [1.0, 2.0], (2,)).to_dense()
            tensor([3., 0.])
        """
        vals = self._vals if dtype is None else self._vals.to(_dt.to_dtype(dtype))
        index = tuple(self._idx[k] for k in range(self._idx.shape[0]))
        return ScatterAdd.apply(vals, index, self._size)

    def to_sparse(self, sparse_dim: Optional[int] = None, *, layout: Any = None,
                  blocksize: Any = None, dense_dim: Any = None) -> SparseTensor:
        """Return self (already sparse COO); another ``sparse_dim`` is refused, as in torch."""
        if layout not in (None, sparse_coo):
            raise NotImplementedError(f"to_sparse(): only the sparse_coo layout is supported, "
                                      f"got {layout!r}")
        if sparse_dim is not None and sparse_dim != self.sparse_dim():
            raise RuntimeError(f"to_sparse(): this tensor already has {self.sparse_dim()} "
                               f"sparse dimensions; converting to {sparse_dim} is unsupported")
        return self

    def coalesce(self) -> SparseTensor:
        """Return the tensor with sorted, unique coordinates (duplicates summed); differentiable.

        Example:
            >>> import mpitensor as mt
            >>> s = mt.sparse_coo_tensor([[1, 0, 1]], [1.0, 2.0, 3.0], (2,)).coalesce()
            >>> s.indices(), s.values()
            (tensor([[0, 1]]), tensor([2., 4.]))
        """
        if self._coalesced:
            return self
        xp = _backend.array_module(self._idx)
        sd = self._idx.shape[0]
        if self._idx.shape[1] == 0:
            return SparseTensor._make(self._idx, self._vals, self._size, True)
        if sd == 0:
            lin = xp.zeros(self._idx.shape[1], dtype=np.int64)
        else:
            lin = xp.ravel_multi_index(tuple(self._idx), self._size[:sd])
        uniq, inv = xp.unique(lin, return_inverse=True)
        inv = inv.reshape(-1)
        idx = (xp.stack(xp.unravel_index(uniq, self._size[:sd])).astype(np.int64) if sd
               else xp.zeros((0, uniq.size), dtype=np.int64))
        vals = ScatterAdd.apply(self._vals, (inv,), (int(uniq.size), *self._vals.shape[1:]))
        return SparseTensor._make(idx, vals, self._size, True)

    def _co(self) -> SparseTensor:
        # coalesce() for the code here, which CSR answers with itself (its public
        # coalesce() raises, as torch's does)
        return self.coalesce()

    def to_sparse_coo(self) -> SparseTensor:
        """Return the sparse COO form (self for a COO tensor)."""
        return self.to_sparse()

    def indices(self) -> Tensor:
        """Return the int64 coordinates, shape ``(sparse_dim, nnz)`` (coalesced tensors only)."""
        if not self._coalesced:
            raise RuntimeError("Cannot get indices of an uncoalesced sparse tensor: call "
                               ".coalesce() first (or read ._indices())")
        return wrap(self._idx)

    def values(self) -> Tensor:
        """Return the values, shape ``(nnz, *dense sizes)`` (coalesced tensors only)."""
        if not self._coalesced:
            raise RuntimeError("Cannot get values of an uncoalesced sparse tensor: call "
                               ".coalesce() first (or read ._values())")
        return self._vals

    def _indices(self) -> Tensor:
        """Return the stored coordinates, coalesced or not."""
        return wrap(self._idx)

    def _values(self) -> Tensor:
        """Return the stored values, coalesced or not."""
        return self._vals

    def to(self, *args: Any, **kwargs: Any) -> SparseTensor:
        """Return the sparse tensor on another device and/or with another dtype."""
        device, dtype, copy = to_args(args, kwargs)
        dev = parse_device(device)
        vals = self._vals.to(device=dev, dtype=dtype, copy=copy)
        idx = move(self._idx, dev) if dev is not None else self._idx
        if vals is self._vals and idx is self._idx:
            return self
        out = SparseTensor._make(idx, vals, self._size, self._coalesced)
        if self._src is not None:
            out._src = self._src.to(device=dev, dtype=dtype)
        return out

    def cpu(self) -> SparseTensor:
        """Return the sparse tensor in host memory."""
        return self.to("cpu")

    def cuda(self, device: Any = None, non_blocking: bool = False) -> SparseTensor:
        """Return the sparse tensor on a GPU."""
        return self.to("cuda" if device is None else parse_device(device))

    def type(self, dtype: Any = None, non_blocking: bool = False) -> Any:
        if dtype is None:
            return f"torch.sparse.{wrap(self._vals._data[:0]).type().split('.')[-1]}"
        return self.to(_dt.to_dtype(dtype))

    def clone(self, *, memory_format: Any = None) -> SparseTensor:
        """Return a copy (differentiable through the values)."""
        return SparseTensor._make(self._idx.copy(), self._vals.clone(), self._size,
                                  self._coalesced)

    def numpy(self, *, force: bool = False) -> Any:
        raise TypeError(f"a sparse tensor has no NumPy array; {_USE_DENSE}")

    def tolist(self) -> Any:
        raise TypeError(f"a sparse tensor has no list form; {_USE_DENSE}")

    def item(self) -> Any:
        if self.numel() != 1:
            raise RuntimeError(f"a tensor with {self.numel()} elements cannot be converted to "
                               f"a Python number")
        return self.to_dense().item()

    def __repr__(self) -> str:
        ind = repr(wrap(self._idx)).replace("\n", "\n" + " " * 15)
        val = repr(self._vals.detach()).replace("\n", "\n" + " " * 14)
        extra = ""
        if self.dtype != _dt.get_default_dtype() and self.dtype not in (np.int64, np.bool_):
            extra = f", dtype={_dt.dt_repr(self.dtype)}"
        dev = "" if self.is_cpu else f", device='{self.device}'"
        tail = ""
        if self.grad_fn is not None:
            tail = f",\n       grad_fn=<{self.grad_fn.name()}>"
        elif self.requires_grad:
            tail = ",\n       requires_grad=True"
        return (f"tensor(indices={ind},\n       values={val},\n       size={self._size}, "
                f"nnz={self._nnz()}{extra}{dev}, layout=mpitensor.sparse_coo{tail})")

    __str__ = __repr__

    # ---- arithmetic ---------------------------------------------------------------------------

    def _binary_check(self, other: SparseTensor, what: str) -> None:
        if other._size != self._size:
            raise RuntimeError(f"{what}: the sparse tensors' sizes differ, {list(self._size)} "
                               f"!= {list(other._size)}")
        if other.sparse_dim() != self.sparse_dim():
            raise RuntimeError(f"{what}: the sparse tensors have {self.sparse_dim()} and "
                               f"{other.sparse_dim()} sparse dimensions")

    def add(self, other: Any, *, alpha: Any = 1) -> Any:
        """Return ``self + alpha * other`` for a sparse ``other`` (sparse result)."""
        if not is_sparse_tensor(other):
            raise RuntimeError("add(sparse, dense) is not supported: write dense + sparse "
                               "(a dense result) instead")
        self._binary_check(other, "add")
        xp = _xp_of(self._vals)
        ov = other._vals if alpha == 1 else other._vals * alpha
        dt = _promotion.promote(self.dtype, ov.dtype)
        vals = _cat_values(self._vals.to(dt), ov.to(dt))
        out = SparseTensor._make(xp.concatenate([self._idx, other._idx], axis=1), vals,
                                 self._size, False)
        if self.is_sparse_csr and other.is_sparse_csr:
            return out.coalesce().to_sparse_csr()
        return out.coalesce() if self._coalesced and other._coalesced else out

    def __add__(self, other: Any) -> Any:
        return self.add(other)

    def __radd__(self, other: Any) -> Any:  # dense + sparse: a dense result
        if isinstance(other, Tensor) and not is_sparse_tensor(other):
            if tuple(other.shape) != self._size:
                raise RuntimeError(f"add: a dense {list(other.shape)} tensor and a sparse "
                                   f"{list(self._size)} one must have the same size")
            return other + self.to_dense()
        return NotImplemented

    def sub(self, other: Any, *, alpha: Any = 1) -> Any:
        """Return ``self - alpha * other`` for a sparse ``other``."""
        return self.add(other, alpha=-alpha)

    def __sub__(self, other: Any) -> Any:
        return self.sub(other)

    def __rsub__(self, other: Any) -> Any:
        if isinstance(other, Tensor) and not is_sparse_tensor(other):
            return other + (-self).to_dense()
        return NotImplemented

    def mul(self, other: Any) -> SparseTensor:
        """Multiply by a number, a dense tensor (at this tensor's entries) or a sparse tensor
        (at the entries both hold); a sparse result."""
        if _promotion.is_scalar(other) or (isinstance(other, Tensor) and not is_sparse_tensor(other)
                                           and other.dim() == 0):
            return self._with_values(self._vals * other)
        if is_sparse_tensor(other):
            self._binary_check(other, "mul")
            return _sparse_mul(self._co(), other._co())
        if isinstance(other, Tensor):
            d = other.expand(*self._size) if tuple(other.shape) != self._size else other
            s = self._co()
            index = tuple(s._idx[k] for k in range(s._idx.shape[0]))
            return s._with_values(s._vals * Gather.apply(d, index))
        return NotImplemented

    __mul__ = __rmul__ = mul

    def div(self, other: Any) -> SparseTensor:
        """Divide the values by a number (or a 0-d dense tensor)."""
        if _promotion.is_scalar(other) or (isinstance(other, Tensor) and not is_sparse_tensor(other)
                                           and other.dim() == 0):
            return self._with_values(self._vals / other)
        raise refusal("dividing by a tensor that is not a number")

    __truediv__ = true_divide = divide = div

    def __neg__(self) -> SparseTensor:
        return self._with_values(-self._vals)

    neg = negative = __neg__

    def __pos__(self) -> SparseTensor:
        return self

    def pow(self, exponent: Any) -> SparseTensor:
        """Raise the (coalesced) values to a positive number."""
        if not _promotion.is_scalar(exponent) or not exponent > 0:
            raise refusal("pow() with an exponent that is not a positive number")
        s = self._co()
        return s._with_values(s._vals ** exponent)

    __pow__ = pow

    # ---- shapes -------------------------------------------------------------------------------

    def transpose(self, dim0: int, dim1: int) -> SparseTensor:
        """Swap two sparse dimensions (not coalesced afterwards)."""
        nd, sd = len(self._size), self.sparse_dim()
        d0, d1 = wrap_dim(dim0, nd), wrap_dim(dim1, nd)
        if d0 == d1:
            return self
        if d0 >= sd or d1 >= sd:
            raise refusal("transpose() of a dense dimension of a sparse tensor")
        order = list(range(sd))
        order[d0], order[d1] = d1, d0
        size = list(self._size)
        size[d0], size[d1] = size[d1], size[d0]
        out = SparseTensor._make(self._idx[order], self._vals, tuple(size), False)
        if self._src is not None:
            out._src = self._src.transpose(d0, d1)
        return out

    swapaxes = swapdims = transpose

    def t(self) -> SparseTensor:
        """The transpose of a sparse matrix (at most 2 sparse and no dense dimensions)."""
        if self.sparse_dim() > 2 or self.dense_dim() != 0:
            raise RuntimeError(f"t() expects a sparse tensor with at most 2 sparse and 0 dense "
                               f"dimensions, got {self.sparse_dim()} sparse and "
                               f"{self.dense_dim()} dense")
        return self if self.dim() < 2 else self.transpose(0, 1)

    @property
    def T(self) -> SparseTensor:  # noqa: N802 - torch's name
        return self.t()

    # ---- reductions ---------------------------------------------------------------------------

    def sum(self, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Tensor:
        """Sum over all elements (a dense 0-d result) or over ``dim`` (see
        :func:`mpitensor.sparse.sum`)."""
        if keepdim:
            raise refusal("sum(keepdim=True)")
        return sparse_sum(self, dim, dtype)

    # ---- elementwise maps that keep zeros -----------------------------------------------------

    def _coalesced_map(self, name: str) -> SparseTensor:
        s = self._co()
        return s._with_values(getattr(s._vals, name)())


def _values_property(name: str) -> property:
    return property(lambda self: getattr(self._vals, name),
                    doc=f"The values' ``{name}`` (the indices live with them).")


for _name in ("dtype", "device", "is_cuda", "is_cpu"):
    setattr(SparseTensor, _name, _values_property(_name))


def _zero_keeping(name: str) -> Any:
    def fn(self: SparseTensor) -> SparseTensor:
        return self._coalesced_map(name)

    fn.__name__ = name
    fn.__doc__ = f"Apply ``{name}`` to the (coalesced) values; zeros stay zeros."
    return fn


for _name in ("abs", "sqrt", "relu", "square", "sin", "tan", "tanh", "asin", "atan", "sinh",
              "asinh", "sign", "sgn", "expm1", "log1p", "trunc", "floor", "ceil", "round",
              "erf", "deg2rad", "rad2deg", "frac", "signbit", "isnan", "isinf", "neg"):
    setattr(SparseTensor, _name, _zero_keeping(_name))
SparseTensor.absolute = SparseTensor.abs


def _caster(dtype: np.dtype) -> Any:
    def fn(self: SparseTensor, memory_format: Any = None) -> SparseTensor:
        return self.to(dtype)

    return fn


for _name, _dtype in (("float", _dt.float32), ("double", _dt.float64), ("half", _dt.float16),
                      ("bfloat16", _dt.bfloat16), ("long", _dt.int64), ("int", _dt.int32),
                      ("short", _dt.int16), ("char", _dt.int8), ("byte", _dt.uint8),
                      ("bool", _dt.bool_)):
    setattr(SparseTensor, _name, _caster(_dtype))

# the dense operations of the view family have no sparse form here: each names itself
for _name in ("view", "reshape", "flatten", "contiguous", "expand", "permute", "unsqueeze",
              "squeeze", "exp", "log", "sigmoid", "mean", "softmax", "log_softmax", "max",
              "min", "__getitem__", "__setitem__", "__eq__", "__ne__", "__lt__", "__le__",
              "__gt__", "__ge__", "__iter__", "__bool__", "data_ptr", "__floordiv__",
              "__mod__", "__rtruediv__", "__rpow__", "add_", "mul_", "sub_", "div_", "copy_",
              "fill_", "zero_", "narrow", "index_select", "gather", "__iadd__", "__imul__",
              "__isub__", "__itruediv__", "bmm", "__and__", "__or__", "__invert__"):
    setattr(SparseTensor, _name, _refusing(f"{_name}() on a sparse tensor"))
SparseTensor.__hash__ = Tensor.__hash__


def _cat_values(a: Tensor, b: Tensor) -> Tensor:
    from mpitensor._ops.combine import cat  # noqa: PLC0415 - an op module, loaded by now

    return cat([a, b], 0)


def _sparse_mul(a: SparseTensor, b: SparseTensor) -> SparseTensor:
    """Product of two coalesced sparse tensors of one size: the entries both hold."""
    xp = _backend.array_module(a._idx)
    sd = a.sparse_dim()
    la = xp.ravel_multi_index(tuple(a._idx), a._size[:sd]) if sd else xp.zeros(a._nnz(),
                                                                                  np.int64)
    lb = xp.ravel_multi_index(tuple(b._idx), b._size[:sd]) if sd else xp.zeros(b._nnz(),
                                                                                  np.int64)
    _, ia, ib = np.intersect1d(_backend.to_numpy(la), _backend.to_numpy(lb),
                               assume_unique=True, return_indices=True)
    ia, ib = move(ia.astype(np.int64), a.device), move(ib.astype(np.int64), a.device)
    vals = Gather.apply(a._vals, (ia,)) * Gather.apply(b._vals, (ib,))
    return SparseTensor._make(a._idx[:, ia], vals, a._size, True)


def sparse_sum(s: SparseTensor, dim: Any, dtype: Any) -> Tensor:
    vals = s._vals if dtype is None else s._vals.to(_dt.to_dtype(dtype))
    if dim is None:
        return vals.sum()
    nd, sd = s.dim(), s.sparse_dim()
    dims = sorted({wrap_dim(d, nd) for d in (dim if isinstance(dim, (list, tuple)) else [dim])})
    dense_axes = [d - sd + 1 for d in dims if d >= sd]
    if dense_axes:
        vals = vals.sum(dense_axes)
    keep = [d for d in range(sd) if d not in dims]
    size = tuple(n for i, n in enumerate(s._size) if i not in dims)
    if not keep:  # every sparse dimension summed: a dense result
        return vals.sum(0)
    return SparseTensor._make(s._idx[keep], vals, size, False).coalesce()


# --------------------------------------------------------------------------------------------
# construction


def as_index_array(indices: Any, device: Any) -> Any:
    if isinstance(indices, Tensor):
        if is_sparse_tensor(indices):
            raise TypeError("sparse_coo_tensor(): indices must be a dense tensor")
        arr = indices._data
    elif _backend.is_array(indices):
        arr = indices
    else:
        arr = np.asarray(indices)
    if _dt.kind_of(arr.dtype) not in "iub":
        if _dt.kind_of(arr.dtype) != "f":
            raise TypeError(f"sparse_coo_tensor(): indices must be integers, got "
                            f"{_dt.dt_repr(arr.dtype)}")
    arr = arr.astype(np.int64)
    return move(arr, device) if device is not None else arr


def _coo_size(idx: Any, vals_shape: tuple, size: Any) -> tuple:
    """The full size of a COO tensor: ``size`` checked against the coordinates ``idx`` and the
    values' shape, or inferred from the largest coordinates when ``size`` is None."""
    sd, nnz = idx.shape
    dense = tuple(vals_shape[1:])
    lo = _backend.to_numpy(idx.min(axis=1)) if nnz else np.zeros(sd, np.int64)
    hi = _backend.to_numpy(idx.max(axis=1)) if nnz else np.full(sd, -1, np.int64)
    if (lo < 0).any():
        d = int(np.argmax(lo < 0))
        raise RuntimeError(f"sparse_coo_tensor(): found a negative index {int(lo[d])} in "
                           f"sparse dimension {d}")
    if size is None:
        if nnz == 0 and sd:
            raise RuntimeError("sparse_coo_tensor(): cannot infer the size from no entries; "
                               "pass size")
        size = tuple(int(h) + 1 for h in hi) + dense
    else:
        size = tuple(operator.index(n) for n in (size.shape if isinstance(size, Tensor)
                                                 else size))
        if len(size) != sd + len(dense):
            raise RuntimeError(f"sparse_coo_tensor(): the size has {len(size)} dimensions but "
                               f"the indices give {sd} sparse and the values {len(dense)} "
                               f"dense dimensions")
        for d in range(sd):
            if hi[d] >= size[d]:
                raise RuntimeError(f"sparse_coo_tensor(): size is inconsistent with indices: "
                                   f"for dim {d}, size is {size[d]} but found index {int(hi[d])}")
        if tuple(size[sd:]) != dense:
            raise RuntimeError(f"sparse_coo_tensor(): values has incorrect size, expected "
                               f"{[nnz, *size[sd:]]}, got {list(vals_shape)}")
    return size


def sparse_coo_tensor(indices: Any, values: Any, size: Any = None, *, dtype: Any = None,
                      device: Any = None, pin_memory: bool = False, requires_grad: bool = False,
                      check_invariants: Optional[bool] = None,
                      is_coalesced: Optional[bool] = None) -> SparseTensor:
    """Make a sparse COO tensor from coordinates and values.

    The indices are always checked (as torch does with ``check_invariants=True``); an index
    out of the size's range or negative raises before anything is built.

    Args:
        indices: ``(sparse_dim, nnz)`` integer coordinates (a tensor, array or nested list).
        values: ``(nnz, *dense sizes)`` values; gradients flow back to them.
        size: the full size; inferred from the largest coordinates when omitted.
        dtype, device: of the values (and where both live).
        requires_grad: make the result a leaf that requires grad (a copy of the values).
        is_coalesced: declare the coordinates sorted and unique (checked).

    Raises:
        RuntimeError: indices not 2-D, nnz mismatch, size inconsistent with the indices.

    Example:
        >>> import mpitensor as mt
        >>> mt.sparse_coo_tensor([[0, 2]], [5.0, 6.0], (3,)).to_dense()
        tensor([5., 0., 6.])
    """
    dev = parse_device(device)
    if isinstance(values, Tensor):
        if is_sparse_tensor(values):
            raise TypeError("sparse_coo_tensor(): values must be a dense tensor")
        vals = values
    else:
        from mpitensor._ops.create import tensor  # noqa: PLC0415 - an op module, loaded by now

        vals = tensor(values)
    if dtype is not None or dev is not None:
        vals = vals.to(device=dev, dtype=None if dtype is None else _dt.to_dtype(dtype))
    idx = as_index_array(indices, vals.device if dev is None else dev)
    if idx.ndim != 2:
        raise RuntimeError(f"sparse_coo_tensor(): indices must be 2-D (sparse_dim, nnz), got "
                           f"shape {list(idx.shape)}")
    sd, nnz = idx.shape
    if vals.dim() == 0 or vals.shape[0] != nnz:
        got = vals.shape[0] if vals.dim() else "a 0-d tensor"
        raise RuntimeError(f"sparse_coo_tensor(): indices and values must have the same nnz, "
                           f"got {nnz} from the indices and {got} from the values")
    size = _coo_size(idx, tuple(vals.shape), size)
    coalesced = nnz <= 1
    if is_coalesced:
        xp = _backend.array_module(idx)
        lin = xp.ravel_multi_index(tuple(idx), size[:sd]) if sd else xp.zeros(nnz, np.int64)
        if nnz > 1 and not bool((lin[1:] > lin[:-1]).all()):
            raise RuntimeError("sparse_coo_tensor(): is_coalesced=True but the indices are "
                               "not sorted and unique")
        coalesced = True
    if requires_grad:
        vals = vals.detach().clone().requires_grad_(True)
    elif vals.requires_grad and vals.grad_fn is None:
        # the values are someone's leaf: the sparse tensor is made from them (not a leaf
        # itself), its gradient flows back to them
        vals = vals.view(tuple(vals.shape))
    return SparseTensor._make(idx, vals, size, coalesced)


_SPARSE_SLOTS = SparseTensor.__slots__


# --------------------------------------------------------------------------------------------
# what every tensor gets


@tensor_methods
class _SparseMethods:
    layout = strided

    def to_dense(self, dtype: Any = None, *, masked_grad: bool = True) -> Tensor:
        """Return self (a dense tensor is its own dense form), cast to ``dtype`` if given."""
        return self if dtype is None else self.to(_dt.to_dtype(dtype))

    def to_sparse(self, sparse_dim: Optional[int] = None, *, layout: Any = None,
                  blocksize: Any = None, dense_dim: Any = None) -> SparseTensor:
        """Return the sparse COO form: the first ``sparse_dim`` dimensions (all by default)
        become coordinates of the nonzero entries; differentiable.

        Example:
            >>> import mpitensor as mt
            >>> mt.tensor([[0., 1.], [2., 0.]]).to_sparse().indices()
            tensor([[0, 1],
                    [1, 0]])
        """
        if layout not in (None, sparse_coo):
            raise NotImplementedError(f"to_sparse(): only the sparse_coo layout is supported, "
                                      f"got {layout!r}")
        nd = self.dim()
        sd = nd if sparse_dim is None else operator.index(sparse_dim)
        if not 0 <= sd <= nd:
            raise RuntimeError(f"to_sparse(): sparse_dim must be in [0, {nd}], got {sd}")
        if sd == 0 and nd > 0:
            raise RuntimeError("to_sparse(): sparse_dim must be > 0 for a tensor with "
                               "dimensions")
        x = self._data
        xp = _backend.array_module(x)
        if sd == 0:
            return SparseTensor._make(xp.zeros((0, 1), dtype=np.int64), self.reshape(1),
                                      (), True)
        mask = x != 0
        if sd < nd:
            mask = mask.any(axis=tuple(range(sd, nd)))
        idx = xp.stack(xp.nonzero(mask)).astype(np.int64).reshape(sd, -1)
        vals = Gather.apply(self, tuple(idx[k] for k in range(sd)))
        out = SparseTensor._make(idx, vals, tuple(x.shape), True)
        if vals.requires_grad:
            out._src = self
        return out

    def to_sparse_coo(self) -> SparseTensor:
        """Return the sparse COO form (as ``to_sparse()``)."""
        return self.to_sparse()

    def sparse_dim(self) -> int:
        """0: a dense tensor has no sparse dimensions."""
        return 0

    def dense_dim(self) -> int:
        """The number of dimensions: all of a dense tensor's are dense."""
        return self.dim()

    def _nnz(self) -> int:
        raise NotImplementedError("_nnz() is for sparse tensors; this one is dense")

    def sparse_mask(self, mask: SparseTensor) -> SparseTensor:
        """Return the entries of self at ``mask``'s coordinates, as a sparse tensor."""
        if not is_sparse_tensor(mask):
            raise TypeError("sparse_mask(): mask must be a sparse COO tensor")
        if tuple(self.shape) != mask._size:
            raise RuntimeError(f"sparse_mask(): sizes differ, {list(self.shape)} and "
                               f"{list(mask._size)}")
        m = mask._co()
        vals = Gather.apply(self, tuple(m._idx[k] for k in range(m._idx.shape[0])))
        return SparseTensor._make(m._idx, vals, m._size, True)


def _layout_only(name: str, layout_name: str) -> Any:
    def fn(self: Tensor, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{name}() is for {layout_name} tensors, and this one's layout is "
                           f"{self.layout!r}")

    fn.__name__ = name
    return fn


for _name in ("indices", "values", "coalesce", "is_coalesced", "_indices", "_values"):
    setattr(Tensor, _name, _layout_only(_name, "sparse"))  # SparseTensor has its own
for _name in ("crow_indices", "col_indices"):
    setattr(Tensor, _name, _layout_only(_name, "sparse CSR"))  # as SparseCsrTensor has
