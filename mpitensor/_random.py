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

from mpitensor import backend as _backend
from mpitensor import dtypes as _dt
from mpitensor import tensor as _t
from mpitensor._creation import dtype_or, finish, like_args
from mpitensor._devices import DeviceLike, cuda_index, is_cpu, move, parse_device
from mpitensor._dims import size_from
from mpitensor.tensor import Tensor

__all__ = [
    "Generator", "default_generator", "manual_seed", "seed", "initial_seed", "get_rng_state",
    "set_rng_state", "rand", "randn", "randint", "randperm", "rand_like", "randn_like",
]

DTypeLike = Any

_INT64 = _dt.int64


def _fresh_seed() -> int:
    return int.from_bytes(os.urandom(8), "little") >> 1


def _check_seed(seed: Any) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed must be an int, got {seed!r}")
    seed = int(seed)
    if not -(2**63) <= seed < 2**64:
        raise ValueError(f"seed must fit in 64 bits ([-2**63, 2**64)), got {seed}")
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

    __slots__ = ("device", "_seed", "_rng", "_cuda")

    def __init__(self, device: DeviceLike = "cpu") -> None:
        self.device = parse_device(device) or _backend.CPU
        self._cuda: dict = {}
        self._reseed(_fresh_seed())

    def _reseed(self, seed: int) -> None:
        self._seed = seed
        self._rng = np.random.default_rng(seed)
        self._cuda = {}

    def manual_seed(self, seed: int) -> Generator:
        """Seed the generator (any 64-bit int) and return it.

        Raises:
            TypeError: ``seed`` is not an int.
        """
        self._reseed(_check_seed(seed))
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
                rs = cp.random.RandomState(self._seed)
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
    seed = _check_seed(seed)
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


def _drawn(generator: Any, device: Any, draw: Any) -> Any:
    """``draw(rng)`` on the generator's side, the result on ``device``: a mpitensor generator
    draws on the GPU for a CUDA device (its CuPy state there), anything else on the host."""
    dev = parse_device(device)
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
    return _drawn(generator, device, lambda rng: _floats(rng, kind, shape, dt))


def _float_dtype(dtype: Any, fname: str, allow_complex: bool) -> np.dtype:
    dt = dtype_or(dtype, _dt.get_default_dtype())
    if not _dt.is_floating_dtype(dt) and not (allow_complex and dt.kind == "c"):
        raise TypeError(
            f"{fname}() needs a floating point dtype{' or complex' if allow_complex else ''}, "
            f"got {_dt.dt_repr(dt)}"
        )
    return dt


def rand(
    *size: Any,
    generator: Any = None,
    dtype: DTypeLike = None,
    device: DeviceLike = None,
    requires_grad: bool = False,
) -> Tensor:
    """Make a tensor of uniform random numbers in ``[0, 1)``.

    Args:
        size: ints or one tuple/list.
        generator: a :class:`Generator` or ``numpy.random.Generator`` (default: the global one,
            seeded by :func:`manual_seed`).
        dtype: a float dtype (default float32).
        device, requires_grad: as in :func:`zeros`.

    Raises:
        TypeError: a non-float dtype.

    Example:
        >>> _ = manual_seed(0); float(rand(1)) < 1.0
        True
    """
    shape = size_from(size, "rand")
    dt = _float_dtype(dtype, "rand", allow_complex=False)
    return finish(_draw("rand", shape, generator, dt, device), requires_grad)


def randn(
    *size: Any,
    generator: Any = None,
    dtype: DTypeLike = None,
    device: DeviceLike = None,
    requires_grad: bool = False,
) -> Tensor:
    """Make a tensor of standard normal random numbers (arguments as in :func:`rand`).

    Complex dtypes get real and imaginary parts each with variance 1/2, as in torch.

    Example:
        >>> randn(2, 3).shape
        mpitensor.Size([2, 3])
    """
    shape = size_from(size, "randn")
    dt = _float_dtype(dtype, "randn", allow_complex=True)
    return finish(_draw("randn", shape, generator, dt, device), requires_grad)


def randint(
    low: int,
    high: Any = None,
    size: Any = None,
    *,
    generator: Any = None,
    dtype: DTypeLike = None,
    device: DeviceLike = None,
    requires_grad: bool = False,
) -> Tensor:
    """Make random integers in ``[low, high)``: ``randint(high, size)`` or ``(low, high, size)``.

    Raises:
        ValueError: ``high <= low``.

    Example:
        >>> randint(0, 10, (3,)).dtype
        dtype('int64')
    """
    if size is None:
        low, high, size = 0, low, high
    if size is None:
        raise TypeError("randint() needs a size, e.g. randint(10, (3,))")
    low, high = operator.index(low), operator.index(high)
    if high <= low:
        raise ValueError(f"randint(): expected low < high, got low={low}, high={high}")
    shape = size_from(size if isinstance(size, (tuple, list)) else (size,), "randint")
    dt = dtype_or(dtype, _INT64)
    arr = _drawn(generator, device, lambda rng: rng.integers(low, high, shape, np.int64))
    return finish(arr.astype(dt, copy=False), requires_grad)


def randperm(
    n: int,
    *,
    generator: Any = None,
    dtype: DTypeLike = None,
    device: DeviceLike = None,
    requires_grad: bool = False,
) -> Tensor:
    """Make a random permutation of ``0 .. n-1`` (int64 by default).

    Raises:
        ValueError: ``n`` is negative.

    Example:
        >>> sorted(randperm(4).tolist())
        [0, 1, 2, 3]
    """
    n = operator.index(n)
    if n < 0:
        raise ValueError(f"randperm(): n must be non-negative, got {n}")
    dt = dtype_or(dtype, _INT64)
    return finish(_drawn(generator, device, lambda rng: rng.permutation(n)).astype(dt),
                  requires_grad)


def rand_like(
    input: Any, *, generator: Any = None, dtype: DTypeLike = None,  # noqa: A002
    device: DeviceLike = None, requires_grad: bool = False,
) -> Tensor:
    """Make uniform random numbers with the shape (dtype, device) of ``input``.

    Raises:
        TypeError: the dtype is not floating point.

    Example:
        >>> rand_like(zeros(2, 2)).shape
        mpitensor.Size([2, 2])
    """
    shape, dt, dev = like_args(input, dtype, device)
    if not _dt.is_floating_dtype(dt):
        raise TypeError(f"rand_like() needs a floating point dtype, got {_dt.dt_repr(dt)}")
    return finish(_draw("rand", shape, generator, dt, dev), requires_grad)


def randn_like(
    input: Any, *, generator: Any = None, dtype: DTypeLike = None,  # noqa: A002
    device: DeviceLike = None, requires_grad: bool = False,
) -> Tensor:
    """Make standard normal numbers with the shape (dtype, device) of ``input``.

    Raises:
        TypeError: the dtype is neither floating point nor complex.

    Example:
        >>> randn_like(zeros(3)).dtype
        dtype('float32')
    """
    shape, dt, dev = like_args(input, dtype, device)
    if _dt.kind_of(dt) not in "fc":
        raise TypeError(f"randn_like() needs a floating point dtype, got {_dt.dt_repr(dt)}")
    return finish(_draw("randn", shape, generator, dt, dev), requires_grad)


# nn.functional draws dropout masks with it, under its old name
_t._serve({**{name: globals()[name] for name in __all__}, "_random": _draw})
