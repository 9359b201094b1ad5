"""Turning user arguments into MPI-ready buffers: dtype tables, reduce plans, staging.

Everything here is local (no communication). A buffer is passed to mpi4py's buffer methods as
``[array, MPI datatype]``; contiguous host arrays go through without a copy, other inputs are
staged into a contiguous (host, where MPI is not CUDA-aware) copy and written back after the
operation completes.

Half precision: MPI has no bfloat16 type and not every MPI reduces float16, so operations that
only move data (broadcast, gather, scatter, all_to_all, send/recv) move both as 16-bit words,
bit for bit, NaN payloads included, and reductions (all_reduce, reduce, reduce_scatter) widen
them to float32, reduce, and round once, as torch's NCCL and Gloo backends do.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any, Callable, Optional, Sequence

import numpy as np
from mpi4py import MPI

from .... import dtypes as _dt
from ...._base import config as _config
from ....backend import array_module, get_cupy, is_cupy_array
from ....errors import DtypeMismatchError
from ....tensor import Tensor
from ...process_group import ReduceOp

_SUPPORTED = (
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "bfloat16", "float32", "float64", "complex64", "complex128",
)


def _half_type() -> MPI.Datatype:
    # MPI-4.1 names a half type; where MPI lacks it, move the bytes as 16-bit words (reductions
    # on float16 upcast to float32 anyway, see _plan). mpi4py's ABI layer may hand out a
    # FLOAT16_T handle that the library underneath rejects at first use (Open MPI 4.1 does:
    # MPI_ERR_TYPE in MPI_Bcast), so ask the library itself about it.
    half = getattr(MPI, "FLOAT16_T", MPI.DATATYPE_NULL)
    if half == MPI.DATATYPE_NULL:
        return MPI.UINT16_T
    try:
        ok = half.Get_size() == 2
    except MPI.Exception:
        ok = False
    return half if ok else MPI.UINT16_T


_PREDEFINED = {
    "bool": MPI.C_BOOL, "int8": MPI.INT8_T, "int16": MPI.INT16_T, "int32": MPI.INT32_T,
    "int64": MPI.INT64_T, "uint8": MPI.UINT8_T, "uint16": MPI.UINT16_T, "uint32": MPI.UINT32_T,
    "uint64": MPI.UINT64_T, "float16": _half_type(), "bfloat16": MPI.UINT16_T, "float32": MPI.FLOAT,
    "float64": MPI.DOUBLE, "complex64": MPI.C_FLOAT_COMPLEX, "complex128": MPI.C_DOUBLE_COMPLEX,
}

#: numpy dtype -> MPI datatype used to move its elements
MOVE_TYPES: dict = {_dt.to_dtype(n): _PREDEFINED[n] for n in _SUPPORTED}

_MPI_OPS = {
    ReduceOp.SUM: MPI.SUM, ReduceOp.PRODUCT: MPI.PROD, ReduceOp.MIN: MPI.MIN,
    ReduceOp.MAX: MPI.MAX, ReduceOp.BAND: MPI.BAND, ReduceOp.BOR: MPI.BOR,
    ReduceOp.BXOR: MPI.BXOR, ReduceOp.AVG: MPI.SUM,
}
# bool is reduced as uint8 0/1 values, where these ops give the logical answer
_BOOL_OPS = {ReduceOp.SUM: MPI.MAX, ReduceOp.PRODUCT: MPI.MIN}
_BITWISE = (ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR)
_U8 = np.dtype(np.uint8)
_F32 = np.dtype(np.float32)


class ReducePlan:
    """How to reduce one dtype with one op: the MPI op, an optional view or upcast, AVG."""

    __slots__ = ("mpi_op", "mpi_type", "view", "upcast", "average")

    def __init__(self, mpi_op: MPI.Op, mpi_type: MPI.Datatype, view: Optional[np.dtype],
                 upcast: Optional[np.dtype], average: bool) -> None:
        self.mpi_op = mpi_op
        self.mpi_type = mpi_type
        self.view = view
        self.upcast = upcast
        self.average = average


def supported_dtypes() -> tuple:
    """The numpy dtypes every operation accepts."""
    return tuple(MOVE_TYPES)


def coerce_op(op: Any, where: str) -> ReduceOp:
    if isinstance(op, ReduceOp):
        return op
    if isinstance(op, str) and op.upper() in ReduceOp.members:
        return ReduceOp.members[op.upper()]
    raise ValueError(
        f"{where}: unsupported reduce op {op!r}; use one of "
        f"{', '.join('ReduceOp.' + m for m in ReduceOp.members)}"
    )


@functools.cache
def _plan(dt: np.dtype, op: ReduceOp) -> Any:
    kind = _dt.kind_of(dt)
    if kind == "b":
        if op is ReduceOp.AVG:
            return "AVG needs a floating or complex dtype, but the tensor is bool"
        return ReducePlan(_BOOL_OPS.get(op, _MPI_OPS[op]), MOVE_TYPES[_U8], _U8, None, False)
    if kind in "iu":
        if op is ReduceOp.AVG:
            return (f"AVG needs a floating or complex dtype, but the tensor is {dt}; reduce "
                    "with SUM and divide, or cast to a float dtype first")
        return ReducePlan(_MPI_OPS[op], MOVE_TYPES[dt], None, None, False)
    if op in _BITWISE:
        return f"{op.name} is a bitwise op: it needs an integer or bool dtype, not {dt}"
    if kind == "c" and op in (ReduceOp.MIN, ReduceOp.MAX):
        return f"{op.name} is not defined for complex dtype {dt} (complex numbers are unordered)"
    average = op is ReduceOp.AVG
    if dt.itemsize == 2 and kind == "f":
        # float16 and bfloat16: MPI reduces neither portably (bfloat16 moves as uint16), so
        # reduce in float32 and round once at the end, after AVG's division
        return ReducePlan(_MPI_OPS[op], MOVE_TYPES[_F32], None, _F32, average)
    return ReducePlan(_MPI_OPS[op], MOVE_TYPES[dt], None, None, average)


def reduce_plan(dt: np.dtype, op: ReduceOp, where: str) -> ReducePlan:
    plan = _plan(dt, op)
    if isinstance(plan, str):
        raise ValueError(f"{where}: {plan}.")
    return plan


def unwrap(x: Any, what: str, where: str) -> Any:
    """Return the array behind a Tensor / NumPy array / CuPy array argument."""
    t = type(x)
    if t is np.ndarray:
        return x
    if t is Tensor or isinstance(x, Tensor):
        return x._data
    if isinstance(x, np.ndarray) or is_cupy_array(x):
        return x
    raise TypeError(
        f"{where}: {what} must be an mpitensor.Tensor, a NumPy array or a CuPy array, "
        f"got {t.__name__}"
    )


def check_dtype(arr: Any, what: str, where: str) -> MPI.Datatype:
    mt = MOVE_TYPES.get(arr.dtype)
    if mt is None:
        raise TypeError(
            f"{where}: {what} has unsupported dtype {arr.dtype}; supported dtypes are "
            f"{', '.join(str(d) for d in MOVE_TYPES)}"
        )
    return mt


def check_writable(arr: Any, what: str, where: str) -> None:
    if isinstance(arr, np.ndarray) and not arr.flags.writeable:
        raise ValueError(
            f"{where}: {what} is read-only, but this operation writes its result into it; pass a "
            "writable array (e.g. arr.copy(), or np.require(arr, requirements='W'))"
        )


def check_same_dtype(a: Any, b: Any, what_a: str, what_b: str, where: str) -> None:
    if a.dtype != b.dtype:
        raise DtypeMismatchError(
            f"{where}: dtype mismatch: {what_a} is {a.dtype} but {what_b} is {b.dtype}; "
            "inputs and outputs of a collective must have the same dtype"
        )


def move_pair(out: Any, inp: Any) -> Any:
    """The MPI datatype when NumPy arrays ``out`` and ``inp`` qualify together for a fast path
    (same dtype, at least 1-d, C-contiguous, ``out`` writable, no shared memory: the in-place
    idioms take the general path), else None. Two distinct arrays that each allocated their
    memory (``owndata``) cannot overlap, which spares the common call ``np.may_share_memory``
    (a third of this test's time)."""
    if type(out) is not np.ndarray or type(inp) is not np.ndarray:
        return None
    dt = inp.dtype
    if out.dtype != dt or not out.ndim or not inp.ndim:
        return None
    fo, fi = out.flags, inp.flags
    if not (fo.c_contiguous and fo.writeable and fi.c_contiguous):
        return None
    if not (fo.owndata and fi.owndata and out is not inp) and np.may_share_memory(out, inp):
        return None
    return MOVE_TYPES.get(dt)


def _detect_cuda_aware() -> bool:
    setting = _config.cuda_aware()
    if setting is not None:
        return setting
    # Open MPI and MPICH (>= 4) both export MPIX_Query_cuda_support from libmpi
    candidates = [None]
    try:
        with open("/proc/self/maps") as maps:
            candidates += sorted({line.split()[-1] for line in maps if "libmpi" in line})
    except OSError:
        pass
    for path in candidates:
        try:
            fn = ctypes.CDLL(path).MPIX_Query_cuda_support
        except (OSError, AttributeError):
            continue
        fn.restype = ctypes.c_int
        return bool(fn())
    return False


@functools.cache
def cuda_aware() -> bool:
    """True when MPI can read and write CUDA device memory directly."""
    return _detect_cuda_aware()


def _sync_device(arr: Any) -> None:
    # MPI reads device memory outside CuPy's stream order: finish pending kernels first
    get_cupy().cuda.get_current_stream().synchronize()


def stage_in(arr: Any) -> Any:
    """A contiguous buffer MPI can read holding ``arr``'s elements (no copy when possible)."""
    if isinstance(arr, np.ndarray):
        return arr if arr.flags.c_contiguous else np.ascontiguousarray(arr)
    if cuda_aware():
        xp = get_cupy()
        buf = arr if arr.flags.c_contiguous else xp.ascontiguousarray(arr)
        _sync_device(buf)
        return buf
    return arr.get()


def unalias(send: Any, recv: Any) -> Any:
    """``send``, or a copy of it where it overlaps ``recv``.

    MPI forbids aliased send and receive buffers, but torch allows an input that is a chunk of
    the output (the in-place ``all_gather_into_tensor`` and ``reduce_scatter_tensor`` idiom)
    or the output itself; the overlap test only compares bounds, so it costs O(1).
    """
    xp = array_module(send)
    if xp is array_module(recv) and xp.may_share_memory(send, recv):
        return send.copy()
    return send


def stage_out(arr: Any) -> "tuple[Any, Optional[Callable[[], None]]]":
    """A contiguous buffer MPI can write, and the step that copies it back into ``arr``."""
    if isinstance(arr, np.ndarray):
        if arr.flags.c_contiguous:
            return arr, None
        buf = np.ascontiguousarray(arr)

        def write_back() -> None:
            arr[...] = buf

        return buf, write_back
    xp = get_cupy()
    if cuda_aware():
        if arr.flags.c_contiguous:
            _sync_device(arr)
            return arr, None
        buf = xp.ascontiguousarray(arr)
        _sync_device(buf)

        def write_back_dev() -> None:
            arr[...] = buf

        return buf, write_back_dev
    host = arr.get()

    def write_back_host() -> None:
        arr[...] = xp.asarray(host)

    return host, write_back_host


def chain(*steps: Optional[Callable[[], None]]) -> Optional[Callable[[], None]]:
    """Combine finishing steps, skipping the ``None`` ones."""
    todo = [s for s in steps if s is not None]
    if not todo:
        return None
    if len(todo) == 1:
        return todo[0]

    def run_all() -> None:
        for step in todo:
            step()

    return run_all


def apply_plan_out(buf: Any, plan: ReducePlan) -> "tuple[Any, Optional[Callable[[], None]]]":
    """View or upcast a reduce buffer per the plan; return the buffer MPI reduces into."""
    if plan.view is not None:
        return buf.view(plan.view), None
    if plan.upcast is not None:
        wide = buf.astype(plan.upcast)

        def narrow() -> None:
            buf[...] = wide

        return wide, narrow
    return buf, None


def apply_plan_in(buf: Any, plan: ReducePlan) -> Any:
    if plan.view is not None:
        return buf.view(plan.view)
    if plan.upcast is not None:
        return buf.astype(plan.upcast)
    return buf


def divider(buf: Any, n: int) -> Callable[[], None]:
    """The AVG finishing step: divide the summed buffer by the group size in place."""

    xp = array_module(buf)

    def divide() -> None:
        xp.divide(buf, n, out=buf)

    return divide


def describe(arr: Any) -> str:
    return f"{arr.dtype}{list(arr.shape)}"


def counts_displs(counts: Sequence[int]) -> "tuple[list, list]":
    """``(counts, displacements)`` of pieces laid end to end: a v-collective's layout."""
    displs, total = [], 0
    for c in counts:
        displs.append(total)
        total += c
    return list(counts), displs
