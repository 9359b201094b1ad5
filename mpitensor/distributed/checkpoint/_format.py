"""torch's on-disk format of distributed checkpoints, read and written without torch.

``.metadata`` is a pickle of ``torch.distributed.checkpoint.metadata.Metadata``; torch reads it
with a plain ``pickle.load``. We write that pickle opcode by opcode (naming torch's classes,
which need not be importable here) and read it with an unpickler that maps exactly those class
names onto ``metadata.py``'s classes and refuses every other global.

Each chunk (or object) in a ``.distcp`` file is one ``torch.save`` record in the zip layout:
``<prefix>/data.pkl`` (a pickle that rebuilds a tensor from a storage) and
``<prefix>/data/<key>`` (the storage's raw little-endian bytes, stored uncompressed). To read a
part of a chunk we find the storage's bytes inside the record from the zip directory, learn
the tensor's storage offset, size and strides from ``data.pkl`` (again by a refusing
unpickler), and view those bytes through a memory map: only the pages of the wanted rows are
read.
"""

from __future__ import annotations

import io
import mmap
import os
import pickle
import struct
import zipfile
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from mpitensor import checkpoint as mpitensor_checkpoint
from mpitensor.distributed.checkpoint import metadata as md
from mpitensor.dtypes import bfloat16

# torch's dtype names, its storage class names, and the NumPy dtypes they stand for
_DTYPES: List[Tuple[str, str, Any]] = [
    ("float32", "FloatStorage", np.float32), ("float64", "DoubleStorage", np.float64),
    ("float16", "HalfStorage", np.float16), ("bfloat16", "BFloat16Storage", bfloat16),
    ("int64", "LongStorage", np.int64), ("int32", "IntStorage", np.int32),
    ("int16", "ShortStorage", np.int16), ("int8", "CharStorage", np.int8),
    ("uint8", "ByteStorage", np.uint8), ("bool", "BoolStorage", np.bool_),
    ("complex64", "ComplexFloatStorage", np.complex64),
    ("complex128", "ComplexDoubleStorage", np.complex128),
]
TORCH_NAME = {np.dtype(d): n for n, _, d in _DTYPES}
_BY_TORCH_NAME = {n: np.dtype(d) for n, _, d in _DTYPES}
_BY_STORAGE = {s: np.dtype(d) for _, s, d in _DTYPES}
# torch's aliases, as torch.float, torch.long, ... pickle under their canonical names anyway
_BY_TORCH_NAME.update({"float": _BY_TORCH_NAME["float32"], "double": _BY_TORCH_NAME["float64"],
                       "half": _BY_TORCH_NAME["float16"], "long": _BY_TORCH_NAME["int64"],
                       "int": _BY_TORCH_NAME["int32"], "short": _BY_TORCH_NAME["int16"]})

_META = "torch.distributed.checkpoint.metadata"
_RECORD_ALIGN = 64
_FS = "torch.distributed.checkpoint.filesystem"


class FormatError(ValueError):
    """A checkpoint file that is not what the format says (named by the caller)."""


def torch_dtype_name(dtype: Any) -> str:
    """torch's name of a NumPy dtype (``float32``); a clear error for dtypes torch lacks."""
    dt = np.dtype(dtype)
    try:
        return TORCH_NAME[dt]
    except KeyError:
        raise TypeError(f"dtype {dt} has no torch counterpart; distributed checkpoints hold "
                        f"{', '.join(sorted(TORCH_NAME.values()))}") from None


# ------------------------------------------------------------------ writing the metadata pickle
class _Writer:
    """Protocol-2 pickle opcodes for the few shapes ``Metadata`` is made of."""

    def __init__(self) -> None:
        self.out = io.BytesIO()
        self.out.write(b"\x80\x02")

    def glob(self, module: str, name: str) -> None:
        self.out.write(b"c" + module.encode() + b"\n" + name.encode() + b"\n")

    def value(self, x: Any) -> None:  # noqa: C901 - one branch per kind of value, all short
        w = self.out.write
        if x is None:
            w(b"N")
        elif x is True or x is False:
            w(b"\x88" if x else b"\x89")
        elif isinstance(x, int):
            if -(2 ** 31) <= x < 2 ** 31:
                w(b"J" + struct.pack("<i", x))
            else:
                raw = x.to_bytes((x.bit_length() + 8) // 8, "little", signed=True)
                w(b"\x8a" + bytes([len(raw)]) + raw)
        elif isinstance(x, float):
            w(b"G" + struct.pack(">d", x))
        elif isinstance(x, str):
            data = x.encode("utf-8", "surrogatepass")
            w(b"X" + struct.pack("<I", len(data)) + data)
        elif isinstance(x, tuple):
            w(b"(")
            for v in x:
                self.value(v)
            w(b"t")
        elif isinstance(x, list):
            w(b"](")
            for v in x:
                self.value(v)
            w(b"e")
        elif isinstance(x, dict):
            w(b"}(")
            for k, v in x.items():
                self.value(k)
                self.value(v)
            w(b"u")
        elif isinstance(x, np.dtype):
            self.glob("torch", torch_dtype_name(x))
        else:
            self.obj(x)

    def size(self, dims: Optional[Tuple[int, ...]]) -> None:
        if dims is None:
            self.value(None)
            return
        self.glob("torch", "Size")
        self.value((tuple(int(d) for d in dims),))
        self.out.write(b"R")

    def new(self, module: str, name: str, state: Any) -> None:
        self.glob(module, name)
        self.out.write(b")\x81")  # cls.__new__(cls)
        if state is not None:
            self.value(state)
            self.out.write(b"b")

    def obj(self, x: Any) -> None:
        if isinstance(x, md.ChunkStorageMetadata):
            self.new(_META, "ChunkStorageMetadata", None)
            self._fields_then_build({"offsets": ("size", x.offsets),
                                     "sizes": ("size", x.sizes)})
        elif isinstance(x, md.MetadataIndex):
            self.new(_META, "MetadataIndex", None)
            self._fields_then_build({"fqn": ("value", x.fqn), "offset": ("size", x.offset),
                                     "index": ("value", x.index)})
        elif isinstance(x, md.TensorProperties):
            self.new(_META, "TensorProperties", None)
            self.out.write(b"(")
            self.value(np.dtype(x.dtype))
            self.glob("torch.serialization", "_get_layout")
            self.value(("torch.strided",))
            self.out.write(b"R")
            self.value(bool(x.requires_grad))
            self.glob(_META, "_MEM_FORMAT_ENCODING")
            self.value((0,))  # torch's code of contiguous_format
            self.out.write(b"R")
            self.value(bool(x.pin_memory))
            self.out.write(b"tb")
        elif isinstance(x, md.TensorStorageMetadata):
            self.new(_META, "TensorStorageMetadata", None)
            self._fields_then_build({"properties": ("value", x.properties),
                                     "size": ("size", x.size), "chunks": ("value", x.chunks)})
        elif isinstance(x, md.BytesStorageMetadata):
            self.new(_META, "BytesStorageMetadata", None)
        elif isinstance(x, md.StorageInfo):
            self.new(_FS, "_StorageInfo", vars(x))
        elif isinstance(x, md.StorageMeta):
            self.new(_META, "StorageMeta", vars(x))
        elif isinstance(x, md.Metadata):
            self.new(_META, "Metadata", vars(x))
        else:
            raise TypeError(f"cannot write {type(x).__name__} into checkpoint metadata")

    def _fields_then_build(self, fields: Dict[str, Tuple[str, Any]]) -> None:
        self.out.write(b"}(")
        for name, (kind, v) in fields.items():
            self.value(name)
            self.size(v) if kind == "size" else self.value(v)
        self.out.write(b"ub")


def dump_metadata(meta: md.Metadata) -> bytes:
    """``meta`` as the pickle torch's ``FileSystemReader`` reads."""
    w = _Writer()
    w.value(meta)
    w.out.write(b".")
    return w.out.getvalue()


# ------------------------------------------------------------------ reading the metadata pickle
def _size(dims: Any = ()) -> Tuple[int, ...]:
    return tuple(int(d) for d in dims)


def _path(*parts: Any) -> str:
    return os.path.join(*(str(p) for p in parts)) if parts else ""


_METADATA_GLOBALS: Dict[Tuple[str, str], Any] = {
    (_META, "Metadata"): md.Metadata, (_META, "TensorStorageMetadata"): md.TensorStorageMetadata,
    (_META, "BytesStorageMetadata"): md.BytesStorageMetadata,
    (_META, "ChunkStorageMetadata"): md.ChunkStorageMetadata,
    (_META, "TensorProperties"): md.TensorProperties, (_META, "MetadataIndex"): md.MetadataIndex,
    (_META, "StorageMeta"): md.StorageMeta, (_FS, "_StorageInfo"): md.StorageInfo,
    (_META, "_MEM_FORMAT_ENCODING"): lambda code: "contiguous_format" if code == 0 else code,
    ("torch.serialization", "_get_layout"): lambda name: str(name).rpartition(".")[2],
    ("torch", "Size"): _size, ("pathlib", "PosixPath"): _path, ("pathlib", "Path"): _path,
    ("pathlib", "WindowsPath"): _path, ("collections", "OrderedDict"): dict,
    ("builtins", "set"): set, ("builtins", "frozenset"): frozenset,
}
_METADATA_GLOBALS.update({("torch", n): d for n, d in _BY_TORCH_NAME.items()})


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        try:
            return _METADATA_GLOBALS[(module, name)]
        except KeyError:
            raise FormatError(f"it names {module}.{name}, which is not part of the checkpoint "
                              f"metadata format") from None


def load_metadata(data: bytes) -> md.Metadata:
    """Parse a ``.metadata`` file written by torch or by us; FormatError if it is neither."""
    try:
        meta = _MetadataUnpickler(io.BytesIO(data)).load()
    except FormatError:
        raise
    except Exception as exc:  # a truncated or foreign file: pickle raises many kinds
        raise FormatError(f"it is not a readable pickle ({type(exc).__name__}: {exc})") from None
    if not isinstance(meta, md.Metadata):
        raise FormatError(f"it holds a {type(meta).__name__}, not checkpoint Metadata")
    return meta


# ------------------------------------------------------------------ one torch.save record
class _Window(io.RawIOBase):
    """A read-only file over ``mm[start:start + length]``, without copying it."""

    def __init__(self, mm: mmap.mmap, start: int, length: int) -> None:
        super().__init__()
        self.mm, self.start, self.length, self.pos = mm, start, length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, pos: int, whence: int = 0) -> int:
        base = (0, self.pos, self.length)[whence]
        self.pos = max(0, base + pos)
        return self.pos

    def readinto(self, b: Any) -> int:
        n = max(0, min(len(b), self.length - self.pos))
        at = self.start + self.pos
        b[:n] = self.mm[at:at + n]
        self.pos += n
        return n


class _Rebuilt:
    """What ``data.pkl`` says of its tensor: storage key and dtype, offset, size, stride."""

    def __init__(self, storage: Tuple[str, np.dtype, int], offset: int, size: Tuple[int, ...],
                 stride: Tuple[int, ...]) -> None:
        self.key, self.dtype, self.numel = storage
        self.offset, self.size, self.stride = int(offset), _size(size), _size(stride)


def _rebuild(storage: Any, offset: Any, size: Any, stride: Any, *_: Any) -> _Rebuilt:
    return _Rebuilt(storage, offset, size, stride)


def _rebuild_parameter(data: Any, *_: Any) -> Any:
    return data


class _RecordUnpickler(pickle.Unpickler):
    """``data.pkl`` of a record holding one tensor; anything else is refused."""

    def find_class(self, module: str, name: str) -> Any:
        if module == "torch._utils" and name in ("_rebuild_tensor_v2", "_rebuild_tensor"):
            return _rebuild
        if module == "torch._utils" and name == "_rebuild_parameter":
            return _rebuild_parameter
        if module == "torch" and name in _BY_STORAGE:
            return _BY_STORAGE[name]
        if (module, name) == ("collections", "OrderedDict"):
            return dict
        raise FormatError(f"its tensor record names {module}.{name}")

    def persistent_load(self, pid: Any) -> Tuple[str, np.dtype, int]:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise FormatError(f"its tensor record has a storage reference {pid!r}")
        _, dtype, key, _location, numel = pid
        if not isinstance(dtype, np.dtype):
            raise FormatError(f"its tensor record has a storage of type {dtype!r}")
        return str(key), dtype, int(numel)


def tensor_view(mm: mmap.mmap, start: int, length: int) -> np.ndarray:
    """A read-only array over the tensor recorded in ``mm[start:start + length]``, unread.

    The array is a strided view of the memory map: slicing it and copying the slice reads
    only the pages that slice touches.
    """
    with zipfile.ZipFile(_Window(mm, start, length)) as zf:
        names = [n for n in zf.namelist() if n.endswith("/data.pkl")]
        if len(names) != 1:
            raise FormatError("a chunk record without exactly one data.pkl")
        prefix = names[0][: -len("data.pkl")]
        rebuilt = _RecordUnpickler(io.BytesIO(zf.read(names[0]))).load()
        if not isinstance(rebuilt, _Rebuilt):
            raise FormatError(f"a chunk record holds a {type(rebuilt).__name__}, not a tensor")
        info = zf.getinfo(prefix + "data/" + rebuilt.key)
    if info.compress_type != zipfile.ZIP_STORED:
        raise FormatError("a chunk's storage is compressed")
    head = mm[start + info.header_offset: start + info.header_offset + 30]
    name_len, extra_len = struct.unpack("<HH", head[26:30])
    data_at = start + info.header_offset + 30 + name_len + extra_len
    itemsize = rebuilt.dtype.itemsize
    if info.file_size < rebuilt.numel * itemsize or data_at + info.file_size > start + length:
        raise FormatError("a chunk's storage is shorter than its tensor")
    if rebuilt.numel == 0 or 0 in rebuilt.size:
        return np.empty(rebuilt.size, rebuilt.dtype)
    flat = np.frombuffer(mm, rebuilt.dtype, rebuilt.numel, data_at)
    last = rebuilt.offset + sum((n - 1) * s for n, s in zip(rebuilt.size, rebuilt.stride))
    if rebuilt.offset < 0 or last >= rebuilt.numel or min(rebuilt.stride, default=0) < 0:
        raise FormatError("a chunk's tensor reaches outside its storage")
    return np.lib.stride_tricks.as_strided(
        flat[rebuilt.offset:], rebuilt.size, tuple(s * itemsize for s in rebuilt.stride),
        writeable=False)


def read_object(mm: mmap.mmap, start: int, length: int) -> Any:
    """The object recorded in ``mm[start:start + length]`` (a ``torch.save`` record)."""
    return mpitensor_checkpoint.load(io.BytesIO(mm[start:start + length]), weights_only=True)


class _From(io.RawIOBase):
    """``fh`` seen from ``base`` on: a zip writer put here records offsets within its record."""

    def __init__(self, fh: Any, base: int) -> None:
        super().__init__()
        self.fh, self.base = fh, base

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        return self.fh.write(b)

    def tell(self) -> int:
        return self.fh.tell() - self.base

    def seek(self, pos: int, whence: int = 0) -> int:
        if whence == 0:
            pos += self.base
        return self.fh.seek(pos, whence) - self.base

    def flush(self) -> None:
        self.fh.flush()


def write_record(obj: Any, fh: Any) -> Tuple[int, int]:
    """Append ``obj`` to ``fh`` as a ``torch.save`` record; return its (offset, length).

    The record's zip offsets count from its own start (torch reads it as a file of its own),
    and it starts at a multiple of 64 bytes, so that its storages, aligned within it, are
    aligned in the file too.
    """
    start = fh.tell()
    if start % _RECORD_ALIGN:
        fh.write(bytes(_RECORD_ALIGN - start % _RECORD_ALIGN))
        start = fh.tell()
    mpitensor_checkpoint.save(obj, _From(fh, start), format="torch")
    fh.seek(0, io.SEEK_END)
    return start, fh.tell() - start
