"""The files ``torch.save`` writes, read without torch and without running code (their writer is
``mpitensor.checkpoint.torch_write``).

Two layouts exist. The zip layout (torch >= 1.6, the default) is a zip archive whose records
sit under one folder ``<archive>/``:

* ``data.pkl``: a pickle of the object tree in which every storage is a persistent id
  ``("storage", <storage type>, <key>, <location>, <numel>)``;
* ``data/<key>``: the raw bytes of each storage, in the byte order of the ``byteorder`` record;
* ``version``, ``.format_version``, ``.storage_alignment``, ``.data/serialization_id``; torch
  pads every record's local header (an ``FB`` extra field) so its data starts at a multiple of
  64 bytes in the file.

The legacy layout (``torch.save(..., _use_new_zipfile_serialization=False)``) is a row of pickles
(a magic number, the protocol version 1001, a dict describing the machine, the object tree with
ids ``("storage", type, key, location, numel, view)``, the list of storage keys) followed, per
key, by an 8-byte element count and the raw bytes. The tar layout of torch < 0.4 is not read.

In the tree a tensor is a call ``torch._utils._rebuild_tensor_v2(storage, offset, size, stride,
requires_grad, hooks[, metadata])``; the storage's type names the dtype (``torch FloatStorage``,
the old encoding). Dtypes without such a class (uint16/32/64, float8, ...) use
``_rebuild_tensor_v3(..., dtype)`` with ``torch.storage UntypedStorage``, whose numel counts
bytes (the new encoding). A parameter wraps a tensor: ``_rebuild_parameter(tensor,
requires_grad, hooks)``.

Reading uses a restricted unpickler: ``find_class`` resolves a fixed table of stand-ins written
here (the rebuild functions, storage types, dtypes, ``torch.Size``, ``torch.device``,
OrderedDict, Counter, set, complex, bytearray and ``_codecs.encode`` for bytes); any other
global stops the load before anything is called. ``BUILD`` may only set plain attributes of an
OrderedDict (torch's ``_metadata``); the copyreg extension opcodes are refused. With
``weights_only=False`` other globals are imported as ordinary pickle does (which runs code: for
trusted files only), while torch's own names still map to the stand-ins.

Example:
    >>> import io, mpitensor as mt
    >>> buf = io.BytesIO()
    >>> from mpitensor.checkpoint.torch_write import write_zip
    >>> write_zip({"w": mt.ones(2)}, buf, allow_pickle=False, parameter=mt.nn.Parameter)
    >>> _ = buf.seek(0)
    >>> read_zip(buf, lambda data, location: data, True, mt.nn.Parameter)["w"]
    tensor([1., 1.])
"""

from __future__ import annotations

import _compat_pickle
import codecs
import collections
import importlib
import io
import logging
import math
import pickle
import struct
import sys
import zipfile
import zlib
from dataclasses import dataclass
from typing import Any, BinaryIO, Callable, Dict, List, Optional, Tuple

import numpy as np

from mpitensor import backend as _backend
from mpitensor import dtypes as _dt
from mpitensor.checkpoint import safe_globals as _safe_globals
from mpitensor.tensor import Size, Tensor

__all__ = ["FormatError", "Place", "Budget", "read_zip", "read_legacy", "is_legacy",
           "LEGACY_MAGIC"]

_log = logging.getLogger("mpitensor.checkpoint")

#: ``place(data, location)``: puts one storage's bytes (a 1-D uint8 host array) on the device
#: its saved ``location`` maps to and returns a 1-D uint8 NumPy or CuPy array.
Place = Callable[[np.ndarray, str], Any]

LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
_LEGACY_PROTOCOL = 1001
# What a legacy file starts with: PROTO 2, LONG1 of 10 bytes, the magic number little-endian.
_LEGACY_PREFIX = b"\x80\x02\x8a\x0a" + LEGACY_MAGIC.to_bytes(10, "little")
ALIGN = 64
PAD_FIELD = 0x4246  # the "FB" extra-field id torch pads local headers with
_MAX_SMALL_RECORD = 1 << 16  # byteorder, version, ...
_MAX_DEFLATE_RATIO = 1100  # deflate cannot expand more than ~1032:1; more is a forged size

# Legacy storage classes (the old encoding) by the dtype name torch gives their elements.
_STORAGE_DTYPE = {
    "DoubleStorage": "float64", "FloatStorage": "float32", "HalfStorage": "float16",
    "BFloat16Storage": "bfloat16", "LongStorage": "int64", "IntStorage": "int32",
    "ShortStorage": "int16", "CharStorage": "int8", "ByteStorage": "uint8",
    "BoolStorage": "bool", "ComplexDoubleStorage": "complex128",
    "ComplexFloatStorage": "complex64", "QUInt8Storage": "quint8", "QInt8Storage": "qint8",
    "QInt32Storage": "qint32", "QUInt4x2Storage": "quint4x2", "QUInt2x4Storage": "quint2x4",
}
STORAGE_OF = {v: k for k, v in _STORAGE_DTYPE.items()}
# Torch dtypes mpitensor has no counterpart for; named so the error can say which one it met.
_FOREIGN_DTYPES = frozenset(
    ["complex32", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
     "float8_e5m2fnuz", "float8_e8m0fnu", "float4_e2m1fn_x2", "quint8", "qint8", "qint32",
     "quint4x2", "quint2x4", "bits1x8", "bits2x4", "bits4x2", "bits8", "bits16"]
    + [f"uint{n}" for n in range(1, 8)] + [f"int{n}" for n in range(1, 8)])


# torch's dtype names for mpitensor's dtypes, taken from mpitensor.dtypes so that a dtype added
# there is read and written here too
_DTYPES: Dict[str, np.dtype] = {name: np.dtype(dt) for dt, name in _dt._NAMES.items()}


class FormatError(Exception):
    """What is wrong with a torch file (the caller adds the file's name)."""


class Budget:
    """The memory one load may allocate: every allocation is counted before it is made.

    Args:
        limit: the most bytes, or None for no bound.
        hint: what the refusal adds after the numbers: where the limit came from and how to
            raise it.

    Example:
        >>> b = Budget(100, "")
        >>> b.need(60, "storage '0'")  # a second 60 would raise FormatError
        >>> b.used
        60
    """

    __slots__ = ("limit", "hint", "used")

    def __init__(self, limit: Optional[int] = None, hint: str = "") -> None:
        self.limit = limit
        self.hint = hint
        self.used = 0

    def need(self, n: int, what: str) -> None:
        """Count ``n`` more bytes for ``what``, or raise FormatError (nothing allocated)."""
        if self.limit is not None and self.used + n > self.limit:
            raise FormatError(f"its tensors need at least {self.used + n} bytes of memory "
                              f"({what}), more than the limit of {self.limit} bytes"
                              f"{self.hint}")
        self.used += n


def is_legacy(prefix: bytes) -> bool:
    """True when ``prefix`` (the first bytes of a file) starts a legacy ``torch.save`` file."""
    return prefix.startswith(_LEGACY_PREFIX[:len(prefix)]) and len(prefix) >= 4


def _foreign_dtype(name: str) -> FormatError:
    return FormatError(f"it holds a tensor of dtype torch.{name}, which mpitensor does not "
                       f"support (convert in torch first, e.g. "
                       f"{{k: v.float() for k, v in state_dict.items()}})")


# ------------------------------------------------------------------------------------ reading
@dataclass(frozen=True)
class _StorageType:
    """Stand-in for a storage class: ``torch.FloatStorage`` (typed) or ``UntypedStorage``."""

    name: str
    dtype: Optional[np.dtype]  # None: untyped, numel counts bytes

    def __repr__(self) -> str:
        return f"torch.{self.name}"


@dataclass(frozen=True)
class _ClassName:
    """Stand-in for ``torch.Tensor`` / ``torch.nn.Parameter``: a name, never called."""

    cls: type

    def __repr__(self) -> str:
        return f"<stand-in for {self.cls.__name__}>"


class _Storage:
    """One storage of the file: its host bytes, then (lazily) its placed copy."""

    __slots__ = ("key", "nbytes", "location", "host", "placed", "swapped")

    def __init__(self, key: str, nbytes: int, location: str) -> None:
        self.key = key
        self.nbytes = nbytes
        self.location = location
        self.host: Optional[np.ndarray] = None  # None in the legacy layout's first pass
        self.placed: Any = None
        self.swapped: Optional[int] = None  # element size the bytes were swapped for


class _StorageRef:
    """What a persistent id unpickles to: a storage seen as elements of ``dtype``."""

    __slots__ = ("storage", "dtype", "used")

    def __init__(self, storage: _Storage, dtype: Optional[np.dtype]) -> None:
        self.storage = storage
        self.dtype = dtype
        self.used = False


def _int(x: Any, what: str) -> int:
    if type(x) is not int:
        raise FormatError(f"malformed tensor: {what} is {type(x).__name__}, not an int")
    return x


def _ints(x: Any, what: str) -> Tuple[int, ...]:
    if not isinstance(x, (tuple, list)):
        raise FormatError(f"malformed tensor: {what} is {type(x).__name__}, not a tuple")
    out = tuple(_int(v, what) for v in x)
    if any(v < 0 for v in out):
        raise FormatError(f"malformed tensor: negative entry in {what} {out}")
    return out


def _encode(obj: Any, encoding: str = "utf-8", errors: str = "strict") -> bytes:
    # Protocol 2 pickles bytes as _codecs.encode(text, "latin1"); nothing else is wanted here.
    if type(obj) is not str or encoding not in ("latin1", "latin-1") or errors != "strict":
        raise FormatError("malformed pickle: _codecs.encode is only accepted for bytes "
                          "(a str and the latin1 encoding)")
    return codecs.encode(obj, encoding)


def _bytearray(*args: Any) -> bytearray:
    # bytearray(n) would allocate n bytes from one number in the file: only contents pass.
    if not args:
        return bytearray()
    if isinstance(args[0], int):
        raise FormatError("malformed pickle: bytearray(<size>) is refused")
    if len(args) == 2 and type(args[0]) is str:
        return bytearray(_encode(args[0], args[1]))
    if len(args) == 1 and isinstance(args[0], (bytes, bytearray, list)):
        return bytearray(args[0])
    raise FormatError("malformed pickle: unexpected bytearray arguments")


def _size(dims: Any = ()) -> Size:
    if not isinstance(dims, (tuple, list)):
        raise FormatError("malformed pickle: torch.Size takes a tuple")
    return Size(_ints(dims, "torch.Size"))


def _device(kind: Any, index: Any = None) -> _backend.device:
    if isinstance(kind, _backend.device):
        return kind
    try:
        return _backend.device(kind, index)
    except (TypeError, ValueError) as exc:
        raise FormatError(f"it holds torch.device({kind!r}, {index!r}), which mpitensor "
                          f"cannot represent ({exc})") from None


def _bytes(*args: Any) -> bytes:
    # Protocol 2 pickles b"" as bytes(); bytes(n) would allocate n bytes from one number.
    if args:
        raise FormatError("malformed pickle: bytes(...) with arguments is refused")
    return b""


def _set(items: Any = ()) -> set:
    if not isinstance(items, (list, tuple)):
        raise FormatError("malformed pickle: set takes a list")
    return set(items)


def _odict(*args: Any) -> collections.OrderedDict:
    if args and not isinstance(args[0], (list, tuple, dict)):
        raise FormatError("malformed pickle: OrderedDict takes a list of pairs")
    return collections.OrderedDict(*args)


def _counter(*args: Any) -> collections.Counter:
    if args and not isinstance(args[0], (list, tuple, dict)):
        raise FormatError("malformed pickle: Counter takes a dict")
    return collections.Counter(*args)


class _Unpickler(pickle._Unpickler):
    """The restricted unpickler (pure Python, so each dangerous opcode can be overridden)."""

    dispatch = dict(pickle._Unpickler.dispatch)

    def __init__(self, file: BinaryIO, read: Optional[Callable[[str, int], np.ndarray]],
                 place: Place, weights_only: bool, swap: bool, parameter: type,
                 storages: Optional[Dict[str, _Storage]] = None,
                 budget: Optional[Budget] = None) -> None:
        super().__init__(file, fix_imports=True, encoding="utf-8", errors="strict")
        self.budget = Budget() if budget is None else budget
        # (storage key, dtype, conj, neg) -> the storage with the flags applied, placed
        self.flagged: Dict[Tuple[str, str, bool, bool], Any] = {}
        self.parameter = parameter
        self.read_storage = read
        self.dry = False  # the legacy layout's first pass: learn the storages, build nothing
        self.place = place
        self.weights_only = weights_only
        self.swap = swap  # the file's byte order differs from this machine's
        self.storages: Dict[str, _Storage] = {} if storages is None else storages
        self.refs: List[_StorageRef] = []
        self.table = self._table()

    # --- globals ---------------------------------------------------------------------------
    def _table(self) -> Dict[Tuple[str, str], Any]:
        t: Dict[Tuple[str, str], Any] = {
            ("collections", "OrderedDict"): _odict,
            ("collections", "Counter"): _counter,
            ("builtins", "set"): _set,
            ("builtins", "complex"): complex,
            ("builtins", "bytes"): _bytes,
            ("builtins", "bytearray"): _bytearray,
            ("_codecs", "encode"): _encode,
            ("torch._utils", "_rebuild_tensor"): self._rebuild_tensor,
            ("torch._utils", "_rebuild_tensor_v2"): self._rebuild_tensor_v2,
            ("torch._utils", "_rebuild_tensor_v3"): self._rebuild_tensor_v3,
            ("torch._utils", "_rebuild_parameter"): self._rebuild_parameter,
            ("torch._utils", "_rebuild_parameter_with_state"): self._rebuild_parameter_state,
            ("torch._tensor", "_rebuild_from_type_v2"): self._rebuild_from_type_v2,
            ("torch", "Size"): _size,
            ("torch", "device"): _device,
            ("torch", "Tensor"): _ClassName(Tensor),
            ("torch.nn.parameter", "Parameter"): _ClassName(self.parameter),
        }
        for name, dt in _DTYPES.items():
            t[("torch", name)] = dt
        for cls, dname in _STORAGE_DTYPE.items():
            for module in ("torch", "torch.cuda"):
                t[(module, cls)] = dname  # resolved in find_class: may be a foreign dtype
        for module in ("torch", "torch.storage", "torch.cuda"):
            t[(module, "UntypedStorage")] = _StorageType("UntypedStorage", None)
        return t

    def find_class(self, module: str, name: str) -> Any:
        if not isinstance(module, str) or not isinstance(name, str):
            raise FormatError("malformed pickle: a global with a non-text name")
        if self.proto < 3:  # protocol 2 files may carry Python 2 names (__builtin__.set)
            if (module, name) in _compat_pickle.NAME_MAPPING:
                module, name = _compat_pickle.NAME_MAPPING[(module, name)]
            elif module in _compat_pickle.IMPORT_MAPPING:
                module = _compat_pickle.IMPORT_MAPPING[module]
        found = self.table.get((module, name))
        if isinstance(found, str):  # a legacy storage class, by the dtype it holds
            dt = _DTYPES.get(found)
            if dt is None:
                raise _foreign_dtype(found)
            return _StorageType(name, dt)
        if found is not None:
            return found
        if module == "torch" and name in _FOREIGN_DTYPES:
            raise _foreign_dtype(name)
        allowed = _safe_globals.lookup(module, name)
        if allowed is not None:
            return allowed
        if self.weights_only:
            raise FormatError(
                f"it references the global {module}.{name}, which weights_only=True refuses "
                f"(nothing was called); only tensors, parameters, containers and numbers load "
                f"this way. If you trust the file's source, pass weights_only=False, or allow "
                f"just this global with mpitensor.serialization.add_safe_globals([...]) or "
                f"inside a `with mpitensor.serialization.safe_globals([...]):` block")
        if module == "torch" or module.startswith("torch."):
            return _torch_global(module, name)
        return super().find_class(module, name)

    # --- opcodes with side effects -----------------------------------------------------------
    def _load_build(self) -> None:
        if not self.weights_only or _safe_globals.allows_instance(self.stack[-2]):
            pickle._Unpickler.load_build(self)
            return
        state = self.stack.pop()
        inst = self.stack[-1]
        if isinstance(state, tuple) and len(state) == 2 and not state[1]:
            state = state[0]
        if type(inst) not in (collections.OrderedDict, collections.Counter) or \
                not isinstance(state, dict) or \
                not all(type(k) is str and not k.startswith("__") for k in state):
            raise FormatError(f"malformed pickle: BUILD on {type(inst).__name__} with "
                              f"{type(state).__name__} state is refused")
        inst.__dict__.update(state)  # torch's state dicts carry _metadata this way

    # --- storages ------------------------------------------------------------------------------
    def persistent_load(self, pid: Any) -> _StorageRef:
        if not isinstance(pid, tuple) or len(pid) not in (5, 6) or pid[0] != "storage":
            raise FormatError(f"malformed pickle: unexpected persistent id {_short(pid)}")
        stype, key, location, numel = pid[1:5]
        if not isinstance(stype, _StorageType):
            raise FormatError(f"malformed pickle: storage type {_short(stype)}")
        if type(key) is not str or type(location) is not str:
            raise FormatError("malformed pickle: storage key and location must be text")
        numel = _int(numel, "storage numel")
        if numel < 0:
            raise FormatError(f"malformed pickle: storage {key!r} has {numel} elements")
        if len(pid) == 6 and pid[5] is not None:
            raise FormatError("it holds storage views (torch < 0.4), which mpitensor does "
                              "not read; re-save the file with a current torch")
        nbytes = numel * (1 if stype.dtype is None else stype.dtype.itemsize)
        st = self.storages.get(key)
        if st is None:
            if self.read_storage is None and not self.dry:
                raise FormatError(f"corrupt: storage {key!r} has no data in the file")
            st = _Storage(key, nbytes, location)
            if not self.dry:
                st.host = self.read_storage(key, nbytes)
            self.storages[key] = st
        elif st.nbytes != nbytes and not self.dry:
            raise FormatError(f"corrupt: storage {key!r} is claimed with {st.nbytes} and "
                              f"{nbytes} bytes")
        ref = _StorageRef(st, stype.dtype)
        self.refs.append(ref)
        return ref

    def _placed(self, st: _Storage, dtype: np.dtype) -> Any:
        if self.swap and dtype.itemsize > 1:
            if st.swapped is None and st.placed is None:
                assert st.host is not None
                whole = st.host[:st.nbytes - st.nbytes % dtype.itemsize]
                whole.view(dtype).byteswap(inplace=True)
                st.swapped = dtype.itemsize
            elif st.swapped != dtype.itemsize:
                raise FormatError(f"storage {st.key!r}, converted from the file's byte order, "
                                  f"is viewed with two element sizes")
        if st.placed is None:
            st.placed = self.place(st.host, st.location)
        return st.placed

    def _flagged(self, st: _Storage, buf: Any, dtype: np.dtype, conj: bool, neg: bool) -> Any:
        """A copy of the storage, seen as ``dtype``, conjugated and/or negated (one per kind)."""
        key = (st.key, dtype.str, conj, neg)
        out = self.flagged.get(key)
        if out is None:
            nbytes = st.nbytes - st.nbytes % dtype.itemsize
            how = " and ".join(w for w, f in (("conjugated", conj), ("negated", neg)) if f)
            self.budget.need(nbytes, f"a {how} copy of storage {st.key!r}")
            typed = buf[:nbytes].view(dtype)
            copy = typed.conj() if conj else typed.copy()
            if neg:
                _backend.array_module(copy).negative(copy, out=copy)
            out = copy.view(np.uint8)
            self.flagged[key] = out
        return out

    # --- rebuild functions -------------------------------------------------------------------
    def _view(self, ref: Any, dtype: Optional[np.dtype], offset: Any, size: Any, stride: Any,
              requires_grad: Any = False, metadata: Any = None) -> Optional[Tensor]:
        if not isinstance(ref, _StorageRef):
            raise FormatError(f"malformed tensor: its storage is {_short(ref)}")
        if dtype is None:
            raise FormatError("malformed tensor: an untyped storage without a dtype")
        ref.used = True
        offset = _int(offset, "storage offset")
        size, stride = _ints(size, "size"), _ints(stride, "stride")
        if offset < 0 or len(size) != len(stride):
            raise FormatError(f"malformed tensor: offset {offset}, size {size}, stride {stride}")
        if type(requires_grad) is not bool:
            raise FormatError("malformed tensor: requires_grad is not a bool")
        st = ref.storage
        if self.dry:
            return None
        item = dtype.itemsize
        numel = math.prod(size)
        end = offset + 1 + sum((n - 1) * s for n, s in zip(size, stride)) if numel else offset
        if end * item > st.nbytes:
            raise FormatError(
                f"corrupt: a tensor of dtype {_dt._NAMES.get(dtype, dtype)}, size {list(size)}, "
                f"stride {list(stride)} at offset {offset} needs {end * item} bytes but its "
                f"storage {st.key!r} holds {st.nbytes}")
        buf = self._placed(st, dtype)
        if metadata:
            if not isinstance(metadata, dict):
                raise FormatError("malformed tensor: metadata is not a dict")
            # torch keeps conjugation and negation as lazy flags on a view of the storage:
            # apply them to the storage (its size is bounded by the file), never to the view,
            # whose size is not (zeros(1).expand(n, n) is 4 bytes of storage)
            conj = bool(metadata.get("conj")) and dtype.kind == "c"
            neg = bool(metadata.get("neg"))
            if conj or neg:
                buf = self._flagged(st, buf, dtype, conj, neg)
        try:
            if numel == 0:
                arr = _backend.array_module(buf).empty(size, dtype=dtype)
            elif _backend.is_cupy_array(buf):
                arr = _backend.get_cupy().ndarray(size, dtype, memptr=buf.data + offset * item,
                                                  strides=[s * item for s in stride])
            else:
                arr = np.ndarray(size, dtype, buffer=buf, offset=offset * item,
                                 strides=[s * item for s in stride])
        except (ValueError, TypeError, OverflowError, MemoryError) as exc:
            raise FormatError(f"malformed tensor of size {list(size)}: {exc}") from None
        t = Tensor(arr)
        if requires_grad:
            try:
                t.requires_grad = True
            except (RuntimeError, TypeError, ValueError) as exc:
                raise FormatError(f"malformed tensor: {exc}") from None
        return t

    def _rebuild_tensor(self, storage: Any, offset: Any, size: Any, stride: Any) -> Any:
        return self._view(storage, getattr(storage, "dtype", None), offset, size, stride)

    def _rebuild_tensor_v2(self, storage: Any, offset: Any, size: Any, stride: Any,
                           requires_grad: Any, hooks: Any, metadata: Any = None) -> Any:
        return self._view(storage, getattr(storage, "dtype", None), offset, size, stride,
                          requires_grad, metadata)

    def _rebuild_tensor_v3(self, storage: Any, offset: Any, size: Any, stride: Any,
                           requires_grad: Any, hooks: Any, dtype: Any,
                           metadata: Any = None) -> Any:
        if not isinstance(dtype, np.dtype):
            raise FormatError(f"malformed tensor: dtype {_short(dtype)}")
        return self._view(storage, dtype, offset, size, stride, requires_grad, metadata)

    def _rebuild_parameter(self, data: Any, requires_grad: Any, hooks: Any) -> Any:
        if self.dry:
            return None
        if not isinstance(data, Tensor) or type(requires_grad) is not bool:
            raise FormatError("malformed parameter: it does not wrap a tensor")
        try:
            return self.parameter(data, requires_grad=requires_grad)
        except (RuntimeError, TypeError, ValueError) as exc:
            raise FormatError(f"malformed parameter: {exc}") from None

    def _rebuild_parameter_state(self, data: Any, requires_grad: Any, hooks: Any,
                                 state: Any) -> Any:
        p = self._rebuild_parameter(data, requires_grad, hooks)
        _drop_state(state, "parameter")
        return p

    def _rebuild_from_type_v2(self, func: Any, new_type: Any, args: Any, state: Any) -> Any:
        rebuilders = (self._rebuild_tensor, self._rebuild_tensor_v2, self._rebuild_tensor_v3,
                      self._rebuild_parameter, self._rebuild_parameter_state)
        if func not in rebuilders or not isinstance(new_type, _ClassName) or \
                not isinstance(args, tuple):
            raise FormatError("malformed pickle: _rebuild_from_type_v2 with an unexpected "
                              "function or type (tensor subclasses are not read)")
        t = func(*args)
        if t is not None and new_type.cls is self.parameter and \
                not isinstance(t, self.parameter):
            t = self.parameter(t, requires_grad=t.requires_grad)
        _drop_state(state, "tensor")
        return t

    # --- the end -----------------------------------------------------------------------------
    def finish(self, obj: Any) -> Any:
        """Turn storages that no tensor used (saved on their own) into 1-D tensors."""
        if all(r.used for r in self.refs):
            return obj
        memo: Dict[int, Any] = {}

        def fix(x: Any) -> Any:
            if isinstance(x, _StorageRef):
                dt = x.dtype if x.dtype is not None else np.dtype(np.uint8)
                return self._view(x, dt, 0, (x.storage.nbytes // dt.itemsize,), (1,))
            if id(x) in memo:
                return memo[id(x)]
            if type(x) in (dict, collections.OrderedDict, collections.Counter):
                memo[id(x)] = x
                for k in list(x):
                    x[k] = fix(x[k])
            elif type(x) is list:
                memo[id(x)] = x
                x[:] = [fix(v) for v in x]
            elif type(x) is tuple:
                memo[id(x)] = tuple(fix(v) for v in x)
            else:
                return x
            return memo[id(x)]

        return fix(obj)


def _torch_global(module: str, name: str) -> Any:
    """A global of torch's (``torch.nn.modules.linear.Linear``), as mpitensor's object of the
    same path (``mpitensor.nn.modules.linear.Linear``): a whole module saved by torch loads as
    mpitensor's module (``weights_only=False`` or an allowed global only)."""
    ours = "mpitensor" + module[len("torch"):]
    try:
        obj = importlib.import_module(ours)
        for part in name.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError):
        raise FormatError(f"it references {module}.{name}, which mpitensor has no counterpart "
                          f"of ({ours}.{name}); save a state_dict() instead of whole torch "
                          f"objects, or see docs/porting.md for what is missing") from None
    return obj


def _refusing(code: bytes) -> Callable[[_Unpickler], None]:
    real = pickle._Unpickler.dispatch[code[0]]

    def op(self: _Unpickler) -> None:
        if self.weights_only:  # the extension registry is process-wide state, not the file's
            raise FormatError("malformed pickle: copyreg extension codes are refused")
        real(self)

    return op


_Unpickler.dispatch[pickle.BUILD[0]] = _Unpickler._load_build
for _code in (pickle.EXT1, pickle.EXT2, pickle.EXT4):
    _Unpickler.dispatch[_code[0]] = _refusing(_code)
del _code


def _drop_state(state: Any, what: str) -> None:
    if state and (not isinstance(state, tuple) or any(state)):
        # mpitensor Tensors have slots, no __dict__: Python attributes cannot be put back
        _log.warning("ignored the Python attributes saved on a torch %s (%s)", what,
                     _short(state))


def _short(x: Any) -> str:
    r = repr(x)
    return r if len(r) <= 80 else r[:77] + "..."


_ERRORS = (pickle.UnpicklingError, EOFError, ValueError, TypeError, KeyError, IndexError,
           AttributeError, OverflowError, RecursionError, UnicodeDecodeError, struct.error,
           zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, zlib.error,
           MemoryError)


def aligned_empty(n: int, what: str, error: type = FormatError) -> np.ndarray:
    """A fresh 64-byte aligned uint8 array of ``n`` bytes (a view that keeps its base alive),
    for ``what`` of a file; a length no allocation can hold raises ``error`` (a forged one)."""
    try:
        raw = np.empty(n + ALIGN, dtype=np.uint8)
    except (MemoryError, ValueError):
        raise error(f"{what} claims {n} bytes, more than this machine can allocate "
                    "(a forged or corrupt size)") from None
    start = (-raw.ctypes.data) % ALIGN
    return raw[start:start + n]


def _check_sizes(info: zipfile.ZipInfo, total: Optional[int]) -> None:
    if total is not None and info.compress_size > total:
        raise FormatError(f"truncated or corrupt: record {info.filename} claims "
                          f"{info.compress_size} bytes but the file has {total}")
    if info.compress_type == zipfile.ZIP_STORED and info.file_size != info.compress_size:
        raise FormatError(f"corrupt: record {info.filename} has inconsistent sizes")
    if info.file_size > max(info.compress_size, 1) * _MAX_DEFLATE_RATIO:
        raise FormatError(f"corrupt: record {info.filename} claims to expand from "
                          f"{info.compress_size} to {info.file_size} bytes")


def _read_record(zf: zipfile.ZipFile, info: zipfile.ZipInfo, n: int) -> np.ndarray:
    out = aligned_empty(n, f"record {info.filename}")
    view = memoryview(out)
    got = 0
    with zf.open(info) as r:
        while got < n:
            k = r.readinto(view[got:])
            if not k:
                raise FormatError(f"truncated: record {info.filename} ends after {got} of "
                                  f"{n} bytes")
            got += k
        if r.read(1):  # also makes zipfile check the CRC-32 at the record's end
            raise FormatError(f"corrupt: record {info.filename} is longer than {n} bytes")
    return out


def read_zip(fh: BinaryIO, place: Place, weights_only: bool, parameter: type,
             total: Optional[int] = None, budget: Optional[Budget] = None) -> Any:
    """Read a zip-layout ``torch.save`` file from a seekable binary file.

    Args:
        fh: the file, positioned at its start.
        place: puts each storage's bytes on its device (see :data:`Place`).
        weights_only: use only the restricted table of globals (see the module docstring).
        parameter: the class parameters load as (``mpitensor.nn.Parameter``; passed in
            because this module sits below ``nn`` in the layers).
        total: the file's size, where known (checks record sizes before reading them).
        budget: the memory the load may allocate (None: no bound). The records of the
            storages are counted before any is read; copies made for torch's lazy
            conjugation and negation, before each is made.

    Returns:
        The object tree, with mpitensor Tensors and Parameters; views of one storage share it.

    Raises:
        FormatError: the file is not a torch file, is truncated or corrupt, holds what
            mpitensor does not read, or needs more memory than ``budget`` allows.
    """
    try:
        return _read_zip(fh, place, weights_only, parameter, total,
                         Budget() if budget is None else budget)
    except _ERRORS as exc:
        raise FormatError(f"truncated or corrupt torch file ({type(exc).__name__}: "
                          f"{_short(str(exc))})") from None


def _read_zip(fh: BinaryIO, place: Place, weights_only: bool, parameter: type,
              total: Optional[int], budget: Budget) -> Any:
    with zipfile.ZipFile(fh) as zf:  # closing it leaves fh open: the caller owns fh
        return _read_archive(zf, place, weights_only, parameter, total, budget)


def _read_archive(zf: zipfile.ZipFile, place: Place, weights_only: bool, parameter: type,
                  total: Optional[int], budget: Budget) -> Any:
    infos = {i.filename: i for i in zf.infolist()}
    pkls = [n for n in infos if n.endswith("/data.pkl") and n.count("/") == 1]
    if not pkls:
        if any(n.endswith("/constants.pkl") or "/code/" in n for n in infos):
            raise FormatError("it is a TorchScript archive (torch.jit.save), which mpitensor "
                              "does not read; save the model's state_dict() with torch.save")
        raise FormatError("it is a zip file without a <archive>/data.pkl record, not a file "
                          "written by torch.save")
    prefix = pkls[0][:-len("data.pkl")]
    swap = False
    order = infos.get(prefix + "byteorder")
    if order is not None:
        _check_sizes(order, total)
        if order.file_size > _MAX_SMALL_RECORD:
            raise FormatError("corrupt: the byteorder record is too long")
        text = _read_record(zf, order, order.file_size).tobytes()
        if text not in (b"little", b"big"):
            raise FormatError(f"corrupt: byteorder record {_short(text)}")
        swap = text.decode() != sys.byteorder

    def read(key: str, nbytes: int) -> np.ndarray:
        info = infos.get(f"{prefix}data/{key}")
        if info is None:
            raise FormatError(f"corrupt: storage {key!r} has no record {prefix}data/{key}")
        _check_sizes(info, total)
        if info.file_size != nbytes:
            raise FormatError(f"corrupt: storage {key!r} should hold {nbytes} bytes (numel x "
                              f"element size) but its record holds {info.file_size}")
        return _read_record(zf, info, nbytes)

    info = infos[pkls[0]]
    _check_sizes(info, total)
    # each storage reads its whole record (its size is checked against the pickle's claim):
    # their sum, with the pickle's, bounds what reading allocates; refused before any is read
    records = sum(i.file_size for n, i in infos.items() if n.startswith(prefix + "data/"))
    budget.need(info.file_size + records, f"the pickle, and {records} bytes of storages in "
                f"{sum(n.startswith(prefix + 'data/') for n in infos)} records")
    data = _read_record(zf, info, info.file_size)
    unp = _Unpickler(io.BytesIO(data), read, place, weights_only, swap, parameter,
                     budget=budget)
    return unp.finish(unp.load())


def read_legacy(fh: BinaryIO, place: Place, weights_only: bool, parameter: type,
                budget: Optional[Budget] = None) -> Any:
    """Read a legacy-layout ``torch.save`` file (``_use_new_zipfile_serialization=False``).

    Args:
        fh: the file, positioned at its start; read whole into memory when not seekable.
        place: puts each storage's bytes on its device.
        weights_only: as in :func:`read_zip`.
        parameter: as in :func:`read_zip`.
        budget: as in :func:`read_zip` (the storages are counted once their sizes are known,
            before any is read).

    Returns:
        The object tree.

    Raises:
        FormatError: as in :func:`read_zip`.
    """
    try:
        return _read_legacy(fh, place, weights_only, parameter,
                            Budget() if budget is None else budget)
    except _ERRORS as exc:
        raise FormatError(f"truncated or corrupt legacy torch file ({type(exc).__name__}: "
                          f"{_short(str(exc))})") from None


def _read_legacy(fh: BinaryIO, place: Place, weights_only: bool, parameter: type,
                 budget: Budget) -> Any:
    def nothing(data: np.ndarray, location: str) -> np.ndarray:
        return data

    def plain() -> Any:  # a pickle that may hold no storage and no global
        u = _Unpickler(fh, None, nothing, True, False, parameter)
        u.table = {}
        return u.load()

    if plain() != LEGACY_MAGIC:
        raise FormatError("not a legacy torch file: wrong magic number")
    proto = plain()
    if proto != _LEGACY_PROTOCOL:
        raise FormatError(f"legacy torch protocol {_short(proto)} is not supported "
                          f"(only {_LEGACY_PROTOCOL})")
    info = plain()
    if not isinstance(info, dict):
        raise FormatError("corrupt: the legacy system-info record is not a dict")
    order = "little" if info.get("little_endian", True) else "big"
    start = fh.tell()
    # First pass: learn each storage's size; the bytes only follow the object tree.
    first = _Unpickler(fh, None, nothing, weights_only, False, parameter)
    first.dry = True
    first.load()
    keys = plain()
    if not isinstance(keys, list) or not all(type(k) is str for k in keys):
        raise FormatError("corrupt: the legacy storage key list is malformed")
    storages = first.storages
    budget.need(sum(st.nbytes for st in storages.values()),
                f"{len(storages)} storages of the legacy layout")
    for key in keys:
        st = storages.get(key)
        head = fh.read(8)
        if st is None or len(head) != 8:
            raise FormatError(f"corrupt or truncated: legacy storage {key!r}")
        count = int.from_bytes(head, order)
        item = next((r.dtype.itemsize for r in first.refs
                     if r.storage is st and r.dtype is not None), 1)
        if count * item != st.nbytes:
            raise FormatError(f"corrupt: legacy storage {key!r} holds {count} elements, the "
                              f"pickle claims {st.nbytes // item}")
        st.host = aligned_empty(st.nbytes, f"legacy storage {key!r}")
        if fh.readinto(memoryview(st.host)) != st.nbytes:
            raise FormatError(f"truncated: legacy storage {key!r} needs {st.nbytes} bytes")
    if any(st.host is None for st in storages.values()):  # a key the list left out
        raise FormatError("corrupt: the legacy file lacks the data of some storages")
    end = fh.tell()
    fh.seek(start)
    fresh = {}
    for key, st in storages.items():
        fresh[key] = _Storage(key, st.nbytes, st.location)
        fresh[key].host = st.host
    second = _Unpickler(fh, None, place, weights_only, order != sys.byteorder, parameter,
                        storages=fresh, budget=budget)
    obj = second.finish(second.load())
    fh.seek(end)
    return obj
