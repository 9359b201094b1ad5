"""Random numbers: :class:`Generator`, the global seed (``manual_seed``, ``seed``,
``initial_seed``, ``get_rng_state``/``set_rng_state``) and the random constructors (``rand``,
``randn``, ``randint``, ``randperm``, ``rand_like``, ``randn_like``).

CPU numbers come from a NumPy PCG64 generator. A CUDA device draws on the GPU from a CuPy
generator seeded with the same seed, made the first time that device asks, so CuPy is not
imported before it is needed. ``manual_seed`` also seeds CuPy's own global generator when
CuPy is already loaded.

Example:
    >>> import mpitensor as mt
    >>> _ = mt.manual_seed(0); a = mt.rand(2); _ = mt.manual_seed(0)
    >>> bool((a == mt.rand(2)).all())
    True
"""

from __future__ import annotations

import contextlib
import operator
import os
import sys
from typing import Any

import numpy as np

from mpitensor import autograd as _autograd
from mpitensor import backend as _backend
from mpitensor import dtypes as _dt
from mpitensor._core.devices import (
    DeviceLike,
    cuda_index,
    factory_device,
    is_cpu,
    move,
    parse_device,
)
from mpitensor._core.opkit import copy_into, serve, tensor_methods
from mpitensor._ops.create import (
    BadValueError,
    UnsupportedDtypeError,
    check_placement,
    dtype_or,
    finish,
    like_args,
    sizes,
    write_into,
)
from mpitensor.tensor import Tensor

__all__ = [
    "Generator", "default_generator", "manual_seed", "seed", "initial_seed", "get_rng_state",
    "set_rng_state", "rand", "randn", "randint", "randperm", "rand_like", "randn_like",
]

DTypeLike = Any

_INT64 = _dt.int64


def _fresh_seed() -> int:
    return int.from_bytes(os.urandom(8), "little") >> 1


class BadSeedError(TypeError, RuntimeError):
    """A seed that is not an int, where torch raises ``RuntimeError``: catchable as either."""


def check_seed(seed: Any) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise BadSeedError(f"seed must be an int, got {seed!r}")
    seed = int(seed)
    if not -(2**63) <= seed < 2**64:
        raise BadValueError(f"seed must fit in 64 bits ([-2**63, 2**64)), got {seed}")
    return seed & 0xFFFF_FFFF_FFFF_FFFF


class Generator:
    """A seeded source of random numbers for :func:`rand`, :func:`randn`, :func:`randperm`, ...

    CPU numbers come from a NumPy PCG64 generator; CUDA numbers from a CuPy generator seeded
    with the same seed (created on first use, so CuPy is not imported before it is needed).

    Example:
        >>> g = Generator().manual_seed(0)
        >>> bool((rand(3, generator=g) == rand(3, generator=Generator().manual_seed(0))).all())
        True
    """

    # _cuda_seed: None, or the seed of the GPU states made inside mpitensor.random.fork_rng
    __slots__ = ("device", "_seed", "_rng", "_cuda", "_cuda_seed")

    def __init__(self, device: DeviceLike = "cpu") -> None:
        self.device = parse_device(device) or _backend.CPU
        self._cuda: dict = {}
        self._reseed(_fresh_seed())

    def _reseed(self, seed: int) -> None:
        self._seed = seed
        self._rng = np.random.default_rng(seed)
        self._cuda = {}
        self._cuda_seed = None

    def manual_seed(self, seed: int) -> Generator:
        """Seed the generator (any 64-bit int) and return it.

        Raises:
            TypeError: ``seed`` is not an int.
        """
        self._reseed(check_seed(seed))
        return self

    def seed(self) -> int:
        """Seed from OS entropy and return the seed used."""
        s = _fresh_seed()
        self._reseed(s)
        return s

    def initial_seed(self) -> int:
        """Return the seed last set."""
        return self._seed

    def get_state(self) -> dict:
        """Return the CPU state (a picklable dict) for :meth:`set_state`."""
        return {"seed": self._seed, "bit_generator": self._rng.bit_generator.state}

    def set_state(self, state: dict) -> Generator:
        """Restore a state from :meth:`get_state` and return self.

        Raises:
            TypeError: ``state`` is not such a dict.
        """
        if not isinstance(state, dict) or "bit_generator" not in state:
            raise TypeError("set_state() takes a dict returned by Generator.get_state()")
        self._reseed(int(state.get("seed", self._seed)))
        self._rng.bit_generator.state = state["bit_generator"]
        return self

    def _cupy_state(self, dev: _backend.device) -> Any:
        cp = _backend.get_cupy()
        idx = cuda_index(dev)
        rs = self._cuda.get(idx)
        if rs is None:
            with cp.cuda.Device(idx):
                rs = cp.random.RandomState(self._seed if self._cuda_seed is None
                                           else self._cuda_seed)
            self._cuda[idx] = rs
        return rs

    def __repr__(self) -> str:
        return f"<mpitensor.Generator device='{self.device}' initial_seed={self._seed}>"


default_generator = Generator()


def manual_seed(seed: int) -> Generator:
    """Seed the default generator (CPU, and CUDA through CuPy), like ``torch.manual_seed``.

    Args:
        seed: any int that fits in 64 bits.

    Returns:
        The default :class:`Generator`.

    Raises:
        TypeError: ``seed`` is not an int.

    Example:
        >>> _ = manual_seed(0); a = rand(2); _ = manual_seed(0); bool((a == rand(2)).all())
        True
    """
    seed = check_seed(seed)
    default_generator._reseed(seed)
    cp = sys.modules.get("cupy")  # seed CuPy's own global generator only if it is loaded
    if cp is not None:
        with contextlib.suppress(Exception):  # CuPy present but no usable device
            cp.random.seed(seed)
    return default_generator


def seed() -> int:
    """Seed the default generator from OS entropy and return the seed."""
    return default_generator.seed()


def initial_seed() -> int:
    """Return the default generator's seed."""
    return default_generator.initial_seed()


def get_rng_state() -> dict:
    """Return the default generator's CPU state (see :meth:`Generator.get_state`)."""
    return default_generator.get_state()


def set_rng_state(new_state: dict) -> None:
    """Restore the default generator's CPU state from :func:`get_rng_state`."""
    default_generator.set_state(new_state)


def _gen(generator: Any) -> Any:
    if generator is None:
        return default_generator
    if isinstance(generator, (Generator, np.random.Generator)):
        return generator
    raise TypeError(
        f"generator must be a mpitensor.Generator or a numpy.random.Generator, got {generator!r}"
    )


class _CupyDraws:
    """A CuPy ``RandomState`` seen through the calls of NumPy's ``Generator`` used here, so
    that one piece of code draws on either side."""

    __slots__ = ("rs",)

    def __init__(self, rs: Any) -> None:
        self.rs = rs

    def random(self, shape: tuple, dtype: Any) -> Any:
        return self.rs.random_sample(size=shape, dtype=dtype)

    def standard_normal(self, shape: tuple, dtype: Any) -> Any:
        return self.rs.standard_normal(size=shape, dtype=dtype)

    def integers(self, low: int, high: int, size: tuple, dtype: Any) -> Any:
        return self.rs.randint(low, high, size=size, dtype=dtype)

    def permutation(self, n: int) -> Any:
        return self.rs.permutation(n)

    def poisson(self, lam: Any, size: Any = None) -> Any:
        return self.rs.poisson(lam, size=size)


class _MetaDraws:
    """The draws of :class:`_CupyDraws` on the meta device: arrays of the shape and dtype asked
    for, and no numbers drawn."""

    def random(self, shape: tuple, dtype: Any = np.float64) -> Any:
        return _backend.meta_array(_dims(shape), dtype)

    standard_normal = random

    def integers(self, low: int, high: int, size: tuple, dtype: Any = np.int64) -> Any:
        return _backend.meta_array(_dims(size), dtype)

    def permutation(self, n: int) -> Any:
        return _backend.meta_array((n,), np.int64)

    def poisson(self, lam: Any, size: Any = None) -> Any:
        return _backend.meta_array(np.shape(lam) if size is None else _dims(size), np.int64)


def _dims(shape: Any) -> tuple:
    return (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(shape)


def _drawn(generator: Any, device: Any, draw: Any, meta: Any = None) -> Any:
    """``draw(rng)`` on the generator's side, the result on ``device``: a mpitensor generator
    draws on the GPU for a CUDA device (its CuPy state there), anything else on the host. On
    the meta device, given the result's ``meta = (shape, dtype)``, nothing is drawn (as in
    torch: the generator's state is left alone)."""
    dev = factory_device(device)
    if dev is not None and dev.type == "meta":
        return _backend.meta_array(*meta) if meta is not None else draw(_MetaDraws())
    gen = _gen(generator)
    if not is_cpu(dev) and isinstance(gen, Generator):
        rs = gen._cupy_state(dev)
        with _backend.get_cupy().cuda.Device(cuda_index(dev)):
            return draw(_CupyDraws(rs))
    return move(draw(gen._rng if isinstance(gen, Generator) else gen), dev)


def _floats(rng: Any, kind: str, shape: tuple, dt: np.dtype) -> Any:
    """Uniform (``kind`` "rand") or standard normal numbers of dtype ``dt`` from ``rng``.

    float16 is drawn as float32 and rounded; complex normals get real and imaginary parts each
    of variance 1/2, as in torch.
    """
    fdt = _dt.float64 if dt in (_dt.float64, _dt.complex128) else _dt.float32
    if kind == "rand":
        return rng.random(shape, fdt).astype(dt, copy=False)
    if dt.kind == "c":
        re = rng.standard_normal(shape, fdt)
        im = rng.standard_normal(shape, fdt)
        return ((re + 1j * im) * np.sqrt(0.5)).astype(dt)
    return rng.standard_normal(shape, fdt).astype(dt, copy=False)


def _draw(kind: str, shape: tuple, generator: Any, dt: np.dtype, device: Any) -> Any:
    """An array of ``rand`` (``kind`` "rand") or ``randn`` numbers (see :func:`_floats`)."""
    return _drawn(generator, device, lambda rng: _floats(rng, kind, shape, dt), (shape, dt))


def _float_dtype(dtype: Any, fname: str, allow_complex: bool) -> np.dtype:
    dt = dtype_or(dtype, _dt.get_default_dtype())
    if not _dt.is_floating_dtype(dt) and not (allow_complex and dt.kind == "c"):
        raise UnsupportedDtypeError(
            f"{fname}() needs a floating point dtype{' or complex' if allow_complex else ''}, "
            f"got {_dt.dt_repr(dt)}"
        )
    return dt


def _random_fill(kind: str, shape: tuple, generator: Any, out: Any, dtype: Any,
                 layout: Any, device: Any, requires_grad: bool, pin_memory: bool) -> Tensor:
    """:func:`rand` or :func:`randn` (``kind``) after their arguments are read."""
    check_placement(kind, layout, None, pin_memory)
    if out is not None and isinstance(out, Tensor):
        dtype = out.dtype if dtype is None else dtype
        device = _device_of_tensor(out) if device is None else device
    dt = _float_dtype(dtype, kind, allow_complex=kind == "randn")
    arr = _draw(kind, shape, generator, dt, device)
    return finish(arr, requires_grad) if out is None else write_into(out, arr, kind)


def _sized_draw(kind: str, doc: str) -> Any:
    """The public function ``kind`` (``rand``, ``randn``): a tensor of the given sizes filled
    by :func:`_random_fill`, with torch's arguments."""

    def draw(*sizes_: Any, generator: Any = None, out: Any = None, dtype: DTypeLike = None,
             layout: Any = None, device: DeviceLike = None, requires_grad: bool = False,
             pin_memory: bool = False, size: Any = None) -> Tensor:
        return _random_fill(kind, sizes(sizes_, size, kind), generator, out, dtype, layout,
                            device, requires_grad, pin_memory)

    draw.__name__ = draw.__qualname__ = kind
    draw.__doc__ = doc
    return draw


rand = _sized_draw("rand", """Make a tensor of uniform random numbers in ``[0, 1)``.

    Args:
        sizes_: ints or one tuple/list/Size (or ``size=``).
        generator: a :class:`Generator` or ``numpy.random.Generator`` (default: the global one,
            seeded by :func:`manual_seed`).
        out: a tensor to write into (its dtype is then the default).
        dtype: a float dtype (default float32).
        layout, device, requires_grad, pin_memory: as in :func:`zeros`.

    Raises:
        UnsupportedDtypeError: (a ``TypeError`` and ``NotImplementedError``) a non-float
            dtype.

    Example:
        >>> _ = manual_seed(0); float(rand(1)) < 1.0
        True
    """)

randn = _sized_draw("randn", """Make a tensor of standard normal random numbers (arguments as in
    :func:`rand`).

    Complex dtypes get real and imaginary parts each with variance 1/2, as in torch.

    Example:
        >>> randn(2, 3).shape
        mpitensor.Size([2, 3])
    """)


def _bound(v: Any, what: str) -> int:
    """A bound of :func:`randint`: an int (a float is refused, as in torch).

    Raises:
        TypeError: not an int.
    """
    try:
        return operator.index(v)
    except TypeError:
        raise TypeError(f"randint(): {what} must be an int, got {v!r}") from None


_UNSET = object()


def randint(*args: Any, low: Any = _UNSET, high: Any = _UNSET, size: Any = None,
            generator: Any = None, out: Any = None, dtype: DTypeLike = None, layout: Any = None,
            device: DeviceLike = None, requires_grad: bool = False,
            pin_memory: bool = False) -> Tensor:
    """Make random integers in ``[low, high)`` (``low`` defaults to 0), with torch's overloads:
    ``randint(high, size)``, ``randint(low, high, size)``, and any of ``low``, ``high``,
    ``size`` given by keyword instead.

    Args:
        low, high: the bounds (ints).
        size: a tuple, list or Size (not a bare int, as in torch).
        generator, out, layout, device, requires_grad, pin_memory: as in :func:`rand`.
        dtype: the result's dtype (default int64; a float dtype may require grad).

    Raises:
        TypeError: missing ``high`` or ``size``, too many arguments, or a size that is not a
            sequence.
        BadValueError: (a ``ValueError`` and ``RuntimeError``) ``high <= low``.

    Example:
        >>> randint(0, 10, (3,)).dtype
        dtype('int64')
        >>> randint(3, size=(4,)).shape
        mpitensor.Size([4])
    """
    pos = list(args)
    if size is None:
        if not pos:
            raise TypeError("randint() needs a size, e.g. randint(10, (3,))")
        size = pos.pop()
    if len(pos) > 2:
        raise TypeError(f"randint() takes at most (low, high, size) positionally, got "
                        f"{len(args)} arguments")
    if len(pos) == 2:
        if low is not _UNSET or high is not _UNSET:
            raise TypeError("randint(): low/high given both positionally and by keyword")
        low, high = pos
    elif len(pos) == 1:
        if high is not _UNSET:
            if low is not _UNSET:
                raise TypeError("randint(): too many bounds")
            low = pos[0]
        else:
            if low is not _UNSET:
                raise TypeError("randint(): low given both positionally and by keyword")
            high = pos[0]
    if high is _UNSET:
        raise TypeError("randint() needs high, e.g. randint(10, (3,))")
    low = 0 if low is _UNSET else _bound(low, "low")
    high = _bound(high, "high")
    if not isinstance(size, (tuple, list)):
        raise TypeError(f"randint(): size must be a tuple of ints, got {size!r}")
    shape = sizes((size,), None, "randint")
    check_placement("randint", layout, None, pin_memory)
    if high <= low:
        raise BadValueError(f"randint(): expected low < high, got low={low}, high={high}")
    if out is not None and isinstance(out, Tensor):
        dtype = out.dtype if dtype is None else dtype
        device = _device_of_tensor(out) if device is None else device
    dt = dtype_or(dtype, _INT64)
    arr = _drawn(generator, device, lambda rng: rng.integers(low, high, shape, np.int64),
                 (shape, np.int64))
    arr = arr.astype(dt, copy=False)
    return finish(arr, requires_grad) if out is None else write_into(out, arr, "randint")


def randperm(n: int, *, generator: Any = None, out: Any = None, dtype: DTypeLike = None,
             layout: Any = None, device: DeviceLike = None, requires_grad: bool = False,
             pin_memory: bool = False) -> Tensor:
    """Make a random permutation of ``0 .. n-1`` (int64 by default; arguments as in
    :func:`rand`).

    Raises:
        BadValueError: (a ``ValueError`` and ``RuntimeError``) ``n`` is negative.

    Example:
        >>> sorted(randperm(4).tolist())
        [0, 1, 2, 3]
    """
    n = operator.index(n)
    if n < 0:
        raise BadValueError(f"randperm(): n must be non-negative, got {n}")
    check_placement("randperm", layout, None, pin_memory)
    if out is not None and isinstance(out, Tensor):
        dtype = out.dtype if dtype is None else dtype
        device = _device_of_tensor(out) if device is None else device
    dt = dtype_or(dtype, _INT64)
    arr = _drawn(generator, device, lambda rng: rng.permutation(n), ((n,), dt))
    arr = arr if _backend.is_meta_array(arr) else arr.astype(dt)
    return finish(arr, requires_grad) if out is None else write_into(out, arr, "randperm")


def _draw_like(kind: str, kinds: str, doc: str) -> Any:
    """The public function ``{kind}_like``: random numbers of ``kind`` with the shape (dtype,
    device) of ``input``, whose dtype must be of one of the NumPy ``kinds``."""
    name = f"{kind}_like"

    def draw(input: Any, *, generator: Any = None, dtype: DTypeLike = None,  # noqa: A002
             layout: Any = None, device: DeviceLike = None, requires_grad: bool = False,
             memory_format: Any = None, pin_memory: bool = False) -> Tensor:
        check_placement(name, layout, memory_format, pin_memory)
        shape, dt, dev = like_args(input, dtype, device)
        if _dt.kind_of(dt) not in kinds:
            raise UnsupportedDtypeError(f"{name}() needs a floating point dtype, got "
                                        f"{_dt.dt_repr(dt)}")
        return finish(_draw(kind, shape, generator, dt, dev), requires_grad)

    draw.__name__ = draw.__qualname__ = name
    draw.__doc__ = doc
    return draw


rand_like = _draw_like("rand", "f", """Make uniform random numbers with the shape (dtype, device) of
    ``input``.

    Raises:
        UnsupportedDtypeError: (a ``TypeError`` and ``NotImplementedError``) the dtype is not
            floating point.

    Example:
        >>> import mpitensor as mt
        >>> rand_like(mt.zeros(2, 2)).shape
        mpitensor.Size([2, 2])
    """)

randn_like = _draw_like("randn", "fc", """Make standard normal numbers with the shape (dtype,
    device) of ``input``.

    Raises:
        UnsupportedDtypeError: (a ``TypeError`` and ``NotImplementedError``) the dtype is
            neither floating point nor complex.

    Example:
        >>> import mpitensor as mt
        >>> randn_like(mt.zeros(3)).dtype
        dtype('float32')
    """)


# --------------------------------------------------------------------------------------------
# In-place random fills and sampling from tensors of parameters


def _device_of_tensor(t: Tensor) -> Any:
    return _backend.device_of(t._data)


def _uniform01(t: Tensor, generator: Any) -> Any:
    """Uniform numbers in [0, 1) shaped like ``t``, in float64 for float64 tensors and in
    float32 otherwise, on ``t``'s device."""
    x = t._data
    fdt = _dt.float64 if x.dtype in (_dt.float64, _dt.complex128, _dt.int64) else _dt.float32
    return _drawn(generator, _device_of_tensor(t), lambda rng: rng.random(x.shape, fdt))


def _normal01(t: Tensor, generator: Any) -> Any:
    x = t._data
    fdt = _dt.float64 if x.dtype == _dt.float64 else _dt.float32
    return _drawn(generator, _device_of_tensor(t),
                  lambda rng: rng.standard_normal(x.shape, fdt))


class _Overwrite(_autograd.ArrayFunction):
    """A tensor's elements replaced by ``values`` (a random fill): the old value gets a zero
    gradient, as in torch."""

    @staticmethod
    def forward_(ctx: Any, x: Any, values: Any) -> Any:
        copy_into(x, values)
        return x

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        return _autograd._xp(g).zeros_like(g), None


def _fill_with(t: Tensor, values: Any, what: str) -> Tensor:
    """Write ``values`` (an array shaped like ``t``) into ``t``: an in-place write, recorded
    by autograd where needed."""
    if _autograd._mode.enabled and _autograd.inplace_recorded(t, what):
        return _autograd.apply_inplace(_Overwrite, what, t, values)
    copy_into(t._data, values)
    _autograd.bump_version(t)
    return t


def _floating_only(t: Tensor, what: str) -> None:
    if _dt.kind_of(t._data.dtype) != "f":
        raise UnsupportedDtypeError(f"{what} needs a floating point tensor, got "
                        f"{_dt.dt_repr(t._data.dtype)}")


def _positive_scale(t: Tensor, what: str, name: str, value: Any) -> None:
    """The checks of a fill drawn with a scale: ``t`` floating, ``value`` (``name``) > 0."""
    _floating_only(t, what)
    if not value > 0:
        raise BadValueError(f"{what}: {name} must be > 0, got {value}")


def _prob(p: Any, t: Tensor) -> Any:
    if isinstance(p, Tensor):
        p = p._data.astype(_dt.float64)
        if bool(((p < 0) | (p > 1) | (p != p)).any()):
            raise BadValueError("expected probabilities in [0, 1]")
        return p
    p = float(p)
    if not 0.0 <= p <= 1.0:
        raise BadValueError(f"expected a probability in [0, 1], got {p}")
    return p


def _random_bounds(t: Tensor, frm: int, to: Any) -> tuple:
    """``random_``'s range ``[frm, to)``; by default every integer the dtype holds exactly
    (``[0, 2**mantissa]`` for floats, as torch)."""
    dt = t._data.dtype
    if to is None:
        if dt.kind == "b":
            to = 2
        elif dt.kind in "iu":
            to = int(np.iinfo(dt).max) + 1
        else:  # the significand's digits: every integer up to 2**digits is exact
            digits = 8 if dt == _dt.bfloat16 else {8: 53, 4: 24, 2: 11}[dt.itemsize]
            to = 2 ** digits + 1
    if to <= frm:
        raise BadValueError(f"random_(): expected from < to, got from={frm}, to={to}")
    return frm, to


@tensor_methods
class _RandomMethods:
    def normal_(self, mean: float = 0.0, std: float = 1.0, *, generator: Any = None) -> Tensor:
        """Fill with normal numbers of mean ``mean`` and standard deviation ``std``; returns
        self.

        Raises:
            TypeError: not a floating point tensor.
        """
        _floating_only(self, "normal_()")
        if std < 0:
            raise BadValueError(f"normal_(): std must be >= 0, got {std}")
        return _fill_with(self, mean + std * _normal01(self, generator), "normal_()")

    def uniform_(self, from_: float = 0.0, to: float = 1.0, *, generator: Any = None,
                 **kwargs: Any) -> Tensor:
        """Fill with uniform numbers in ``[from, to)``; returns self."""
        from_ = kwargs.pop("from", from_)
        if kwargs:
            raise TypeError(f"uniform_() got unexpected arguments {sorted(kwargs)}")
        _floating_only(self, "uniform_()")
        if from_ > to:
            raise BadValueError(f"uniform_(): expected from <= to, got from={from_}, to={to}")
        return _fill_with(self, from_ + (to - from_) * _uniform01(self, generator),
                          "uniform_()")

    def bernoulli_(self, p: Any = 0.5, *, generator: Any = None) -> Tensor:
        """Fill with 1 (probability ``p``, a number or a tensor) or 0; returns self."""
        return _fill_with(self, _uniform01(self, generator) < _prob(p, self), "bernoulli_()")

    def random_(self, from_: int = 0, to: Any = None, *, generator: Any = None,
                **kwargs: Any) -> Tensor:
        """Fill with random integers in ``[from, to)``; ``random_(to)`` means ``[0, to)``;
        without bounds, every integer the dtype holds exactly."""
        from_ = kwargs.pop("from", from_)
        if kwargs:
            raise TypeError(f"random_() got unexpected arguments {sorted(kwargs)}")
        if to is None and from_ != 0:
            from_, to = 0, from_
        lo, hi = _random_bounds(self, operator.index(from_), to)
        shape = self._data.shape
        hi = min(hi, 2 ** 63)  # drawn as int64
        arr = _drawn(generator, _device_of_tensor(self),
                     lambda rng: rng.integers(lo, hi, shape, np.int64))
        return _fill_with(self, arr, "random_()")

    def exponential_(self, lambd: float = 1.0, *, generator: Any = None) -> Tensor:
        """Fill with exponential numbers of rate ``lambd``; returns self."""
        _positive_scale(self, "exponential_()", "lambd", lambd)
        u = _uniform01(self, generator)
        return _fill_with(self, -_backend.array_module(u).log1p(-u) / lambd, "exponential_()")

    def geometric_(self, p: float, *, generator: Any = None) -> Tensor:
        """Fill with the number of trials up to the first success of probability ``p``
        (1, 2, ...); returns self."""
        p = float(p)
        if not 0.0 < p < 1.0:
            raise BadValueError(f"geometric_(): expected 0 < p < 1, got {p}")
        u = _uniform01(self, generator)
        m = _backend.array_module(u)
        with np.errstate(all="ignore"):
            k = m.maximum(m.ceil(m.log1p(-u) / np.log1p(-p)), 1)
        return _fill_with(self, k, "geometric_()")

    def cauchy_(self, median: float = 0.0, sigma: float = 1.0, *,
                generator: Any = None) -> Tensor:
        """Fill with Cauchy numbers of location ``median`` and scale ``sigma``; returns self."""
        _positive_scale(self, "cauchy_()", "sigma", sigma)
        u = _uniform01(self, generator)
        return _fill_with(self, median + sigma * _backend.array_module(u).tan(np.pi * (u - 0.5)),
                          "cauchy_()")

    def bernoulli(self, p: Any = None, *, generator: Any = None) -> Tensor:
        """Return 1 or 0 per element, 1 with the probability the element holds (or ``p``)."""
        return bernoulli(self, p, generator=generator)

    def multinomial(self, num_samples: int, replacement: bool = False, *,
                    generator: Any = None) -> Tensor:
        """Draw category indices from these weights (see :func:`multinomial`)."""
        return multinomial(self, num_samples, replacement, generator=generator)

    def log_normal_(self, mean: float = 1.0, std: float = 2.0, *,
                    generator: Any = None) -> Tensor:
        """Fill with ``exp(N(mean, std))`` numbers; returns self."""
        _positive_scale(self, "log_normal_()", "std", std)
        z = _normal01(self, generator)
        return _fill_with(self, _backend.array_module(z).exp(mean + std * z), "log_normal_()")


def bernoulli(input: Tensor, p: Any = None, *, generator: Any = None) -> Tensor:  # noqa: A002
    """Return 1 or 0 per element, 1 with the probability the element holds (or ``p``), in
    ``input``'s dtype.

    Example:
        >>> import mpitensor as mt
        >>> mt.bernoulli(mt.zeros(3)).tolist()
        [0.0, 0.0, 0.0]
    """
    probs = input._data
    p = _prob(input if p is None else p, input)
    u = _uniform01(input, generator)
    return Tensor._wrap((u < p).astype(probs.dtype))


def multinomial(input: Tensor, num_samples: int, replacement: bool = False, *,  # noqa: A002
                generator: Any = None) -> Tensor:
    """Draw ``num_samples`` category indices per row of the weights ``input`` (1-D or 2-D,
    non-negative, not necessarily summing to 1), with or without replacement.

    Raises:
        BadValueError: (a ``ValueError`` and ``RuntimeError``) negative or all-zero
            weights, or more samples than non-zero categories without replacement.

    Example:
        >>> import mpitensor as mt
        >>> mt.multinomial(mt.tensor([0.0, 1.0]), 2, replacement=True).tolist()
        [1, 1]
    """
    w = input._data
    if w.ndim not in (1, 2):
        raise BadValueError(f"multinomial(): expected 1-D or 2-D weights, got {w.ndim} dimensions")
    n = operator.index(num_samples)
    w2 = w.reshape(1, -1) if w.ndim == 1 else w
    m = _backend.array_module(w2)
    w2 = w2.astype(_dt.float64)
    if n <= 0:
        raise BadValueError(f"multinomial(): num_samples must be positive, got {n}")
    if bool((w2 < 0).any()) or not bool(m.isfinite(w2).all()):
        raise BadValueError("multinomial(): weights must be finite and non-negative")
    total = w2.sum(axis=1, keepdims=True)
    if bool((total <= 0).any()):
        raise BadValueError("multinomial(): each row of weights must have a positive sum")
    rows, k = w2.shape
    dev = _backend.device_of(w2)
    if not replacement:
        if n > int((w2 > 0).sum(axis=1).min()):
            raise BadValueError(f"multinomial(): cannot draw {n} samples without replacement from "
                             f"fewer non-zero categories")
        u = _drawn(generator, dev, lambda rng: rng.random((rows, k), _dt.float64))
        with np.errstate(divide="ignore"):  # Gumbel top-k: log w + Gumbel noise
            keys = m.log(w2) - m.log(-m.log1p(-u))
        out = m.argsort(-keys, axis=1)[:, :n]
    else:
        cdf = m.cumsum(w2 / total, axis=1)
        u = _drawn(generator, dev, lambda rng: rng.random((rows, n), _dt.float64))
        # every row shifted by its number: one search over all rows at once
        shift = m.arange(rows, dtype=_dt.float64)[:, None] * 2.0
        pos = m.searchsorted((cdf + shift).reshape(-1), (u + shift).reshape(-1), side="right")
        out = m.minimum(pos.reshape(rows, n) - m.arange(rows)[:, None] * k, k - 1)
    out = out.astype(_INT64)
    return Tensor._wrap(out.reshape(-1) if w.ndim == 1 else out)


def normal(mean: Any = 0.0, std: Any = 1.0, size: Any = None, *, generator: Any = None,
           out: Any = None, dtype: DTypeLike = None, layout: Any = None,
           device: DeviceLike = None, pin_memory: bool = False,
           requires_grad: bool = False) -> Tensor:
    """Draw normal numbers, with torch's four overloads: ``normal(mean_tensor, std_tensor)``,
    ``normal(mean_tensor, std=1.0)`` and ``normal(mean, std_tensor)`` draw one number per
    element of the broadcast shape (in the dtype of ``mean`` if it is a tensor, else of
    ``std``; tensor arguments get a zero gradient, as in torch); ``normal(mean, std, size)``
    with two
    numbers draws ``size`` of them (``dtype``, ``layout``, ``device``, ``pin_memory``,
    ``requires_grad`` as in :func:`rand`, and only there).

    Raises:
        TypeError: two numbers without ``size``, or ``size``/``dtype``/... beside a tensor.
        UnsupportedDtypeError: (a ``TypeError`` and ``NotImplementedError``) a tensor that
            is not floating point.
        BadValueError: (a ``ValueError`` and ``RuntimeError``) a negative ``std``.

    Example:
        >>> import mpitensor as mt
        >>> mt.normal(mt.zeros(2, 3), 1.0).shape
        mpitensor.Size([2, 3])
        >>> mt.normal(0.0, 1.0, (4,)).dtype
        dtype('float32')
    """
    mt_, st_ = isinstance(mean, Tensor), isinstance(std, Tensor)
    if not mt_ and not st_:
        if size is None:
            raise TypeError("normal(): with a number mean and std, pass a size, e.g. "
                            "normal(0.0, 1.0, (3,))")
        mean, std = float(mean), float(std)
        if std < 0:
            raise BadValueError(f"normal(): std must be >= 0, got {std}")
        shape = sizes((size,) if isinstance(size, (tuple, list)) else (size,), None, "normal")
        check_placement("normal", layout, None, pin_memory)
        if out is not None and isinstance(out, Tensor):
            dtype = out.dtype if dtype is None else dtype
            device = _device_of_tensor(out) if device is None else device
        dt = _float_dtype(dtype, "normal", allow_complex=False)
        arr = _draw("randn", shape, generator, dt, device)
        arr = (arr * std + mean).astype(dt, copy=False)
        return finish(arr, requires_grad) if out is None else write_into(out, arr, "normal")
    extra = [k for k, v in (("size", size), ("dtype", dtype), ("layout", layout),
                            ("device", device)) if v is not None]
    if extra or requires_grad or pin_memory:
        raise TypeError(f"normal(): with a tensor mean or std, {extra or 'requires_grad'} "
                        f"cannot be given; the result takes the tensor's shape and dtype")
    ref = mean if mt_ else std
    dt = ref._data.dtype
    for t in (mean, std):
        if isinstance(t, Tensor) and _dt.kind_of(t._data.dtype) != "f":
            raise UnsupportedDtypeError(f"normal() needs floating point tensors, got "
                                        f"{_dt.dt_repr(t._data.dtype)}")
    if bool((std._data < 0).any()) if st_ else float(std) < 0:
        raise BadValueError("normal(): std must be >= 0")
    shape = tuple(np.broadcast_shapes(tuple(mean.shape) if mt_ else (),
                                      tuple(std.shape) if st_ else ()))
    z = _draw("randn", shape, generator, dt, _backend.device_of(ref._data))
    vals = (z * (std._data if st_ else std) + (mean._data if mt_ else mean)).astype(dt)
    if out is not None:
        return write_into(out, vals, "normal")
    return _DrawnWith.apply(mean, std, vals)


class _DrawnWith(_autograd.ArrayFunction):
    """Numbers drawn with tensor parameters: like torch, the parameters get a zero gradient
    (the draw is not reparameterized; write ``mean + std * randn_like(mean)`` for that)."""

    @staticmethod
    def forward(ctx: Any, mean: Any, std: Any, values: Any) -> Any:
        ctx.shapes = (getattr(mean, "shape", None), getattr(std, "shape", None))
        return values

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        xp = _autograd._xp(g)
        return (*(None if s is None else xp.zeros(s, dtype=g.dtype) for s in ctx.shapes),
                None)


def poisson(input: Tensor, generator: Any = None) -> Tensor:  # noqa: A002
    """Draw a Poisson number per element, of rate the element holds (``input``'s dtype)."""
    lam = input._data
    out = _drawn(generator, _backend.device_of(lam), lambda rng: rng.poisson(lam, lam.shape))
    return Tensor._wrap(out.astype(lam.dtype))


def randint_like(input: Tensor, low: int = 0, high: Any = None, *,  # noqa: A002
                 generator: Any = None, dtype: DTypeLike = None, layout: Any = None,
                 device: DeviceLike = None, requires_grad: bool = False,
                 memory_format: Any = None, pin_memory: bool = False) -> Tensor:
    """Random integers in ``[low, high)`` with the shape (dtype, device) of ``input``;
    ``randint_like(x, high)`` means ``[0, high)``; other arguments as in :func:`rand_like`.

    Raises:
        TypeError: a bound that is not an int.
        BadValueError: (a ``ValueError`` and ``RuntimeError``) ``high <= low``.

    Example:
        >>> import mpitensor as mt
        >>> randint_like(mt.zeros(3, dtype=mt.int32), 5).dtype
        dtype('int32')
    """
    if high is None:
        low, high = 0, low
    check_placement("randint_like", layout, memory_format, pin_memory)
    shape, dt, dev = like_args(input, dtype, device)
    low, high = _bound(low, "low"), _bound(high, "high")
    if high <= low:
        raise BadValueError(f"randint_like(): expected low < high, got low={low}, high={high}")
    arr = _drawn(generator, dev, lambda rng: rng.integers(low, high, shape, np.int64))
    return finish(arr.astype(dt, copy=False), requires_grad)


# nn.functional draws dropout masks with it, under its old name
serve({**{name: globals()[name] for name in __all__}, "_random": _draw,
           **{name: globals()[name] for name in ("bernoulli", "multinomial", "normal",
                                                  "poisson", "randint_like")}})
