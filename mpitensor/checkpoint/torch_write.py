"""Writing the files ``torch.save`` writes (its zip layout), which ``torch.load(weights_only=True)``
reads: the object tree pickled with every tensor as a call of ``torch._utils``' rebuild functions
on a persistent storage id, and each storage's raw bytes in a record of its own, aligned to 64
bytes as torch aligns them. ``check_weights_only`` refuses, before anything is written, what
such a load would refuse.
"""

from __future__ import annotations

import codecs
import collections
import io
import pickle
import secrets
import shutil
import struct
import sys
import tempfile
import zipfile
from typing import Any, BinaryIO, Callable, Dict, List, Tuple

import numpy as np

from mpitensor import backend as _backend
from mpitensor import dtypes as _dt
from mpitensor.checkpoint.torch_format import ALIGN, PAD_FIELD, STORAGE_OF
from mpitensor.tensor import Size, Tensor

__all__ = ["write_zip", "plan_zip", "check_weights_only"]


class _Global:
    """A global written by name (``torch._utils _rebuild_tensor_v2``); torch need not exist."""

    __slots__ = ("module", "name")

    def __init__(self, module: str, name: str) -> None:
        self.module = module
        self.name = name

    def __call__(self, *args: Any) -> Any:
        # pickle insists that a reduce function be callable; this one is only ever written
        raise TypeError(f"{self.module}.{self.name} is a name to write, not a function")


class _OutStorage:
    """One storage to write: a host or device array whose bytes go to ``data/<key>``."""

    __slots__ = ("key", "root", "dtype", "location")

    def __init__(self, key: str, root: Any, dtype: np.dtype) -> None:
        self.key = key
        self.root = root  # C-contiguous; kept alive so its id is not reused while pickling
        self.dtype = dtype
        self.location = str(_backend.device_of(root))

    def host_bytes(self) -> np.ndarray:
        return _backend.to_numpy(self.root.reshape(-1).view(np.uint8))


def _ptr(a: Any) -> int:
    return int(a.data.ptr) if _backend.is_cupy_array(a) else int(a.ctypes.data)


def _contiguous_strides(size: Tuple[int, ...]) -> Tuple[int, ...]:
    out, acc = [], 1
    for n in reversed(size):
        out.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(out))


class _Pickler(pickle._Pickler):
    """Pickles the object tree as torch does: protocol 2, storages as persistent ids."""

    def __init__(self, file: BinaryIO, parameter: type) -> None:
        super().__init__(file, protocol=2)
        self.parameter = parameter
        self.storages: List[_OutStorage] = []
        self.by_root: Dict[int, _OutStorage] = {}
        self.globals: Dict[Tuple[str, str], _Global] = {}
        self.names = {np.dtype(dt): name for dt, name in _dt._NAMES.items()}

    def g(self, module: str, name: str) -> _Global:
        key = (module, name)
        if key not in self.globals:
            self.globals[key] = _Global(module, name)
        return self.globals[key]

    def save(self, obj: Any, save_persistent_id: bool = True) -> None:
        if isinstance(obj, np.dtype) and obj in self.names:
            obj = self.g("torch", self.names[obj])
        elif type(obj) is bytes and not obj:
            # Protocol 2 writes b"" as a call of bytes(), a global torch's weights-only
            # loader does not list; the non-empty form goes through _codecs.encode.
            self.save_reduce(codecs.encode, ("", "latin1"), obj=obj)
            return
        if type(obj) is _Global:
            self.framer.commit_frame()
            memo = self.memo.get(id(obj))
            if memo is not None:
                self.write(self.get(memo[0]))
                return
            self.write(pickle.GLOBAL + obj.module.encode() + b"\n" + obj.name.encode() + b"\n")
            self.memoize(obj)
            return
        super().save(obj, save_persistent_id)

    def persistent_id(self, obj: Any) -> Any:
        if type(obj) is not _OutStorage:
            return None
        item = obj.dtype.itemsize
        nbytes = int(obj.root.nbytes)
        name = self.names[obj.dtype]
        if name in STORAGE_OF:
            return ("storage", self.g("torch", STORAGE_OF[name]), obj.key, obj.location,
                    nbytes // item)
        return ("storage", self.g("torch.storage", "UntypedStorage"), obj.key, obj.location,
                nbytes)

    def reducer_override(self, obj: Any) -> Any:
        t = type(obj)
        if isinstance(obj, Tensor):
            hooks = collections.OrderedDict()
            if isinstance(obj, self.parameter):
                return (self.g("torch._utils", "_rebuild_parameter"),
                        (Tensor._wrap(obj._data), bool(obj.requires_grad), hooks))
            storage, offset, size, stride = self.layout(obj._data)
            args = (storage, offset, size, stride, bool(obj.requires_grad), hooks)
            if self.names[storage.dtype] in STORAGE_OF:
                return (self.g("torch._utils", "_rebuild_tensor_v2"), args)
            return (self.g("torch._utils", "_rebuild_tensor_v3"), args + (storage.dtype,))
        if t is Size:
            return (self.g("torch", "Size"), (tuple(obj),))
        if t is _backend.device:
            args = (obj.type,) if obj.index is None else (obj.type, obj.index)
            return (self.g("torch", "device"), args)
        return NotImplemented

    def layout(self, arr: Any) -> Tuple[_OutStorage, int, Tuple[int, ...], Tuple[int, ...]]:
        """The storage, offset, size and stride that describe ``arr`` in torch's terms.

        Views of one C-contiguous array share one storage (the whole array, as torch writes
        it), so they load as views again; anything else is written as a compact copy.
        """
        size = tuple(int(n) for n in arr.shape)
        dt = arr.dtype
        if dt.byteorder not in "=|":
            arr = arr.astype(dt.newbyteorder("="))
            dt = arr.dtype
        item = dt.itemsize
        kind = type(arr)
        root = arr
        while isinstance(root.base, kind):
            root = root.base
        strides = [0 if n == 1 else int(s) for n, s in zip(size, arr.strides)]
        offset = _ptr(arr) - _ptr(root)
        share = (arr.size > 0 and root.flags.c_contiguous and root.nbytes % item == 0
                 and offset >= 0 and offset % item == 0
                 and all(s >= 0 and s % item == 0 for s in strides)
                 and offset + item + sum((n - 1) * s for n, s in zip(size, strides))
                 <= root.nbytes)
        if share:
            out = self.by_root.get(id(root))
            if out is None:
                out = _OutStorage(str(len(self.storages)), root, dt)
                self.storages.append(out)
                self.by_root[id(root)] = out
            if out.dtype == dt:
                return out, offset // item, size, tuple(s // item for s in strides)
        compact = arr.copy(order="C")  # (ascontiguousarray would make 0-d arrays 1-d)
        out = _OutStorage(str(len(self.storages)), compact, dt)
        self.storages.append(out)
        return out, 0, size, _contiguous_strides(size)


def check_weights_only(obj: Any, path: str = "obj") -> None:
    """Raise TypeError, naming where, if ``obj`` holds what ``torch.load(weights_only=True)``
    would refuse.

    Args:
        obj: the object tree.
        path: how to name ``obj`` in the message.

    Raises:
        TypeError: a leaf of another type (the message gives its path in ``obj``).
    """
    seen: set = set()
    stack: List[Tuple[Any, str]] = [(obj, path)]
    while stack:
        x, where = stack.pop()
        t = type(x)
        if x is None or t in (bool, int, float, complex, str, bytes, bytearray, Size,
                              _backend.device) or isinstance(x, Tensor):
            continue
        if isinstance(x, np.dtype):
            if x in _dt._NAMES:
                continue
        elif t in (list, tuple, set):
            if id(x) not in seen:
                seen.add(id(x))
                stack.extend((v, f"{where}[{i}]") for i, v in enumerate(x))
            continue
        elif t in (dict, collections.OrderedDict, collections.Counter):
            if id(x) not in seen:
                seen.add(id(x))
                for k, v in x.items():
                    stack.append((k, f"{where} key {k!r}"))
                    stack.append((v, f"{where}[{k!r}]"))
            continue
        hint = ("wrap it as a tensor (mpitensor.tensor(a)) or " if isinstance(x, np.ndarray)
                else "use .item() or " if isinstance(x, np.generic) else "")
        raise TypeError(
            f"cannot save {where} in torch's format: objects of type "
            f"{t.__module__}.{t.__qualname__} are not among what torch.load(weights_only=True) "
            f"reads (tensors, parameters, dict, OrderedDict, list, tuple, set, numbers, str, "
            f"bytes, None, dtypes, Size, device); {hint}save with format='mpitensor', or pass "
            f"allow_pickle=True (then loading needs weights_only=False)")


def write_zip(obj: Any, fh: BinaryIO, allow_pickle: bool, parameter: type) -> None:
    """Write ``obj`` to ``fh`` in torch's zip layout, readable by ``torch.load``.

    Args:
        obj: the object tree.
        fh: a binary file opened for writing; a non-seekable one is fed from a temporary file.
        allow_pickle: pickle leaves of other types instead of refusing them (torch then needs
            ``weights_only=False`` to read the file).
        parameter: the class written as ``torch.nn.Parameter`` (as in :func:`read_zip`).

    Raises:
        TypeError: ``obj`` holds a type the weights-only format does not (without
            ``allow_pickle``).
    """
    plan = plan_zip(obj, allow_pickle, parameter)
    plan(fh)


def plan_zip(obj: Any, allow_pickle: bool, parameter: type) -> Callable[[BinaryIO], None]:
    """Pickle ``obj`` now (so type errors come before a file is touched); return the writer."""
    if not allow_pickle:
        check_weights_only(obj)
    buf = io.BytesIO()
    pickler = _Pickler(buf, parameter)
    try:
        pickler.dump(obj)
    except pickle.PicklingError as exc:
        raise TypeError(f"cannot save obj in torch's format: {exc}") from None
    data = buf.getvalue()
    storages = pickler.storages

    def write(fh: BinaryIO) -> None:
        try:
            seekable = fh.seekable()
            fh.tell()
        except (AttributeError, OSError, ValueError):
            seekable = False
        if not seekable:
            with tempfile.TemporaryFile() as tmp:
                write(tmp)
                tmp.seek(0)
                shutil.copyfileobj(tmp, fh)
            return
        fh = _FromHere(fh)
        with zipfile.ZipFile(fh, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
            _put(zf, fh, "archive/data.pkl", data)
            _put(zf, fh, "archive/.format_version", b"1")
            _put(zf, fh, "archive/.storage_alignment", str(ALIGN).encode())
            _put(zf, fh, "archive/byteorder", sys.byteorder.encode())
            for st in storages:
                _put(zf, fh, f"archive/data/{st.key}", memoryview(st.host_bytes()))
            _put(zf, fh, "archive/version", b"3\n")
            _put(zf, fh, "archive/.data/serialization_id",
                 f"{secrets.randbits(128):040d}".encode())

    return write


class _FromHere:
    """A seekable binary file seen from where it stands now: position 0 is the record's first
    byte. zipfile writes the offsets ``fh.tell()`` gives it, and torch's reader counts them from
    the record's start, so a record written after other bytes needs them counted from there."""

    def __init__(self, fh: BinaryIO) -> None:
        self._fh = fh
        self._base = fh.tell()

    def tell(self) -> int:
        return self._fh.tell() - self._base

    def seek(self, pos: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_SET:
            pos += self._base
        return self._fh.seek(pos, whence) - self._base

    def write(self, data: Any) -> int:
        return self._fh.write(data)

    def flush(self) -> None:
        self._fh.flush()

    def seekable(self) -> bool:
        return True


def _put(zf: zipfile.ZipFile, fh: BinaryIO, name: str, data: Any) -> None:
    """Add one stored record whose data starts at a multiple of 64 bytes, as torch's do."""
    n = len(data) if isinstance(data, bytes) else data.nbytes
    info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
    info.compress_type = zipfile.ZIP_STORED
    info.file_size = n
    zip64 = n * 1.05 > zipfile.ZIP64_LIMIT  # what zipfile decides too; it adds a 20-byte field
    header = 30 + len(name.encode()) + (20 if zip64 else 0) + 4
    pad = (-(fh.tell() + header)) % ALIGN
    info.extra = struct.pack("<HH", PAD_FIELD, pad) + b"Z" * pad
    with zf.open(info, "w", force_zip64=zip64) as w:
        w.write(data)
