"""The profiler's recording: one active session, per-thread stacks of open events, and the
instrumentation that times mpitensor's ops while a session is active.

How ops are timed: while a session records, the public op entry points are replaced by timing
wrappers, and put back when it stops, so with no profiler active the op path is exactly what
it was (no flag to test, no call added). The entry points are the ``Tensor`` methods and
operators defined by ``mpitensor._ops`` (plus ``detach``, ``copy_``, ``fill_``, ``zero_``),
the functions of ``mpitensor``, ``mpitensor.nn.functional``, ``mpitensor.linalg``,
``mpitensor.fft`` and ``mpitensor.special`` that are already imported (this module imports
none of them), and every :class:`~mpitensor.autograd.ArrayFunction`'s ``backward`` (the
gradient of one recorded op, named as its ``grad_fn``: ``MulBackward``). An op called inside
another op through a Python-level entry point is a child event; a call of the same name
directly inside itself (``mpitensor.exp(x)`` calling ``x.exp()``) is counted once.

Op names are mpitensor's: the method or function name (``linear``, ``conv2d``, ``add_``),
an operator by the function it is (``a + b`` is ``add``, ``a @ b`` is ``matmul``, ``a[i]`` is
``__getitem__``), not torch's ``aten::`` names.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
import traceback
import types
from typing import Any, Optional

from mpitensor.autograd.function import ArrayFunction, Node
from mpitensor.tensor import Tensor

_OPERATORS = {
    "__add__": "add", "__radd__": "add", "__iadd__": "add_", "__sub__": "sub",
    "__rsub__": "rsub", "__isub__": "sub_", "__mul__": "mul", "__rmul__": "mul",
    "__imul__": "mul_", "__truediv__": "div", "__rtruediv__": "div", "__itruediv__": "div_",
    "__floordiv__": "floor_divide", "__rfloordiv__": "floor_divide",
    "__ifloordiv__": "floor_divide_", "__mod__": "remainder", "__rmod__": "remainder",
    "__imod__": "remainder_", "__pow__": "pow", "__rpow__": "pow", "__ipow__": "pow_",
    "__matmul__": "matmul", "__rmatmul__": "matmul", "__and__": "bitwise_and",
    "__rand__": "bitwise_and", "__iand__": "bitwise_and_", "__or__": "bitwise_or",
    "__ror__": "bitwise_or", "__ior__": "bitwise_or_", "__xor__": "bitwise_xor",
    "__rxor__": "bitwise_xor", "__ixor__": "bitwise_xor_", "__lshift__": "bitwise_left_shift",
    "__rshift__": "bitwise_right_shift", "__eq__": "eq", "__ne__": "ne", "__lt__": "lt",
    "__le__": "le", "__gt__": "gt", "__ge__": "ge", "__neg__": "neg", "__abs__": "abs",
    "__invert__": "bitwise_not", "__getitem__": "__getitem__", "__setitem__": "__setitem__",
}
_TENSOR_PY_OPS = {"detach", "detach_", "copy_", "fill_", "zero_"}
_NOT_OPS = {"size", "dim", "numel", "nelement", "item", "tolist", "numpy", "stride",
            "element_size", "data_ptr", "manual_seed", "seed", "initial_seed", "result_type",
            "can_cast", "promote_types", "typename", "get_device"}
_NAMESPACES = ("mpitensor", "mpitensor.nn.functional", "mpitensor.linalg", "mpitensor.fft",
               "mpitensor.special")


class CudaNames:
    """torch's older ``cuda_*`` names of the device times."""

    @property
    def cuda_time_total(self) -> float:
        return self.device_time_total

    @property
    def self_cuda_time_total(self) -> float:
        return self.self_device_time_total


class FunctionEvent(CudaNames):
    """One timed range: an op, a backward step or a ``record_function`` block.

    Times are in microseconds; ``cpu_children`` are the ranges opened inside it on its thread.
    """

    __slots__ = ("id", "name", "start_ns", "end_ns", "thread", "cpu_parent", "cpu_children",
                 "input_shapes", "stack", "own_bytes", "kind", "device_time_total",
                 "_cuda_marks")

    def __init__(self, eid: int, name: str, kind: str, thread: int) -> None:
        self.id = eid
        self.name = name
        self.kind = kind  # "cpu_op", "backward" or "user_annotation"
        self.thread = thread
        self.start_ns = self.end_ns = 0
        self.cpu_parent: Optional[FunctionEvent] = None
        self.cpu_children: list = []
        self.input_shapes: list = []
        self.stack: list = []
        self.own_bytes = 0
        self.device_time_total = 0.0
        self._cuda_marks: Any = None

    @property
    def key(self) -> str:
        return self.name

    @property
    def cpu_time_total(self) -> float:
        """Wall time of the range, children included (µs)."""
        return (self.end_ns - self.start_ns) / 1000.0

    @property
    def self_cpu_time_total(self) -> float:
        """``cpu_time_total`` less that of the children (µs)."""
        return self.cpu_time_total - sum(c.cpu_time_total for c in self.cpu_children)

    @property
    def cpu_memory_usage(self) -> int:
        """Bytes of the tensors the range's ops returned, children's included."""
        return self.own_bytes + sum(c.cpu_memory_usage for c in self.cpu_children)

    @property
    def self_cpu_memory_usage(self) -> int:
        """Bytes of the tensors this op itself returned."""
        return self.own_bytes

    @property
    def self_device_time_total(self) -> float:
        return self.device_time_total - sum(c.device_time_total for c in self.cpu_children)

    @property
    def count(self) -> int:
        return 1

    def time_range(self) -> tuple:
        """``(start, end)`` in µs since the session started."""
        return self.start_ns / 1000.0, self.end_ns / 1000.0

    def __repr__(self) -> str:
        return (f"<FunctionEvent id={self.id} name={self.name} "
                f"cpu_time_total={self.cpu_time_total:.3f}us "
                f"children={len(self.cpu_children)}>")


class _Session:
    """What one recording collects; the module global ``_session`` points at it."""

    def __init__(self, record_shapes: bool, profile_memory: bool, with_stack: bool,
                 cuda: bool) -> None:
        self.record_shapes = record_shapes
        self.profile_memory = profile_memory
        self.with_stack = with_stack
        self.cuda = _cupy() if cuda else None
        self.events: list = []
        self.origin_ns = time.perf_counter_ns()
        self.origin_wall_us = time.time_ns() / 1000.0
        self.pid = os.getpid()
        self._ids = iter(range(1 << 62))

    def begin(self, name: str, kind: str, args: tuple, stack: list) -> FunctionEvent:
        ev = FunctionEvent(next(self._ids), name, kind, threading.get_ident())
        if stack:
            ev.cpu_parent = stack[-1]
        if self.record_shapes and args:
            ev.input_shapes = [list(a.shape) if isinstance(a, Tensor) else [] for a in args]
        if self.with_stack:
            ev.stack = _user_frames()
        stack.append(ev)
        if self.cuda is not None:
            ev._cuda_marks = _cuda_mark(self.cuda)
        ev.start_ns = time.perf_counter_ns() - self.origin_ns
        return ev

    def end(self, ev: FunctionEvent, stack: list, out: Any = None) -> None:
        ev.end_ns = time.perf_counter_ns() - self.origin_ns
        if ev._cuda_marks is not None:
            ev._cuda_marks = (ev._cuda_marks, _cuda_mark(self.cuda))
        while stack:  # a range left open inside this one (an exception) closes with it
            if stack.pop() is ev:
                break
        if ev.cpu_parent is not None:
            ev.cpu_parent.cpu_children.append(ev)
        if self.profile_memory and out is not None:
            ev.own_bytes = _nbytes(out)
        self.events.append(ev)

    def finish(self) -> list:
        """The events in start order, device times filled in."""
        if self.cuda is not None:
            self.cuda.cuda.Device().synchronize()
            for ev in self.events:
                if ev._cuda_marks is not None and len(ev._cuda_marks) == 2:
                    a, b = ev._cuda_marks
                    ev.device_time_total = 1000.0 * self.cuda.cuda.get_elapsed_time(a, b)
                ev._cuda_marks = None
        return sorted(self.events, key=lambda e: (e.start_ns, e.id))


_session: Optional[_Session] = None
_tls = threading.local()


def _stack() -> list:
    s = getattr(_tls, "stack", None)
    if s is None:
        s = _tls.stack = []
    return s


def _cupy() -> Any:
    try:
        import cupy  # noqa: PLC0415 - optional

        cupy.cuda.runtime.getDeviceCount()
        return cupy
    except Exception:  # noqa: BLE001 - no CuPy or no device: CPU times only
        return None


def _cuda_mark(cupy: Any) -> Any:
    ev = cupy.cuda.Event()
    ev.record()
    return ev


def _nbytes(out: Any) -> int:
    if isinstance(out, Tensor):
        return int(out._data.nbytes) if hasattr(out._data, "nbytes") else 0
    if isinstance(out, (tuple, list)):
        return sum(_nbytes(o) for o in out)
    return 0


def _user_frames() -> list:
    """The caller's frames outside mpitensor, outermost first, as ``file(line): function``."""
    frames = traceback.extract_stack()[:-3]
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return [f"{f.filename}({f.lineno}): {f.name}" for f in frames
            if not os.path.abspath(f.filename).startswith(here)]


# --------------------------------------------------------------------------------------------
# Instrumentation


def _timed(fn: Any, name: str, kind: str = "cpu_op") -> Any:
    @functools.wraps(fn)
    def op(*args: Any, **kwargs: Any) -> Any:
        s = _session
        if s is None:
            return fn(*args, **kwargs)
        stack = _stack()
        if stack and stack[-1].name == name:
            return fn(*args, **kwargs)
        ev = s.begin(name, kind, args, stack)
        out = None
        try:
            out = fn(*args, **kwargs)
            return out
        finally:
            s.end(ev, stack, out)

    op.__profiler_original__ = fn
    return op


def _timed_backward(fn: Any, default: str) -> Any:
    def backward(ctx: Any, *grads: Any) -> Any:
        s = _session
        if s is None:
            return fn(ctx, *grads)
        stack = _stack()
        ev = s.begin(ctx.name() if type(ctx) is Node else default, "backward", (), stack)
        try:
            return fn(ctx, *grads)
        finally:
            s.end(ev, stack)

    return staticmethod(backward)


def _tensor_targets() -> list:
    out = []
    for name, fn in list(vars(Tensor).items()):
        if not isinstance(fn, types.FunctionType) or name in _NOT_OPS:
            continue
        mod = fn.__module__ or ""
        if name in _OPERATORS:
            out.append((Tensor, name, fn, _OPERATORS[name]))
        elif name.startswith("_") or name.startswith("is_"):
            continue
        elif mod.startswith("mpitensor._ops") or (mod == "mpitensor.tensor"
                                                 and name in _TENSOR_PY_OPS):
            out.append((Tensor, name, fn, name))
    return out


def _namespace_targets() -> list:
    out = []
    for modname in _NAMESPACES:
        mod = sys.modules.get(modname)  # instrument what is loaded; import nothing upward
        if mod is None:
            continue
        for name, fn in list(vars(mod).items()):
            if (not isinstance(fn, types.FunctionType) or name.startswith("_")
                    or name in _NOT_OPS or name.startswith(("set_", "get_", "is_", "use_"))):
                continue
            source = fn.__module__ or ""
            if source.startswith(("mpitensor._ops", "mpitensor.nn", "mpitensor.linalg",
                                  "mpitensor.fft", "mpitensor.special")) or (
                    source == "mpitensor" and modname == "mpitensor"):
                out.append((mod, name, fn, name))
    return out


def _function_classes() -> list:
    seen, todo, out = set(), [ArrayFunction], []
    while todo:
        cls = todo.pop()
        for sub in cls.__subclasses__():
            if sub not in seen:
                seen.add(sub)
                todo.append(sub)
                raw = sub.__dict__.get("backward")
                if isinstance(raw, staticmethod):
                    out.append((sub, raw))
    return out


_installed: list = []  # (owner, attribute, original value) to put back


def install() -> None:
    """Put the timing wrappers in place (once; :func:`uninstall` undoes it)."""
    if _installed:
        return
    for owner, name, fn, opname in _tensor_targets() + _namespace_targets():
        _installed.append((owner, name, fn))
        setattr(owner, name, _timed(fn, opname))
    for cls, raw in _function_classes():
        n = cls.__name__.lstrip("_")
        _installed.append((cls, "backward", raw))
        cls.backward = _timed_backward(raw.__func__, n if n.endswith("Backward")
                                       else f"{n}Backward")


def uninstall() -> None:
    """Put every original entry point back."""
    while _installed:
        owner, name, original = _installed.pop()
        setattr(owner, name, original)


def start(record_shapes: bool = False, profile_memory: bool = False, with_stack: bool = False,
          cuda: bool = False) -> _Session:
    """Begin a session (raises if one is active: sessions do not nest)."""
    global _session
    if _session is not None:
        raise RuntimeError("a profiler is already recording; mpitensor's profiler sessions do "
                           "not nest: leave the outer one first")
    session = _Session(record_shapes, profile_memory, with_stack, cuda)
    install()
    _session = session
    return session


def stop() -> list:
    """End the active session; its events in start order (none when no session is active)."""
    global _session
    session, _session = _session, None
    uninstall()
    if session is None:
        return []
    _tls.stack = []
    return session.finish()


def active() -> Optional[_Session]:
    """The recording session, or None."""
    return _session
