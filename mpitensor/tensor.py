"""The Tensor: a thin wrapper around a NumPy array (CPU) or a CuPy array (GPU).

``Tensor._data`` is the array itself. The communication layer reads and writes it in place, so a
Tensor never copies on wrapping, views share storage, and in-place operators write into
``_data``. CuPy is never imported here at module level.

This module holds the data structure and its core protocol: :class:`Size`, construction, the
autograd state (``requires_grad``, ``grad``, ``grad_fn``, ``backward`` and hooks), metadata
(shape, dtype, device, strides), conversions to Python, NumPy, DLPack and pickle, printing, and
the raw in-place writes (``copy_``, ``fill_``, ``zero_``).

Everything a tensor *computes* is an op, kept with its gradient in the module of its family,
which adds its methods to :class:`Tensor` when imported (``opkit.tensor_methods``); ``mpitensor``
imports them all (through ``mpitensor._ops``, whose docstring lists them by family) before
anything else can use a tensor. ``mpitensor._core.opkit`` is the kit those modules are
written with.

The functions those modules define for this module's ``__all__`` (``zeros``, ``cat``,
``manual_seed``, ...) stay importable from here: each module hands them over with ``_serve``
and :func:`__getattr__` finds them, so this module imports none of its ops (no import cycle).

Semantics follow PyTorch where that is practical: dtype defaults (Python floats -> float32),
torch's type promotion (``mpitensor._core.promotion``), views, ``repr`` and printing options.
In-place changes are recorded by autograd as in torch (``mpitensor.autograd.apply_inplace``):
each tensor has a version counter (``_version``) shared with its views, and backward refuses
arrays changed after an op saved them; a leaf that requires grad is changed in place only under
``no_grad()``, as optimisers do.

Example:
    >>> import mpitensor as mt
    >>> t = mt.tensor([[1., 2.], [3., 4.]])
    >>> t[0] += 10
    >>> t
    tensor([[11., 12.],
            [ 3.,  4.]])
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterator, Sequence
from typing import Any, Callable, Optional

import numpy as np

from mpitensor import autograd as _autograd
from mpitensor import backend as _backend
from mpitensor import dtypes as _dt
from mpitensor._core import printing as _printing
from mpitensor._core.devices import device_str, is_cupy
from mpitensor._core.devices import move as _move  # noqa: F401 - re-exported for nn.module
from mpitensor._core.devices import parse_device as _parse_device  # noqa: F401 - for nn.module
from mpitensor._core.dims import size_from, wrap_dim
from mpitensor._core.printing import get_printoptions, printoptions, set_printoptions
from mpitensor._core.python_data import array_from_data
from mpitensor.autograd import leaf_in_place_error as leaf_in_place_error  # for nn
from mpitensor.autograd import version_cell

# torch functions that are their Tensor method with the tensor first: ``torch.sin(x)`` is
# ``x.sin()``; each also takes ``out=`` (defined by mpitensor._ops.functions).
_FORWARDED_NAMES = (
    "absolute", "acos", "arccos", "acosh", "arccosh", "asin", "arcsin", "asinh", "arcsinh",
    "atan", "arctan", "atanh", "arctanh", "ceil", "cos", "cosh", "deg2rad", "digamma", "erf",
    "erfc", "erfinv", "exp2", "expm1", "fix", "floor", "frac", "lgamma", "log10", "log1p",
    "log2", "logit", "nan_to_num", "neg", "negative", "positive", "rad2deg", "reciprocal",
    "round", "rsqrt", "sgn", "sign", "signbit", "sin", "sinc", "sinh", "square", "tan", "trunc",
    "isnan", "isinf", "isfinite", "isposinf", "isneginf", "isreal", "conj", "conj_physical",
    "resolve_conj", "resolve_neg", "is_conj", "is_neg", "is_nonzero", "is_same_size",
    "is_signed",
    "add", "sub", "subtract", "mul", "multiply", "div", "divide", "true_divide",
    "floor_divide", "remainder", "fmod", "pow", "float_power", "atan2", "arctan2", "hypot",
    "logaddexp", "logaddexp2", "copysign", "xlogy", "maximum", "minimum", "fmax", "fmin",
    "gcd", "lcm", "nextafter", "heaviside", "ldexp", "lerp", "addcmul", "addcdiv",
    "eq", "ne", "lt", "le", "gt", "ge", "greater", "greater_equal", "less", "less_equal",
    "not_equal", "logical_and", "logical_or", "logical_xor", "logical_not", "bitwise_and",
    "bitwise_or", "bitwise_xor", "bitwise_not", "bitwise_left_shift", "bitwise_right_shift",
    "isclose", "clamp_min", "clamp_max", "angle", "real", "imag", "frexp", "put", "zero_",
    "index_put", "index_reduce", "select_scatter", "slice_scatter", "diagonal_scatter",
    "nonzero_static", "renorm", "cov", "corrcoef", "unsafe_chunk", "unsafe_split",
    "unsafe_split_with_sizes", "fill_",
    "all", "any", "prod", "std", "var", "amax", "amin", "aminmax",
    "logsumexp", "nansum", "nanmean", "count_nonzero", "median", "nanmedian", "mode",
    "kthvalue", "msort", "cumsum", "cumprod", "cummax", "cummin", "logcumsumexp",
    "mm", "bmm", "mv", "dot", "vdot", "inner", "outer", "ger", "addmm", "addbmm", "baddbmm",
    "addmv", "addr", "kron", "trace", "tril", "triu", "diag", "diagonal", "diag_embed",
    "diagflat", "inverse", "det", "logdet", "slogdet", "matrix_power", "norm",
    "flip", "fliplr", "flipud", "roll", "rot90", "narrow", "select", "movedim", "moveaxis",
    "swapaxes", "swapdims", "ravel", "unflatten", "broadcast_to", "repeat_interleave", "tile",
    "chunk", "split", "tensor_split", "hsplit", "vsplit", "dsplit", "split_with_sizes",
    "unbind", "gather", "scatter", "scatter_add", "scatter_reduce", "index_select",
    "index_add", "index_copy", "index_fill", "masked_select", "masked_scatter", "masked_fill",
    "take", "take_along_dim", "nonzero", "argwhere", "clone", "t", "detach", "diff", "cross",
)

# The names of __all__ that other modules define and serve (see _serve at the end); they
# could not be defined here, as their modules import this one.
_SERVED_NAMES = (
    # constructors (mpitensor._ops.create)
    "tensor", "as_tensor", "from_numpy", "zeros", "ones", "empty", "full", "arange", "linspace",
    "eye", "zeros_like", "ones_like", "empty_like", "full_like",
    # random numbers (mpitensor._ops.random)
    "rand", "randn", "randint", "randperm", "rand_like", "randn_like", "Generator",
    "default_generator", "manual_seed", "seed", "initial_seed", "get_rng_state", "set_rng_state",
    # functions on several tensors (mpitensor._ops.combine)
    "cat", "concat", "stack", "where", "allclose", "equal",
    # torch-style functions of one tensor (mpitensor._ops.functions: ``mt.exp(x)`` is ``x.exp()``)
    "exp", "log", "sqrt", "relu", "sigmoid", "tanh", "clamp", "clip", "matmul", "mean", "argmax",
    "argmin", "flatten", "reshape", "transpose", "permute", "squeeze", "unsqueeze", "softmax",
    "log_softmax", "sum", "max", "min", "abs", "sort", "argsort", "topk",
    # function forms of methods added by the op modules (mpitensor._ops.functions)
    *_FORWARDED_NAMES,
    "bincount", "histc", "unique", "unique_consecutive",
    # functions defined in mpitensor._ops.functions
    "rsub", "std_mean", "var_mean", "pi", "e", "inf", "nan", "newaxis", "result_type",
    "promote_types", "can_cast", "empty_strided", "scalar_tensor", "logspace", "asarray",
    # functions of their own (mpitensor._ops.linalg, _shape_ops, _counting, _random)
    "einsum", "tensordot", "dist", "broadcast_tensors", "broadcast_shapes", "atleast_1d",
    "atleast_2d", "atleast_3d", "hstack", "vstack", "row_stack", "dstack", "column_stack",
    "concatenate", "meshgrid", "cartesian_prod", "block_diag", "tril_indices", "triu_indices",
    "searchsorted", "bucketize", "bernoulli", "multinomial", "normal", "poisson",
    "randint_like", "isin", "histogram", "cdist", "combinations", "vander", "trapezoid",
    "trapz", "cumulative_trapezoid", "unravel_index",
    # complex numbers as pairs of reals (mpitensor._ops.complex)
    "view_as_real", "view_as_complex", "complex", "polar",
)

__all__ = [
    "Tensor",
    "Size",
    "is_tensor",
    "is_floating_point",
    "is_complex",
    "numel",
    "set_printoptions",
    "get_printoptions",
    "printoptions",
    *_SERVED_NAMES,
]

DTypeLike = Any

_ndarray = np.ndarray
_object_new = object.__new__
_INT64 = _dt.int64
_grad_mode = _autograd._mode  # thread-local; .enabled is False under no_grad()


# --------------------------------------------------------------------------------------------
# Size


class Size(tuple):
    """The shape of a tensor: a tuple of ints, printed as ``mpitensor.Size([2, 3])``.

    Example:
        >>> Size([2, 3]).numel()
        6
    """

    __slots__ = ()

    def __new__(cls, sizes: Sequence[int] = ()) -> Size:
        try:
            return tuple.__new__(cls, [operator.index(s) for s in sizes])
        except TypeError:
            raise TypeError(f"Size() takes a sequence of ints, got {sizes!r}") from None

    def __repr__(self) -> str:
        return f"mpitensor.Size({list(self)})"

    __str__ = __repr__

    def __getitem__(self, key: Any) -> Any:
        r = tuple.__getitem__(self, key)
        return tuple.__new__(Size, r) if isinstance(key, slice) else r

    def __add__(self, other: Any) -> Size:
        if not isinstance(other, tuple):
            return NotImplemented
        return tuple.__new__(Size, tuple.__add__(self, other))

    def __reduce__(self) -> Any:
        return (Size, (tuple(self),))

    def numel(self) -> int:
        """Return the number of elements a tensor of this shape holds."""
        return math.prod(self)


# --------------------------------------------------------------------------------------------
# Small helpers


def _new(arr: Any, cls: Any = None) -> Tensor:
    """Wrap an array in a Tensor (of class ``cls``, a plain one by default) without copying or
    checking it: the internal fast path."""
    if isinstance(arr, np.generic):  # NumPy returns scalars from ops on 0-d arrays
        arr = np.asarray(arr)
    t = _object_new(Tensor if cls is None else cls)
    _fresh(t, arr)
    return t


def _fresh(t: Tensor, arr: Any) -> None:
    """Give ``t`` the array ``arr`` and a new tensor's autograd state: no gradient, no node, no
    version counter, not a view."""
    t._data = arr
    t._requires_grad = False
    t.grad = t.grad_fn = t._vc = t._view = None


def _check_one_element(t: Tensor) -> Any:
    x = t._data
    if x.size != 1:
        raise ValueError("only one element tensors can be converted to Python scalars")
    return x.item()


# --------------------------------------------------------------------------------------------
# Tensor


class Tensor:
    """An n-dimensional array on the CPU (NumPy) or a GPU (CuPy), with PyTorch's interface.

    ``Tensor(array)`` wraps a NumPy or CuPy array without copying; ``Tensor(list)`` copies it to a
    tensor of the default float dtype and ``Tensor(2, 3)`` makes an uninitialized 2x3 one, like
    ``torch.Tensor``. Prefer :func:`tensor`, which infers the dtype.

    Attributes:
        _data: the underlying ``numpy.ndarray`` or ``cupy.ndarray`` (read and written in place by
            the communication layer).
        requires_grad: whether autograd should record operations on this tensor.
        grad: the accumulated gradient (None until autograd fills it).
        grad_fn: the autograd node that made this tensor (None for leaves).

    Example:
        >>> import numpy as np
        >>> a = np.zeros(3, dtype=np.float32)
        >>> Tensor(a)._data is a
        True
    """

    # _vc: the version counter (see mpitensor.autograd), None until needed; _view: for a view,
    # (root tensor, function from the root's array to the view's, taken outside autograd)
    __slots__ = ("_data", "_requires_grad", "grad", "grad_fn", "_hooks", "_vc", "_view",
                 "__weakref__")

    __array_priority__ = 1000  # ndarray <op> Tensor defers to Tensor's reflected operator

    def __init__(self, data: Any = (), *sizes: int, requires_grad: bool = False) -> None:
        if sizes or (isinstance(data, (int, np.integer)) and not isinstance(data, bool)):
            arr = np.empty(size_from((data, *sizes), "Tensor"), dtype=_dt.get_default_dtype())
        elif isinstance(data, Tensor):
            arr = data._data
        elif isinstance(data, _ndarray):
            keep = type(data) is _ndarray or isinstance(data, _backend.MetaArray)
            arr = data if keep else data.view(_ndarray)
            _dt.to_dtype(arr.dtype)
        elif _backend.is_cupy_array(data):
            arr = data
            _dt.to_dtype(arr.dtype)
        else:
            arr = array_from_data(data, _dt.get_default_dtype())
        _fresh(self, arr)
        if requires_grad:
            self.requires_grad = True

    @classmethod
    def _wrap(cls, arr: Any) -> Tensor:
        """Wrap an array without copying or validation (internal fast constructor)."""
        return _new(arr, cls)

    # ---- autograd -------------------------------------------------------------------------

    @property
    def requires_grad(self) -> bool:
        """Whether autograd records operations on this tensor (float/complex tensors only)."""
        return self._requires_grad

    @requires_grad.setter
    def requires_grad(self, value: bool) -> None:
        value = bool(value)
        if self.grad_fn is not None and not value:
            raise RuntimeError(
                "you can only change requires_grad flags of leaf variables. If you want to use a "
                "computed variable in a subgraph that doesn't require differentiation use "
                "var_no_grad = var.detach()."
            )
        if value and _dt.kind_of(self._data.dtype) not in "fc":
            raise RuntimeError(
                f"only tensors of floating point and complex dtype can require gradients, this "
                f"one is {_dt.dt_repr(self._data.dtype)}; convert it first, e.g. t.float()"
            )
        self._requires_grad = value

    def requires_grad_(self, requires_grad: bool = True) -> Tensor:
        """Set ``requires_grad`` in place and return self."""
        self.requires_grad = requires_grad
        return self

    @property
    def _version(self) -> int:
        """How many in-place writes this tensor's storage has had (through it or its views)."""
        c = getattr(self, "_vc", None)
        return 0 if c is None else c[0]

    @property
    def is_leaf(self) -> bool:
        """True for tensors not made by a recorded operation (``grad_fn`` is None)."""
        return self.grad_fn is None

    def backward(
        self, gradient: Any = None, retain_graph: Optional[bool] = None,
        create_graph: bool = False, inputs: Any = None,
    ) -> None:
        """Accumulate the gradient of this tensor into the ``.grad`` of the graph's leaves.

        Args:
            gradient: d(something)/d(self), shaped like self; may be omitted for one element.
            retain_graph: keep the graph's saved arrays for another backward.
            create_graph: unsupported (no higher-order gradients).
            inputs: restrict accumulation to these leaves.

        Example:
            >>> x = tensor([2.0], requires_grad=True)
            >>> (x * x).backward(ones(1))
            >>> x.grad
            tensor([4.])
        """
        _autograd.tensor_backward(self, gradient, retain_graph, create_graph, inputs)

    def register_hook(self, hook: Any) -> Any:
        """Run ``hook(grad)`` when this tensor's gradient is computed; see ``autograd``."""
        return _autograd.register_hook(self, hook)

    def register_post_accumulate_grad_hook(self, hook: Any) -> Any:
        """Run ``hook(self)`` right after this leaf's ``.grad`` has been accumulated."""
        return _autograd.register_post_accumulate_grad_hook(self, hook)

    def detach(self) -> Tensor:
        """Return a tensor sharing this one's storage (and version counter), outside autograd.

        Example:
            >>> w = ones(2, requires_grad=True)
            >>> w.detach().requires_grad
            False
        """
        t = _new(self._data)
        t._vc = version_cell(self)  # one storage: in-place writes through either count for both
        return t

    def detach_(self) -> Tensor:
        """Detach this tensor from the graph in place (it becomes a leaf without grad)."""
        self.grad_fn = None
        self._requires_grad = False
        self._view = None  # and stays out: writes into its base no longer rewire it
        return self

    def retain_grad(self) -> None:
        """Keep the gradient of this non-leaf tensor in ``.grad`` during backward.

        Raises:
            RuntimeError: the tensor does not require grad.
        """
        if not self._requires_grad:
            raise RuntimeError("can't retain_grad on Tensor that has requires_grad=False")
        node = self.grad_fn
        if node is None or getattr(node, "retains_grad", False):
            return
        node.retains_grad = True

        def keep(g: Tensor) -> None:
            if self.grad is None:
                self.grad = _new(g._data.copy())
            else:
                self.grad._data += g._data

        _autograd.register_hook(self, keep)

    @property
    def data(self) -> Tensor:
        """A tensor sharing this one's storage, outside autograd (torch's ``.data``).

        In-place arithmetic on it changes this tensor, as the tutorials'
        ``param.grad.data /= world_size`` expects; assigning ``t.data = other`` replaces this
        tensor's storage with ``other``'s.
        """
        return _new(self._data)

    @data.setter
    def data(self, value: Any) -> None:
        if isinstance(value, Tensor):
            self._data = value._data
        elif _backend.is_array(value):
            self._data = value
        else:
            raise TypeError(f"Tensor.data must be set to a Tensor or an array, got "
                            f"{type(value).__name__}")

    # ---- metadata --------------------------------------------------------------------------

    @property
    def shape(self) -> Size:
        """The shape, as a :class:`Size`."""
        return tuple.__new__(Size, self._data.shape)

    def size(self, dim: Optional[int] = None) -> Any:
        """Return the shape, or the length of dimension ``dim``.

        Raises:
            IndexError: ``dim`` is out of range.
        """
        if dim is None:
            return tuple.__new__(Size, self._data.shape)
        x = self._data
        if x.ndim == 0:
            raise IndexError(f"dimension specified as {dim} but tensor has no dimensions")
        return x.shape[wrap_dim(dim, x.ndim)]

    def dim(self) -> int:
        """Return the number of dimensions."""
        return self._data.ndim

    ndimension = dim

    @property
    def ndim(self) -> int:
        """The number of dimensions."""
        return self._data.ndim

    @property
    def dtype(self) -> np.dtype:
        """The element type (a ``numpy.dtype``, equal to e.g. ``mpitensor.float32``)."""
        return self._data.dtype

    @property
    def device(self) -> _backend.device:
        """The device the data lives on: ``device(type='cpu')`` or ``device(type='cuda', ...)``."""
        x = self._data
        if type(x) is _ndarray:
            return _backend.CPU
        return _backend.device_of(x)

    @property
    def is_cuda(self) -> bool:
        """True when the data is a CuPy array on a GPU."""
        return is_cupy(self._data)

    @property
    def is_cpu(self) -> bool:
        """True when the data is a NumPy array."""
        return isinstance(self._data, _ndarray)

    def numel(self) -> int:
        """Return the number of elements."""
        return self._data.size

    nelement = numel

    def element_size(self) -> int:
        """Return the size of one element in bytes."""
        return self._data.itemsize

    itemsize = property(operator.attrgetter("_data.itemsize"),
                        doc="The size of one element in bytes.")
    nbytes = property(operator.attrgetter("_data.nbytes"),
                      doc="The number of bytes the elements take (``numel() * element_size()``).")

    def stride(self, dim: Optional[int] = None) -> Any:
        """Return the strides in elements (a tuple), or the stride of dimension ``dim``."""
        x = self._data
        st = tuple(s // x.itemsize for s in x.strides)
        return st if dim is None else st[wrap_dim(dim, x.ndim)]

    def data_ptr(self) -> int:
        """Return the address of the first element (host or device memory)."""
        x = self._data
        if isinstance(x, _ndarray):
            return x.__array_interface__["data"][0]
        return int(x.data.ptr)

    def is_contiguous(self) -> bool:
        """True when the elements are laid out in C (row-major) order without gaps."""
        return bool(self._data.flags.c_contiguous)

    def storage_offset(self) -> int:
        """Return how many elements into its storage this tensor's first element lies."""
        x = self._data
        b = x.base
        if b is None or not hasattr(b, "dtype") or x.size == 0:
            return 0
        return (self.data_ptr() - _new(b).data_ptr()) // x.itemsize

    def is_signed(self) -> bool:
        """True for dtypes with negative numbers (not bool or unsigned integers)."""
        return _dt.kind_of(self._data.dtype) in "ifc"

    def is_nonzero(self) -> bool:
        """Return whether the single element is non-zero.

        Raises:
            RuntimeError: the tensor does not have exactly one element.
        """
        x = self._data
        if x.size != 1:
            raise RuntimeError(
                f"is_nonzero() needs a tensor with one element, this one has {x.size}"
            )
        return bool(x.reshape(()).item())

    def is_same_size(self, other: Tensor) -> bool:
        """True when ``other`` has this tensor's shape."""
        return tuple(self._data.shape) == tuple(other._data.shape)

    def get_device(self) -> int:
        """Return the GPU index of a CUDA tensor, -1 for a CPU tensor."""
        x = self._data
        if isinstance(x, _ndarray):
            return -1
        return int(_backend.device_of(x).index or 0)

    def pin_memory(self, device: Any = None) -> Tensor:
        """Return self: NumPy memory is what CPU tensors have (no page-locked copies)."""
        return self

    def is_pinned(self, device: Any = None) -> bool:
        """False: CPU tensors are plain NumPy memory."""
        return False

    def apply_(self, callable: Any) -> Tensor:  # noqa: A002 - torch's name
        """Replace every element ``v`` by ``callable(v)`` (a Python loop; CPU tensors only);
        returns self.

        Raises:
            TypeError: a GPU tensor.
            RuntimeError: self requires grad (outside ``no_grad()``).
        """
        return _map_into(self, lambda v: callable(v), (), "apply_()")

    def map_(self, tensor: Tensor, callable: Any) -> Tensor:  # noqa: A002 - torch's name
        """Replace every element ``v`` by ``callable(v, w)``, ``w`` the matching element of
        ``tensor`` (broadcast to self); a Python loop, CPU tensors only; returns self."""
        return _map_into(self, callable, (tensor,), "map_()")

    @property
    def retains_grad(self) -> bool:
        """True for a non-leaf whose gradient ``retain_grad()`` keeps."""
        return self.grad_fn is not None and bool(getattr(self.grad_fn, "retains_grad", False))

    def is_inference(self) -> bool:
        """False: this implementation has no inference tensors."""
        return False

    def is_shared(self) -> bool:
        """Whether the data is in memory shared between processes (see :meth:`share_memory_`)."""
        from mpitensor._core import shared as _shared  # noqa: PLC0415 - the base layer's shared arrays

        return _shared.is_shared(self._data)

    def share_memory_(self) -> Tensor:
        """Move the data into memory shared between processes, in place; return self.

        Afterwards, processes forked from this one, and processes this tensor reaches through
        ``multiprocessing`` (``Process`` arguments, ``Queue``, ``Pipe``; ``mpitensor.
        multiprocessing`` re-exports them) read and write the same values: one model trained
        by several processes at once (Hogwild!). Views taken before the call keep the old,
        private memory, so call it first, as torch programs do. See :mod:`mpitensor._core.shared`.

        Raises:
            RuntimeError: for a CuPy tensor (GPU memory is not shared this way).
        """
        from mpitensor._core import shared as _shared  # noqa: PLC0415

        x = self._data
        if self._view is not None and not _shared.is_shared(x):
            raise RuntimeError(
                "share_memory_(): this tensor is a view of another tensor's memory; call "
                "share_memory_() on the tensor that owns it, before taking views")
        if not isinstance(x, _ndarray):
            raise RuntimeError(
                "share_memory_(): this tensor is on a GPU (CuPy); only CPU tensors can be "
                "moved into shared memory here. Share it from the CPU (t.cpu().share_memory_()) "
                "or send it between processes through torch.distributed calls")
        if not _shared.is_shared(x):
            self._data = _shared.share(x)
        _shared.register_reductions(Tensor, type(self))
        return self

    def is_distributed(self) -> bool:
        """False (torch's answer for ordinary tensors too)."""
        return False

    def is_set_to(self, tensor: Tensor) -> bool:
        """True when ``tensor`` views the same memory with the same shape and strides."""
        x, y = self._data, tensor._data
        return (type(x) is type(y) and x.shape == y.shape and x.strides == y.strides
                and x.dtype == y.dtype and self.data_ptr() == tensor.data_ptr())

    # what a dense CPU/CUDA array never is
    is_sparse = is_sparse_csr = is_quantized = is_meta = is_mkldnn = is_nested = False
    is_vulkan = is_xpu = is_mps = is_ipu = is_xla = is_maia = is_mtia = False

    def new_empty_strided(self, size: Any, stride: Any, *, dtype: Any = None,
                          device: Any = None, requires_grad: bool = False, **kwargs: Any
                          ) -> Tensor:
        """Return an uninitialized tensor of ``size`` (the strides are NumPy's own: C
        order), with self's dtype and device unless given."""
        return self.new_empty(size, dtype=dtype, device=device, requires_grad=requires_grad)

    def is_floating_point(self) -> bool:
        """True for float16, bfloat16, float32 and float64 tensors."""
        return _dt.is_floating_dtype(self._data.dtype)

    def is_complex(self) -> bool:
        """True for complex64/128 tensors."""
        return self._data.dtype.kind == "c"

    # ---- conversion to Python ----------------------------------------------------------------

    def item(self) -> Any:
        """Return the value of a one-element tensor as a Python number.

        Raises:
            RuntimeError: the tensor does not have exactly one element.

        Example:
            >>> tensor([2.5]).item()
            2.5
        """
        x = self._data
        if x.size != 1:
            raise RuntimeError(
                f"a Tensor with {x.size} elements cannot be converted to Scalar; index one "
                f"element first or use .tolist()"
            )
        return x.item()

    def tolist(self) -> Any:
        """Return the elements as (nested) Python lists, or a number for a 0-d tensor."""
        return self._data.tolist()

    def __float__(self) -> float:
        return float(_check_one_element(self))

    def __int__(self) -> int:
        return int(_check_one_element(self))

    def __complex__(self) -> complex:
        return complex(_check_one_element(self))

    def __bool__(self) -> bool:
        x = self._data
        if x.size != 1:
            what = "no values" if x.size == 0 else "more than one value"
            raise RuntimeError(
                f"Boolean value of Tensor with {what} is ambiguous; use .any() or .all()"
            )
        return bool(x.item())

    def __index__(self) -> int:
        x = self._data
        if x.size != 1 or x.dtype.kind not in "iub":
            raise TypeError("only integer tensors of a single element can be converted to an index")
        return int(x.item())

    def __len__(self) -> int:
        x = self._data
        if x.ndim == 0:
            raise TypeError("len() of a 0-d tensor")
        return x.shape[0]

    def __iter__(self) -> Iterator[Tensor]:
        x = self._data
        if x.ndim == 0:
            raise TypeError("iteration over a 0-d tensor")
        return (self[i] for i in range(x.shape[0]))  # views, recorded where needed

    # Identity hash (C-level: autograd keys its per-backward tables by leaf tensors).
    __hash__ = object.__hash__

    # ---- array protocols ---------------------------------------------------------------------

    def numpy(self, *, force: bool = False) -> np.ndarray:
        """Return the data as a NumPy array, sharing memory (CPU tensors only unless ``force``).

        Args:
            force: copy a GPU tensor to the host instead of raising.

        Raises:
            TypeError: the tensor is on a GPU (use ``.cpu()`` first, or ``force=True``).
            RuntimeError: the tensor requires grad (use ``.detach().numpy()``).

        Example:
            >>> t = zeros(2); t.numpy()[0] = 1; t
            tensor([1., 0.])
        """
        x = self._data
        if isinstance(x, _ndarray):
            if isinstance(x, _backend.MetaArray):
                raise NotImplementedError(_backend._no_meta_values("numpy()"))
            if self._requires_grad and not force:
                raise RuntimeError(
                    "Can't call numpy() on Tensor that requires grad. "
                    "Use tensor.detach().numpy() instead."
                )
            return x
        if force:
            return x.get()
        raise TypeError(
            f"can't convert {device_str(x)} device type tensor to numpy. Use Tensor.cpu() to copy "
            f"the tensor to host memory first."
        )

    def __array__(self, dtype: Any = None, copy: Optional[bool] = None) -> np.ndarray:
        x = self._data
        if not isinstance(x, _ndarray):
            raise TypeError(
                f"can't convert {device_str(x)} device type tensor to numpy. Use Tensor.cpu() to "
                f"copy the tensor to host memory first."
            )
        if isinstance(x, _backend.MetaArray):  # np.asarray(t): a value read, as numpy()
            raise NotImplementedError(_backend._no_meta_values("numpy.asarray()"))
        if dtype is not None and np.dtype(dtype) != x.dtype:
            if copy is False:
                raise ValueError(
                    f"converting a {x.dtype} tensor to {np.dtype(dtype)} needs a copy, "
                    f"but copy=False was passed"
                )
            return x.astype(dtype)
        return x.copy() if copy else x

    @property
    def __cuda_array_interface__(self) -> dict:
        x = self._data
        if isinstance(x, _ndarray):
            raise AttributeError(
                "a CPU tensor has no __cuda_array_interface__; move it with .cuda() first"
            )
        return x.__cuda_array_interface__

    def __dlpack__(
        self,
        *,
        stream: Any = None,
        max_version: Any = None,
        dl_device: Any = None,
        copy: Optional[bool] = None,
    ) -> Any:
        kwargs = {}
        if stream is not None:
            kwargs["stream"] = stream
        if max_version is not None:
            kwargs["max_version"] = max_version
        if dl_device is not None:
            kwargs["dl_device"] = dl_device
        if copy is not None:
            kwargs["copy"] = copy
        return self._data.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> tuple:
        return self._data.__dlpack_device__()

    def __getstate__(self) -> dict:
        return {"data": self._data, "requires_grad": self._requires_grad, "grad": self.grad}

    def __setstate__(self, state: dict) -> None:
        self._data = state["data"]
        self._requires_grad = state.get("requires_grad", False)
        self.grad = state.get("grad")
        self.grad_fn = None
        self._vc = None
        self._view = None

    # ---- printing ----------------------------------------------------------------------------

    def __repr__(self) -> str:
        # a subclass (nn.Parameter) prints under its own name
        name = "tensor" if type(self) is Tensor else type(self).__name__
        return _printing.tensor_repr(self, name)

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        x = self._data
        if x.ndim == 0 and type(self) is Tensor:
            return x.item().__format__(spec)
        if spec:
            raise TypeError("unsupported format string passed to Tensor.__format__")
        return repr(self)

    # ---- in-place fills and copies ------------------------------------------------------------

    def copy_(self, src: Any, non_blocking: bool = False) -> Tensor:
        """Copy ``src`` (broadcast, cast and moved across devices as needed) into self.

        Recorded by autograd when self or ``src`` requires grad: the gradient goes to ``src``.

        Raises:
            RuntimeError: self is a leaf that requires grad (outside ``no_grad()``).

        Example:
            >>> t = zeros(3); _ = t.copy_(tensor([1, 2, 3])); t
            tensor([1., 2., 3.])
        """
        if _grad_mode.enabled and _autograd.inplace_recorded(self, "copy_()", src):
            return _autograd.apply_inplace(_Copy, "copy_()", self, src)
        _copy_into(self._data, src._data if isinstance(src, Tensor) else src)
        _autograd.bump_version(self)
        return self

    def fill_(self, value: Any) -> Tensor:
        """Set every element to ``value`` (a number or a one-element tensor); returns self.

        Raises:
            RuntimeError: self is a leaf that requires grad (outside ``no_grad()``).
        """
        return _fill(self, value, "fill_()")

    def zero_(self) -> Tensor:
        """Set every element to zero; returns self.

        Raises:
            RuntimeError: self is a leaf that requires grad (outside ``no_grad()``).
        """
        return _fill(self, 0, "zero_()")


def _map_into(t: Tensor, fn: Any, others: tuple, what: str) -> Tensor:
    """``apply_``/``map_``: every element replaced by ``fn(element, *matching others)``."""
    x = t._data
    if not isinstance(x, _ndarray):
        raise TypeError(f"{what} runs Python code per element and works on CPU tensors only")
    if t._requires_grad and _grad_mode.enabled:
        raise RuntimeError(f"{what} cannot be recorded by autograd; call it under "
                           f"mpitensor.no_grad() or on a detached tensor")
    arrays = [np.broadcast_to(o._data if isinstance(o, Tensor) else np.asarray(o), x.shape)
              for o in others]
    flat = [a.reshape(-1).tolist() for a in arrays]
    values = [fn(v, *(f[i] for f in flat)) for i, v in enumerate(x.reshape(-1).tolist())]
    x[...] = np.asarray(values, dtype=x.dtype).reshape(x.shape)
    _autograd.bump_version(t)
    return t


def _copy_into(x: Any, v: Any) -> None:
    """``x[...] = v``, with ``v`` broadcast, cast and moved to ``x``'s device."""
    if isinstance(x, _ndarray):
        if _backend.is_cupy_array(v):
            v = v.get()
        np.copyto(x, v, casting="unsafe")
    else:
        if not _backend.is_cupy_array(v):
            v = _move(np.asarray(v), _backend.device_of(x))
        _backend.get_cupy().copyto(x, v, casting="unsafe")


def _fill(t: Tensor, value: Any, what: str) -> Tensor:
    if _grad_mode.enabled and _autograd.inplace_recorded(t, what, value):
        return _autograd.apply_inplace(_Fill, what, t, value)
    if isinstance(value, Tensor):
        value = value.item()
    t._data.fill(value)
    _autograd.bump_version(t)
    return t


def _overwrite_grads(ctx: Any, g: Any, source_grad: Callable[[Any, Any], Any]) -> tuple:
    """The gradients of an in-place overwrite ``x.op_(source)``: zeros for ``x``'s old value,
    ``source_grad(ctx.meta, g)`` for the source (each None when not wanted)."""
    need = ctx.needs_input_grad
    return (_autograd._xp(g).zeros_like(g) if need[0] else None,
            source_grad(ctx.meta, g) if need[1] else None)


def _copy_source_grad(meta: tuple, g: Any) -> Any:
    """``copy_``'s source gradient: summed over its broadcast dimensions, in its dtype and on
    its device."""
    shape, dtype, src_device = meta
    gs = g if g.shape == shape else _autograd._sum_to(g, shape)
    gs = gs if gs.dtype == dtype else gs.astype(dtype)
    return gs if src_device is None else _move(gs, src_device)


def _fill_value_grad(meta: tuple, g: Any) -> Any:
    """``fill_``'s one-element value tensor gets the sum of the gradient."""
    shape, dtype = meta
    return g.sum().reshape(shape).astype(dtype, copy=False)


class _Copy(_autograd.ArrayFunction):
    """``x.copy_(src)``: ``src``'s gradient is the output's, summed over the dimensions it
    was broadcast along, in its dtype and on its device; ``x``'s old value gets zeros."""

    @staticmethod
    def forward_(ctx: Any, x: Any, src: Any) -> Any:
        if ctx.needs_input_grad and ctx.needs_input_grad[1]:
            dev = _backend.device_of(src)
            ctx.meta = (src.shape, src.dtype, None if dev == _backend.device_of(x) else dev)
        _copy_into(x, src)
        return x

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        return _overwrite_grads(ctx, g, _copy_source_grad)


class _Fill(_autograd.ArrayFunction):
    """``x.fill_(value)``: ``x``'s old value gets zeros; a tensor ``value`` gets the sum of
    the output's gradient."""

    @staticmethod
    def forward_(ctx: Any, x: Any, value: Any) -> Any:
        if hasattr(value, "shape"):
            if value.size != 1:
                raise RuntimeError(
                    f"fill_() takes a number or a one-element tensor, got a tensor of shape "
                    f"{list(value.shape)}"
                )
            ctx.meta = (value.shape, value.dtype)
            x[...] = value.reshape(())
        else:
            x.fill(value)
        return x

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        return _overwrite_grads(ctx, g, _fill_value_grad)


# --------------------------------------------------------------------------------------------
# How the op modules plug in (through mpitensor._core.opkit, the kit for writing an op)


_served: dict = {}


def _serve(names: dict) -> None:
    """Make ``names`` (name -> object) attributes of this module, for ``from mpitensor.tensor
    import zeros`` and the like (called by the modules that define them)."""
    _served.update(names)


def __getattr__(name: str) -> Any:
    # PEP 562: reached only for names not defined here. The ones served this way could not be
    # defined here: their modules import this one. sum/max/min/abs are among them, which also
    # keeps this module's own code seeing the builtins.
    try:
        return _served[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


def __dir__() -> list:
    return sorted(set(globals()) | set(_served))


# --------------------------------------------------------------------------------------------
# Questions about a tensor, as functions


def is_tensor(obj: Any) -> bool:
    """True when ``obj`` is a :class:`Tensor`."""
    return isinstance(obj, Tensor)


def numel(input: Tensor) -> int:  # noqa: A002
    """Return the number of elements of ``input``."""
    return input.numel()


def is_floating_point(input: Tensor) -> bool:  # noqa: A002
    """True when ``input`` has a float16/32/64 dtype."""
    return input.is_floating_point()


def is_complex(input: Tensor) -> bool:  # noqa: A002
    """True when ``input`` has a complex dtype."""
    return input.is_complex()


_autograd._bind_tensor(Tensor, _new)
