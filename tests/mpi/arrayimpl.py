"""Shared helpers of the MPI suites: array kinds, dtypes, values, communicators, call modes.

Modelled on mpi4py's ``test/arrayimpl.py``: one loop over array kinds (NumPy arrays,
``mpitensor.Tensor``, CuPy arrays) and one base-class fixture that binds a test class to a
communicator (the world, a full copy, a sub-group, ...). Every helper is deterministic, so every
rank makes the same choices (the same skips, the same groups, the same calls) in the same order.
"""

from __future__ import annotations

import contextlib
import functools
import time
from typing import Any, Callable, Iterator, Optional

import numpy as np
import pytest

import mpitensor
import mpitensor.distributed as dist
from mpitensor.backend import cupy_unavailable_reason

# ---------------------------------------------------------------------------- kinds and dtypes
KINDS = ("numpy", "tensor", "cupy")

ALL_DTYPES = tuple(np.dtype(n) for n in (
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16",
    "float32", "float64", "complex64", "complex128"))
#: a representative subset for the collectives that only move data
SOME_DTYPES = tuple(np.dtype(n) for n in ("bool", "int8", "uint8", "int64", "float16",
                                          "float64", "complex64"))

#: the subset used where a test also loops over async modes, roots and ops
FEW_DTYPES = tuple(np.dtype(n) for n in ("bool", "int8", "float16", "complex64"))


def dtypes_for(mode: str) -> tuple:
    """All data-moving dtypes for blocking calls, a few for the async modes (same paths)."""
    return SOME_DTYPES if mode == "sync" else FEW_DTYPES


#: every reduce op, with the legacy ``dist.reduce_op.SUM`` spelling last
OPS = (dist.ReduceOp.SUM, dist.ReduceOp.PRODUCT, dist.ReduceOp.MAX, dist.ReduceOp.MIN,
       dist.ReduceOp.AVG, dist.ReduceOp.BAND, dist.ReduceOp.BOR, dist.ReduceOp.BXOR)
OP_IDS = [op.name for op in OPS]


def cupy_skip_reason() -> str:
    """Why CuPy arrays cannot be tested here ('' when they can); the same on every rank."""
    return cupy_unavailable_reason()


def kinds() -> Iterator[str]:
    """The array kinds usable here (CuPy only where a GPU is); the same on every rank."""
    for kind in KINDS:
        if kind == "cupy" and cupy_skip_reason():
            continue
        yield kind


def require_kind(kind: str) -> None:
    """Skip (on every rank alike: the reason is deterministic) a kind that cannot run here."""
    if kind == "cupy":
        reason = cupy_skip_reason()
        if reason:
            pytest.skip(f"CuPy arrays: {reason}")


def as_tensor(a: Any) -> Any:
    """An ``mpitensor.Tensor`` over the array ``a`` itself (no copy, views included)."""
    t = mpitensor.Tensor(a)
    assert t._data is a, "mpitensor.Tensor(array) copied the array"
    return t


def device_array(kind: str, a: np.ndarray) -> Any:
    """``a`` as a NumPy array (numpy, tensor) or as a CuPy array (cupy)."""
    if kind == "cupy":
        import cupy

        return cupy.asarray(a)
    return a


def wrap(kind: str, a: Any) -> Any:
    """Present the array ``a`` as ``kind``: itself, a Tensor over it, or a CuPy copy of it."""
    if kind == "numpy":
        return a
    if kind == "tensor":
        return as_tensor(a)
    if kind == "cupy":
        return device_array(kind, a)
    raise AssertionError(kind)


#: how a buffer is laid out in memory
LAYOUTS = ("contig", "strided", "transposed")


def layouts(shape: Any) -> tuple:
    """The layouts a buffer of ``shape`` can take (strided needs dim 0, transposed 2-D)."""
    shape = tuple(shape)
    out = ["contig"]
    if len(shape) >= 1 and shape[0] > 1:
        out.append("strided")
    if len(shape) == 2 and min(shape) > 1:
        out.append("transposed")
    return tuple(out)


class Laid:
    """A buffer of kind ``kind`` holding ``arr``'s values in ``layout``.

    ``strided`` is every other row of a twice-as-long base whose other rows hold sentinel
    values; ``transposed`` is the ``.T`` view of a contiguous base. ``x`` is the buffer to pass;
    :meth:`check_gaps` asserts the base's elements outside the view are untouched.
    """

    def __init__(self, kind: str, arr: np.ndarray, layout: str = "contig") -> None:
        self.kind, self.layout = kind, layout
        arr = np.asarray(arr)
        if layout == "contig":
            base = arr.copy()
            index: Any = None
        elif layout == "strided":
            base = np.empty((2 * arr.shape[0],) + arr.shape[1:], dtype=arr.dtype)
            base[1::2] = values(arr.shape, arr.dtype, 5, salt=11)
            base[::2] = arr
            index = slice(None, None, 2)
        elif layout == "transposed":
            base = np.ascontiguousarray(arr.T)
            index = "T"
        else:
            raise AssertionError(layout)
        self.gaps = base[1::2].copy() if layout == "strided" else None
        self.base = device_array(kind, base)
        if index is None:
            v = self.base
        elif index == "T":
            v = self.base.T
        else:
            v = self.base[index]
        if layout != "contig":
            assert not v.flags.c_contiguous
        self.x = as_tensor(v) if kind == "tensor" else v

    def check_gaps(self, what: str = "") -> None:
        if self.gaps is not None:
            gaps = host(self.base)[1::2]
            _compare(lambda: np.testing.assert_array_equal(
                gaps, self.gaps, err_msg=f"{what}: elements outside the view changed"))


def host(x: Any) -> np.ndarray:
    """The values of a NumPy array, Tensor or CuPy array as a NumPy array."""
    if isinstance(x, mpitensor.Tensor):
        x = x._data
    if hasattr(x, "get") and not isinstance(x, np.ndarray):
        x = x.get()
    return np.asarray(x)


def raw(x: Any) -> Any:
    """The array behind a Tensor (the array itself otherwise)."""
    return x._data if isinstance(x, mpitensor.Tensor) else x


def values(shape: Any, dtype: np.dtype, r: int, salt: int = 0, kind: str = "sum") -> np.ndarray:
    """Small exact values, different per rank ``r``: every reduction of them is exact.

    ``kind="product"`` gives factors in {-1, 1, 2} (|product| <= 16 over 4 ranks).
    """
    dtype = np.dtype(dtype)
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    n = int(np.prod(shape)) if shape else 1
    i = np.arange(n, dtype=np.int64) + 3 * salt
    if dtype.kind == "b":
        v = (i + r) % 3 != 0
    elif kind == "product":
        v = np.array([1, 2, -1 if dtype.kind in "ifc" else 1])[(i + r) % 3]
    else:
        v = (i + 2 * r) % 7 - (3 if dtype.kind in "ifc" else 0)
    out = v.astype(dtype)
    if dtype.kind == "c":
        out = out + 1j * (((i + r) % 3) - 1).astype(dtype)
    return out.reshape(shape)


_NP_OPS: dict = {
    dist.ReduceOp.SUM: np.add, dist.ReduceOp.PRODUCT: np.multiply,
    dist.ReduceOp.MAX: np.maximum, dist.ReduceOp.MIN: np.minimum,
    dist.ReduceOp.BAND: np.bitwise_and, dist.ReduceOp.BOR: np.bitwise_or,
    dist.ReduceOp.BXOR: np.bitwise_xor, dist.ReduceOp.AVG: np.add,
}


def valid(dtype: np.dtype, op: dist.ReduceOp) -> bool:
    """Whether ``op`` is defined for ``dtype`` (the library's documented rules)."""
    k = np.dtype(dtype).kind
    if op is dist.ReduceOp.AVG:
        return k in "fc"
    if op in (dist.ReduceOp.BAND, dist.ReduceOp.BOR, dist.ReduceOp.BXOR):
        return k in "biu"
    if op in (dist.ReduceOp.MAX, dist.ReduceOp.MIN):
        return k != "c"
    return True


def invalid_match(dtype: np.dtype, op: dist.ReduceOp) -> str:
    """A regex the ValueError for an invalid (dtype, op) pair must match."""
    if op is dist.ReduceOp.AVG:
        return "AVG needs a floating or complex dtype"
    if op in (dist.ReduceOp.BAND, dist.ReduceOp.BOR, dist.ReduceOp.BXOR):
        return f"{op.name} is a bitwise op.*{np.dtype(dtype)}"
    return f"{op.name} is not defined for complex dtype {np.dtype(dtype)}"


def reduced(arrays: list, op: dist.ReduceOp) -> np.ndarray:
    """The expected reduction of ``arrays`` (one per rank) with ``op``; bool SUM is logical or,
    bool PRODUCT logical and; AVG is the sum over the number of arrays."""
    out = functools.reduce(_NP_OPS[op], arrays)
    if op is dist.ReduceOp.AVG:
        out = (out.astype(np.complex128 if out.dtype.kind == "c" else np.float64)
               / len(arrays)).astype(arrays[0].dtype)
    return np.asarray(out, dtype=arrays[0].dtype)


# A value check that fails on one rank must not make that rank leave the test while the others
# go on to the test's next collective (they would wait for it forever): inside a test, failed
# checks are collected and raised together when the test ends (see deferred_checks).
_DEFERRED: list = []
_COLLECTING: list = []


def expect(ok: bool, message: str) -> None:
    """Assert ``ok``, deferred to the end of the test while :func:`deferred_checks` is active."""
    if ok:
        return
    if _COLLECTING:
        _DEFERRED.append(message)
    else:
        raise AssertionError(message)


def _compare(fn: Callable[[], None]) -> None:
    try:
        fn()
    except AssertionError as exc:
        expect(False, str(exc).strip())


@contextlib.contextmanager
def deferred_checks() -> Iterator[None]:
    """Collect the failed checks of a test body; raise them all at the end."""
    _COLLECTING.append(True)
    _DEFERRED.clear()
    try:
        yield
    finally:
        _COLLECTING.pop()
        failed, _DEFERRED[:] = list(_DEFERRED), []
    if failed:
        shown = "\n".join(failed[:8])
        more = f"\n... and {len(failed) - 8} more" if len(failed) > 8 else ""
        raise AssertionError(f"{len(failed)} failed check(s):\n{shown}{more}")


def check(got: Any, want: np.ndarray, what: str = "", op: Optional[dist.ReduceOp] = None) -> None:
    """Check ``got`` (any kind) equals ``want`` exactly (AVG: to the dtype's rounding)."""
    g = host(got)
    if g.dtype != want.dtype or g.shape != want.shape:
        expect(False, f"{what}: got {g.dtype}{list(g.shape)}, expected "
                      f"{want.dtype}{list(want.shape)}")
        return
    if op is dist.ReduceOp.AVG:
        rtol = {2: 2e-3, 4: 1e-6, 8: 1e-12, 16: 1e-12}[want.dtype.itemsize
                                                        // (2 if want.dtype.kind == "c" else 1)]
        _compare(lambda: np.testing.assert_allclose(g, want, rtol=rtol, atol=rtol,
                                                    err_msg=what))
    else:
        _compare(lambda: np.testing.assert_array_equal(g, want, err_msg=what))


# ---------------------------------------------------------------------------- communicators
#: every binding, in creation order; tests bind to these by name
GROUP_NAMES = ("world", "full", "evens", "odds", "tail", "ends")


@functools.cache
def _groups() -> dict:
    # new_group is collective over the world: make them all once, in one fixed order
    n = dist.get_world_size()
    made: dict = {"world": None, "full": dist.new_group(list(range(n)))}
    made["evens"] = dist.new_group(list(range(0, n, 2)))
    if n >= 2:
        made["odds"] = dist.new_group(list(range(1, n, 2)))
        made["tail"] = dist.new_group(list(range(n - 1, 0, -1)))  # given reversed: sorted
        made["ends"] = dist.new_group([n - 1, 0])
    return made


def get_group(name: str) -> Any:
    """The group bound to ``name``; skips (on every rank) where the world is too small for it."""
    made = _groups()
    if name not in made:
        pytest.skip(f"group {name!r} needs a world of at least 2 ranks")
    return made[name]


class GroupCase:
    """Base of the communicator matrix: subclasses set ``GROUP`` to a name of GROUP_NAMES.

    After binding, ``self.group`` (None for the world), ``self.ranks`` (global ranks in group
    order), ``self.rank`` (this process's group rank, -1 for non-members), ``self.size`` and
    ``self.me`` (this process's global rank) are set.
    """

    GROUP = "world"

    @pytest.fixture(autouse=True)
    def _bind_group(self) -> Iterator[None]:
        self.group = get_group(self.GROUP)
        self.ranks = dist.get_process_group_ranks(self.group)
        self.rank = dist.get_rank(self.group)
        self.size = len(self.ranks)
        self.me = dist.get_rank()
        with deferred_checks():
            yield

    def nonmember(self) -> bool:
        """True on a rank outside the group (after checking how the group looks from there)."""
        if self.rank >= 0:
            assert dist.get_world_size(self.group) == self.size
            assert self.ranks[self.rank] == self.me
            return False
        assert self.me not in self.ranks
        assert dist.get_world_size(self.group) == -1
        return True


@contextlib.contextmanager
def debug_mode(enabled: bool) -> Iterator[None]:
    """Set debug mode for a block (on every rank: each must make the same call), then restore
    the setting the suite runs with (``MPITENSOR_DEBUG``)."""
    before = dist.get_debug()
    dist.set_debug(enabled)
    try:
        yield
    finally:
        dist.set_debug(before)


# ---------------------------------------------------------------------------- call modes
MODES = ("sync", "wait", "poll")


def call(mode: str, fn: Callable, *args: Any, **kwargs: Any) -> Optional[dist.Work]:
    """Run a collective blocking (``sync``), or with ``async_op=True`` and ``wait()`` (``wait``)
    or an ``is_completed()`` polling loop (``poll``); check the handle's protocol."""
    if mode == "sync":
        assert fn(*args, **kwargs) is None
        return None
    work = fn(*args, async_op=True, **kwargs)
    assert isinstance(work, dist.Work), f"{fn.__name__}(async_op=True) returned {work!r}"
    if mode == "wait":
        assert work.wait() is True
    elif mode == "poll":
        deadline = time.monotonic() + 60
        while not work.is_completed():
            assert time.monotonic() < deadline, f"{fn.__name__}: is_completed() never True"
            time.sleep(1e-5)  # let the other ranks run: the test machine is oversubscribed
    else:
        raise AssertionError(mode)
    assert work.is_completed() is True
    assert work.is_success() is True
    assert work.wait() is True  # a second wait is a no-op
    return work


# ---------------------------------------------------------------------------- spying on MPI
def arrays_in(obj: Any) -> Iterator[np.ndarray]:
    """Every NumPy array inside nested lists/tuples of mpi4py buffer specs."""
    if isinstance(obj, np.ndarray):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            yield from arrays_in(x)


class CommSpy:
    """Stands in for a group's mpi4py communicator and records every method called on it."""

    def __init__(self, comm: Any) -> None:
        self._comm = comm
        self.calls: list = []

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._comm, name)
        if not callable(attr):
            return attr

        def spy(*args: Any, **kwargs: Any) -> Any:
            self.calls.append((name, args))
            return attr(*args, **kwargs)

        return spy


def process_group(group: Any) -> Any:
    """The ProcessGroup object behind ``group`` (the default group for None)."""
    return dist.group.WORLD if group is None else group
