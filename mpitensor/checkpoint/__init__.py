"""Checkpoints: ``save(obj, f)`` / ``load(f)`` in a safe, checksummed, atomically written format.

:func:`load` also reads the files ``torch.save`` writes (zip and legacy layouts, without torch
and without running code: see ``mpitensor.checkpoint.torch_format``) and ``.safetensors`` files
(``mpitensor.checkpoint.safetensors``); it tells the formats apart by their first bytes.
:func:`save` writes torch's zip layout for paths ending in ``.pt`` / ``.pth`` (or with
``format="torch"``), which ``torch.load(weights_only=True)`` reads, safetensors for
``.safetensors``, and the format below for everything else.

``obj`` may nest dicts (any keys of the supported leaf types), OrderedDicts, lists and tuples of
Tensors (``nn.Parameter`` included), NumPy and CuPy arrays, NumPy scalars and dtypes, Python
``int`` (any size) / ``float`` / ``complex`` / ``bool`` / ``str`` / ``bytes`` and ``None``: enough
for ``model.state_dict()``, ``optimizer.state_dict()``, sampler state, epoch counters and RNG
states (``mpitensor.get_rng_state()``, ``numpy.random.Generator.bit_generator.state``,
``random.getstate()``). Loading this format never runs pickle unless asked
(``weights_only=False``); torch files go through a restricted unpickler that calls nothing but
mpitensor's own stand-ins (see docs/checkpoints.md).

File layout (all integers little-endian)::

    offset 0   8 bytes   magic b"MPITCKPT"
           8   u32       format version (1)
          12   u32       flags (bit 0: the file holds pickled leaves)
          16   u64       header length H
          24   u64       payload length P
          32   32 bytes  SHA-256 of the header
          64   H bytes   header: UTF-8 JSON {"tree": ..., "arrays": [...], "payload_sha256": ...}
                         zero padding to a multiple of 64
                 P bytes   payload: raw C-order array bytes, each array at a 64-byte aligned
                           offset (relative to the payload start), zero padding between

A file is written to a temporary file in the target's directory, flushed and fsynced, renamed
over the target with ``os.replace`` and the directory fsynced, so a crash leaves either the old
file or the new one, never half of one. The writer holds an ``flock`` on its temporary file
(``.<name>.mpitensor_<random>.tmp``) from its creation to the rename; a writer killed on the way
leaves the file behind, unlocked, and the next save into that directory removes every such
file nobody holds (a live writer's, locked, is never touched).

Example:
    >>> import io, mpitensor as mt
    >>> buf = io.BytesIO()
    >>> save({"w": mt.ones(2), "epoch": 3}, buf)
    >>> _ = buf.seek(0)
    >>> load(buf)["epoch"]
    3
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import io
import json
import logging
import os
import pickle
import struct
from typing import Any, BinaryIO, Dict, List, Optional, Tuple

import numpy as np

from mpitensor import backend as _backend
from mpitensor import dtypes as _dt
from mpitensor._base import config as _config
from mpitensor.checkpoint import safe_globals as _safe_globals
from mpitensor.checkpoint import torch_format as _tf
from mpitensor.checkpoint import torch_write as _tw
from mpitensor.checkpoint._files import (
    SNIFF,
    STREAM_CHUNK,
    BadFile,
    CheckpointError,
    PathOrFile,
    file_name,
    read_rest,
    write_to,
)
from mpitensor.checkpoint._placement import Reraise, placement, to_gpu
from mpitensor.checkpoint.safetensors import (
    is_safetensors,
    load_safetensors,
    read_safetensors,
    safetensors_bytes,
    save_safetensors,
)
from mpitensor.nn.parameter import Parameter
from mpitensor.tensor import Size, Tensor

__all__ = ["save", "load", "save_on_rank0", "load_on_all_ranks", "save_safetensors",
           "load_safetensors", "CheckpointError"]

_log = logging.getLogger("mpitensor.checkpoint")
CheckpointError.__module__ = __name__  # defined with the file helpers; its public home is here

MAGIC = b"MPITCKPT"
VERSION = 1
_PREFIX = struct.Struct("<8sIIQQ32s")  # magic, version, flags, header len, payload len, sha
_ALIGN = 64
_FLAG_PICKLE = 1
_ARRAY_KINDS = "biufcSU"  # numeric, bool and fixed-width string dtypes; never object/void
_MAX_HEADER = 1 << 31
_FORMATS = ("mpitensor", "torch", "safetensors")
_BY_SUFFIX = {".pt": "torch", ".pth": "torch", ".safetensors": "safetensors"}



def _storable(dt: np.dtype) -> bool:
    """Whether the safe format stores arrays of ``dt`` (bfloat16 is NumPy kind "V", but no
    record: its 2-byte elements are stored as they are)."""
    return (dt.kind in _ARRAY_KINDS and dt.fields is None) or dt == _dt.bfloat16


def _dtype_str(dt: np.dtype) -> str:
    """The header's name of ``dt``: NumPy's byte-order string, or ``"bfloat16"`` (whose
    NumPy string, ``"<V2"``, would read back as raw bytes)."""
    return "bfloat16" if dt == _dt.bfloat16 else dt.str


def _pad(n: int) -> int:
    return (-n) % _ALIGN


# -------------------------------------------------------------------------------------- encoding
class _Encoder:
    """Turns an object tree into a JSON-able tree plus a list of host arrays."""

    def __init__(self, allow_pickle: bool) -> None:
        self.allow_pickle = allow_pickle
        self.arrays: List[np.ndarray] = []
        self.meta: List[Dict[str, Any]] = []
        self.memo: Dict[int, Tuple[Any, int]] = {}  # id(array or tensor) -> (obj, index)
        self.pickled = False

    def _add(self, arr: Any, key: Any, extra: Dict[str, Any]) -> int:
        if key is not None and id(key) in self.memo:
            return self.memo[id(key)][1]
        host = _backend.to_numpy(arr)
        if not _storable(host.dtype):
            raise TypeError(f"cannot save an array of dtype {host.dtype}: only numeric, bool and "
                            f"fixed-width string dtypes are stored")
        if not host.flags.c_contiguous:
            host = host.copy(order="C")  # (np.ascontiguousarray would make 0-d arrays 1-d)
        i = len(self.arrays)
        self.arrays.append(host)
        self.meta.append({"dtype": _dtype_str(host.dtype), "shape": list(host.shape), **extra})
        if key is not None:
            self.memo[id(key)] = (key, i)  # keep key alive so its id is not reused
        return i

    def encode(self, x: Any, path: str) -> Any:
        if x is None:
            return {"k": "none"}
        if isinstance(x, Tensor):
            arr = x._data
            i = self._add(arr, x, {"device": str(_backend.device_of(arr))})
            return {"k": "tensor", "i": i, "rg": bool(x.requires_grad)}
        if isinstance(x, np.ndarray) or _backend.is_cupy_array(x):
            i = self._add(x, x, {"device": str(_backend.device_of(x))})
            return {"k": "ndarray", "i": i}
        if isinstance(x, np.generic):
            if not _storable(x.dtype):
                raise TypeError(f"cannot save {path}: NumPy scalar of dtype {x.dtype}")
            return {"k": "npscalar", "i": self._add(np.asarray(x), None, {"device": "cpu"})}
        t = type(x)
        if t is bool:
            return {"k": "bool", "v": x}
        if t is int:
            return {"k": "int", "v": str(x)}
        if t is float:
            return {"k": "float", "v": x.hex()}
        if t is complex:
            return {"k": "complex", "v": [x.real.hex(), x.imag.hex()]}
        if t is str:
            return {"k": "str", "v": x}
        if t in (bytes, bytearray):
            i = self._add(np.frombuffer(bytes(x), dtype=np.uint8), None, {"device": "cpu"})
            return {"k": t.__name__, "i": i}
        if t in (list, tuple, Size):
            return {"k": {list: "list", tuple: "tuple", Size: "size"}[t],
                    "v": [self.encode(v, f"{path}[{i}]") for i, v in enumerate(x)]}
        if t in (dict, collections.OrderedDict):
            items = []
            for k, v in x.items():
                items.append([self.encode(k, f"{path} key {k!r}"),
                              self.encode(v, f"{path}[{k!r}]")])
            return {"k": "dict" if t is dict else "odict", "v": items}
        if isinstance(x, np.dtype):
            return {"k": "dtype", "v": _dtype_str(x)}
        if self.allow_pickle:
            self.pickled = True
            data = pickle.dumps(x, protocol=pickle.HIGHEST_PROTOCOL)
            return {"k": "pickle", "i": self._add(np.frombuffer(data, np.uint8), None,
                                                  {"device": "cpu"})}
        raise TypeError(
            f"cannot save {path}: objects of type {t.__module__}.{t.__qualname__} are not part of "
            f"the safe checkpoint format (dict, OrderedDict, list, tuple, Tensor, NumPy/CuPy "
            f"array, NumPy scalar, int, float, complex, bool, str, bytes, None); convert it "
            f"(e.g. dict(x), list(x)) or leave allow_pickle at its default (then loading "
            f"needs weights_only=False or the class in mpitensor.serialization."
            f"add_safe_globals)"
        )


def _serialize(obj: Any, allow_pickle: bool) -> Tuple[bytes, List[np.ndarray], int]:
    """Return (prefix + header + padding, arrays, flags) for ``obj``."""
    enc = _Encoder(allow_pickle)
    tree = enc.encode(obj, "obj")
    sha = hashlib.sha256()
    offset = 0
    zeros = bytes(_ALIGN)
    for arr, meta in zip(enc.arrays, enc.meta):
        meta["offset"] = offset
        meta["nbytes"] = int(arr.nbytes)
        if arr.nbytes:
            sha.update(_raw(arr))
        pad = _pad(arr.nbytes)
        sha.update(zeros[:pad])
        offset += arr.nbytes + pad
    header = {"format": "mpitensor-checkpoint", "tree": tree, "arrays": enc.meta,
              "payload_sha256": sha.hexdigest()}
    hbytes = json.dumps(header, separators=(",", ":"), allow_nan=False).encode("utf-8")
    flags = _FLAG_PICKLE if enc.pickled else 0
    prefix = _PREFIX.pack(MAGIC, VERSION, flags, len(hbytes), offset,
                          hashlib.sha256(hbytes).digest())
    head = prefix + hbytes + bytes(_pad(len(prefix) + len(hbytes)))
    return head, enc.arrays, flags


def _raw(arr: np.ndarray) -> memoryview:
    return memoryview(arr.reshape(-1).view(np.uint8))


def _write(fh: BinaryIO, head: bytes, arrays: List[np.ndarray]) -> None:
    fh.write(head)
    zeros = bytes(_ALIGN)
    for arr in arrays:
        if arr.nbytes:
            fh.write(_raw(arr))
        pad = _pad(arr.nbytes)
        if pad:
            fh.write(zeros[:pad])


def _format_for(format: Optional[str], f: Any) -> str:
    if format is None:
        if isinstance(f, (str, bytes, os.PathLike)):
            suffix = os.path.splitext(os.fsdecode(os.fspath(f)))[1].lower()
            return _BY_SUFFIX.get(suffix, "mpitensor")
        return "mpitensor"
    if format not in _FORMATS:
        raise ValueError(f"format must be one of {', '.join(map(repr, _FORMATS))} or None, got "
                         f"{format!r}")
    return format


def save(obj: Any, f: PathOrFile, *, allow_pickle: Optional[bool] = None,
         format: Optional[str] = None) -> None:
    """Write ``obj`` to ``f``, atomically when ``f`` is a path.

    Three formats, all read back by :func:`load`:

    * ``"mpitensor"`` (the default): the safe format of the module docstring. CuPy arrays are
      copied to the host and written with their device, so :func:`load` puts them back on the
      GPU (unless ``map_location="cpu"``). Non-contiguous views are written compactly; an
      array or Tensor that appears twice is stored once and loads as one object.
    * ``"torch"`` (the default for paths ending in ``.pt`` / ``.pth``): torch's zip layout,
      which ``torch.load(path, weights_only=True)`` reads. As with ``torch.save``, views of one
      array share one storage (the whole array is written) and load as views again; Parameters
      stay Parameters. Leaves must be what torch's weights-only loader accepts (Tensors,
      containers, numbers, str, bytes, None, dtypes, Size, device).
    * ``"safetensors"`` (the default for ``.safetensors``): as :func:`save_safetensors`.

    Args:
        obj: the object tree (see the module docstring for the supported types).
        f: a path (written atomically: temporary file, fsync, rename, directory fsync) or a
            binary file object opened for writing (written in place at its position).
        allow_pickle: what to do with leaves of other types (a whole ``nn.Module``, a custom
            class): None (the default) and True pickle them, as ``torch.save`` does, and such
            a file loads only with ``weights_only=False`` or with its classes allowed
            (``mpitensor.serialization.add_safe_globals``), in torch too; False refuses them
            with a TypeError naming the leaf, for programs that want every checkpoint to load
            without pickle.
        format: ``"mpitensor"``, ``"torch"``, ``"safetensors"``, or None to choose by the path's
            suffix as above (file objects get ``"mpitensor"``).

    Raises:
        TypeError: ``obj`` holds an unsupported type (the message gives its path in ``obj``).
        ValueError: ``format`` is unknown.
        ImportError: ``"safetensors"`` without the ``safetensors`` package.
        CheckpointError: the file could not be written (the old file, if any, is left intact).

    Example:
        >>> import os, tempfile, mpitensor as mt
        >>> p = os.path.join(tempfile.mkdtemp(), "ckpt.mt")
        >>> save({"w": mt.zeros(3), "step": 10}, p)
        >>> load(p)["step"]
        10
    """
    fmt = _format_for(format, f)
    if allow_pickle is None:
        allow_pickle = fmt != "safetensors"  # as torch.save: any picklable object
    if fmt == "mpitensor":
        head, arrays, _ = _serialize(obj, allow_pickle)

        def write(fh: BinaryIO) -> None:
            _write(fh, head, arrays)  # looked up at call time: tests replace it

    elif fmt == "torch":
        write = _tw.plan_zip(obj, allow_pickle, Parameter)
    else:
        if allow_pickle:
            raise ValueError("allow_pickle does not apply to safetensors, which hold only "
                             "arrays")
        data = safetensors_bytes(obj, None)

        def write(fh: BinaryIO) -> None:
            fh.write(data)

    write_to(f, write)


# -------------------------------------------------------------------------------------- decoding
def _read_exact(fh: BinaryIO, n: int, what: str, size: Optional[int], at: int) -> bytes:
    data = fh.read(n)
    if data is None or len(data) != n:
        got = 0 if data is None else len(data)
        total = f"{size} bytes" if size is not None else f"{at + got} bytes"
        raise BadFile(f"truncated: the {what} needs {n} bytes at offset {at} but the file ends "
                   f"after {total}")
    return data




def _read_into(fh: BinaryIO, n: int, what: str, size: Optional[int], at: int,
               budget: Optional[_tf.Budget] = None) -> np.ndarray:
    """Read n bytes into a fresh 64-byte aligned uint8 array, counted in ``budget``.

    From a stream of unknown size, a large ``n`` is read in pieces first: a forged length
    then ends in "truncated" when the stream does, instead of allocating what it claims (and
    a stream that goes on past the budget is refused when it passes it).
    """
    budget = _tf.Budget() if budget is None else budget
    if size is None and n > STREAM_CHUNK:
        parts, got = [], 0
        while got < n:
            if budget.limit is not None and budget.used + got > budget.limit:
                budget.need(got, f"the {what}, {n} bytes long by its header")
            chunk = fh.read(min(STREAM_CHUNK, n - got))
            if not chunk:
                raise BadFile(f"truncated: the {what} needs {n} bytes at offset {at} but the "
                           f"stream ends after {at + got} bytes")
            parts.append(chunk)
            got += len(chunk)
        budget.need(n, f"the {what}")
        out = _tf.aligned_empty(n, f"the {what}", BadFile)
        pos = 0
        for chunk in parts:
            out[pos:pos + len(chunk)] = np.frombuffer(chunk, np.uint8)
            pos += len(chunk)
        return out
    budget.need(n, f"the {what}")
    out = _tf.aligned_empty(n, f"the {what}", BadFile)
    view = memoryview(out)
    got = 0
    readinto = getattr(fh, "readinto", None)
    while got < n:
        if readinto is not None:
            k = readinto(view[got:])
        else:
            chunk = fh.read(n - got)
            k = len(chunk) if chunk else 0
            view[got:got + k] = chunk if k else b""
        if not k:
            total = f"{size} bytes" if size is not None else f"{at + got} bytes"
            raise BadFile(f"truncated: the {what} needs {n} bytes at offset {at} but the file ends "
                       f"after {total}")
        got += k
    return out


def _sniff(magic: bytes) -> str:
    if magic[:1] == b"\x80":
        return (" (it looks like a plain pickle file, which neither torch.save nor mpitensor "
                "writes; mpitensor does not load plain pickles)")
    if magic.startswith(b"\x93NUMPY"):
        return " (it is a .npy file: load it with numpy.load)"
    return ""


def _parse(fh: BinaryIO, size: Optional[int], weights_only: bool, place: _tf.Place,
           head: bytes = b"", budget: Optional[_tf.Budget] = None) -> Any:
    prefix = head + (fh.read(_PREFIX.size - len(head)) or b"")
    if not prefix:
        raise BadFile("the file is empty")
    if len(prefix) < 8 or prefix[:8] != MAGIC:
        if len(prefix) < 8 and MAGIC.startswith(prefix):
            raise BadFile(f"truncated: the file is only {len(prefix)} bytes long")
        raise BadFile(f"not an mpitensor checkpoint: it starts with {prefix[:8]!r}, not "
                   f"{MAGIC!r}{_sniff(prefix)}")
    if len(prefix) < _PREFIX.size:
        raise BadFile(f"truncated: the file is only {len(prefix)} bytes long, shorter than the "
                   f"{_PREFIX.size}-byte fixed header")
    _, version, flags, hlen, plen, hsha = _PREFIX.unpack(prefix)
    if version != VERSION:
        raise BadFile(f"format version {version} is not supported (this mpitensor reads version "
                   f"{VERSION}); {'upgrade mpitensor' if version > VERSION else 'bad header'}")
    if hlen > _MAX_HEADER or (size is not None and _PREFIX.size + hlen > size):
        raise BadFile(f"truncated or corrupt: the header claims {hlen} bytes but the file has "
                   f"{size} bytes")
    hbytes = _read_exact(fh, hlen, "header", size, _PREFIX.size)
    if hashlib.sha256(hbytes).digest() != hsha:
        raise BadFile("corrupt: the header's SHA-256 checksum does not match")
    try:
        header = json.loads(hbytes.decode("utf-8"))
        arrays_meta = header["arrays"]
        tree = header["tree"]
        payload_sha = header["payload_sha256"]
    except (UnicodeDecodeError, ValueError, KeyError, TypeError, RecursionError) as exc:
        raise BadFile(f"malformed header ({type(exc).__name__}: {exc})") from None
    pad = _pad(_PREFIX.size + hlen)
    _read_exact(fh, pad, "header padding", size, _PREFIX.size + hlen)
    start = _PREFIX.size + hlen + pad
    if size is not None and start + plen != size:
        if start + plen > size:
            raise BadFile(f"truncated: the payload needs {plen} bytes after offset {start} but the "
                       f"file has {size} bytes")
        raise BadFile(f"corrupt: {size - start - plen} unexpected bytes after the payload")
    payload = _read_into(fh, plen, "payload", size, start, budget)
    if hashlib.sha256(payload).hexdigest() != payload_sha:
        raise BadFile("corrupt: the payload's SHA-256 checksum does not match (the file was "
                   "modified or damaged after it was written)")
    try:
        dec = _Decoder(payload, arrays_meta, weights_only, place)
        return dec.decode(tree)
    except BadFile:
        raise
    except (KeyError, TypeError, ValueError, IndexError, OverflowError, RecursionError) as exc:
        raise BadFile(f"malformed header ({type(exc).__name__}: {exc})") from None


class _Decoder:
    def __init__(self, payload: np.ndarray, meta: list, weights_only: bool,
                 place: _tf.Place) -> None:
        self.payload = payload
        self.meta = meta
        self.weights_only = weights_only
        self.place = place
        self.cache: Dict[Tuple[int, str], Any] = {}

    def host(self, i: int) -> np.ndarray:
        m = self.meta[i]
        dt = np.dtype(m["dtype"])
        if not _storable(dt):
            raise BadFile(f"array {i} has dtype {m['dtype']!r}, which the safe format never stores")
        shape = tuple(int(s) for s in m["shape"])
        off, nbytes = int(m["offset"]), int(m["nbytes"])
        if any(s < 0 for s in shape) or int(np.prod(shape)) * dt.itemsize != nbytes \
                or off < 0 or off + nbytes > self.payload.size:
            raise BadFile(f"array {i} (dtype {dt}, shape {shape}) does not fit the payload")
        return self.payload[off:off + nbytes].view(dt).reshape(shape)

    def array(self, i: int, kind: str) -> Any:
        key = (i, kind)
        if key in self.cache:
            return self.cache[key]
        arr = self.host(i)
        data = arr.reshape(-1).view(np.uint8)
        placed = self.place(data, str(self.meta[i].get("device", "cpu")))
        if placed is not data:
            if _backend.is_cupy_array(placed) and not arr.dtype.isnative:
                # CuPy has no byte-swapped dtypes: convert on the host, then copy over
                native = arr.astype(arr.dtype.newbyteorder("="))
                placed = to_gpu(native.reshape(-1).view(np.uint8),
                                 str(_backend.device_of(placed)))
                arr = native
            arr = placed.view(arr.dtype).reshape(arr.shape)
        self.cache[key] = arr
        return arr

    def decode(self, n: Any) -> Any:
        k = n["k"]
        if k == "none":
            return None
        if k == "bool":
            return bool(n["v"])
        if k == "int":
            return int(n["v"])
        if k == "float":
            return float.fromhex(n["v"])
        if k == "complex":
            return complex(float.fromhex(n["v"][0]), float.fromhex(n["v"][1]))
        if k == "str":
            if not isinstance(n["v"], str):
                raise TypeError("str node without a string")
            return n["v"]
        if k in ("bytes", "bytearray"):
            data = self.host(n["i"]).tobytes()
            return data if k == "bytes" else bytearray(data)
        if k == "list":
            return [self.decode(v) for v in n["v"]]
        if k == "tuple":
            return tuple(self.decode(v) for v in n["v"])
        if k == "size":
            return Size([self.decode(v) for v in n["v"]])
        if k in ("dict", "odict"):
            out = {} if k == "dict" else collections.OrderedDict()
            for kn, vn in n["v"]:
                out[self.decode(kn)] = self.decode(vn)
            return out
        if k == "tensor":
            key = (n["i"], "tensor")
            if key in self.cache:
                return self.cache[key]
            t = Tensor._wrap(self.array(n["i"], "array"))
            if n.get("rg"):
                t.requires_grad = True
            self.cache[key] = t
            return t
        if k == "ndarray":
            return self.array(n["i"], "array")
        if k == "npscalar":
            return self.host(n["i"])[()]
        if k == "dtype":
            return np.dtype(n["v"])
        if k == "pickle":
            data = io.BytesIO(self.host(n["i"]).tobytes())
            if self.weights_only:
                return _AllowListUnpickler(data).load()
            return pickle.loads(data.getvalue())
        raise BadFile(f"unknown node kind {k!r} in the header")


class _AllowListUnpickler(pickle.Unpickler):
    """Unpickles a leaf under ``weights_only=True``: plain containers, and the globals that
    ``mpitensor.serialization.add_safe_globals`` / ``safe_globals`` allow; nothing else is
    imported or called."""

    _PLAIN = {("collections", "OrderedDict"): collections.OrderedDict,
              ("collections", "Counter"): collections.Counter,
              ("builtins", "set"): set, ("builtins", "frozenset"): frozenset,
              ("builtins", "complex"): complex}

    def find_class(self, module: str, name: str) -> Any:
        found = self._PLAIN.get((module, name)) or _safe_globals.lookup(module, name)
        if found is None:
            raise BadFile(
                f"it contains a pickled {module}.{name}, which weights_only=True refuses "
                f"(nothing was called). If you trust the file's source, pass "
                f"weights_only=False, or allow just this global with mpitensor.serialization."
                f"add_safe_globals([...]) or inside a `with mpitensor.serialization."
                f"safe_globals([...]):` block")
        return found


def load(f: PathOrFile, map_location: Any = None, weights_only: bool = True, *,
         mmap: Optional[bool] = None, max_bytes: Optional[int] = None) -> Any:
    """Read a file written by :func:`save`, by ``torch.save`` or in the safetensors format.

    The format is recognised by the file's first bytes, whatever its name:

    * mpitensor checkpoints: both checksums are verified first. Tensors come back as mpitensor
      Tensors (with their ``requires_grad``), arrays as arrays.
    * ``torch.save`` files (the zip layout and the legacy one), read without torch: tensors
      become mpitensor Tensors with the saved dtype, shape, strides and storage offset, views of
      one storage share memory as they did in torch, and parameters become
      ``mpitensor.nn.Parameter``. With ``weights_only=True`` only tensors, parameters, storages,
      dtypes, ``torch.Size``, ``torch.device``, OrderedDict, Counter and plain containers and
      numbers load: any other global is refused before it is called.
    * safetensors files: a dict of Tensors, as :func:`load_safetensors`.

    Args:
        f: a path or a binary file object opened for reading.
        map_location: where the data goes, as in ``torch.load``. None restores it where it was
            saved (GPU data to the GPU; data saved on a GPU is an error where none is usable);
            ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or a ``mpitensor.device`` puts everything
            there; a dict maps saved locations to devices (``{"cuda:1": "cuda:0"}``; locations
            it does not name stay); a callable ``(storage, location)`` returns the storage
            placed (``storage``, ``storage.cpu()``, ``storage.cuda(n)``) or None for the
            default.
        weights_only: refuse pickled objects (the default). Pass False only for files from a
            trusted source: then pickled objects load (mpitensor files saved with
            ``allow_pickle=True``; torch files may import and call any global, which runs code).
        mmap: torch's request to map the storages rather than read them: accepted for a path
            (a file object is refused, as torch does) and the file is read, which gives the
            same tensors (values, dtypes, views; writes never reach the file, as with torch's
            private mapping), held in memory rather than paged in from the file.
        max_bytes: the most memory the file's tensors may take, in bytes; a file that needs
            more is refused before it is read (a forged or compressed size cannot make
            ``load`` allocate more). None (the default): ``MPITENSOR_LOAD_MAX_BYTES`` where
            set (a number, or ``off`` for no bound), else the memory available when ``load``
            is called (``MemAvailable``, and the cgroup's room where it is smaller). What
            counts: the bytes of every storage (a view costs nothing beyond its storage; an
            expanded tensor is as small as in torch) and, per storage torch saved behind a
            lazy conjugation or negation, one copy with it applied.

    Returns:
        The object tree.

    Raises:
        FileNotFoundError: ``f`` does not exist.
        CheckpointError: the file is truncated, corrupt, in no format mpitensor reads, holds
            pickled objects or unknown globals while ``weights_only`` is True, holds a dtype
            mpitensor lacks (bfloat16, float8, ...), holds GPU data where no GPU is usable, or
            needs more memory than ``max_bytes``; the message names the file.
        TypeError: ``map_location`` is of an unsupported kind, ``max_bytes`` not an int, or
            ``mmap`` not a bool.
        ValueError: ``mmap=True`` with a file object.
        ImportError: a safetensors file without the ``safetensors`` package.

    Example:
        >>> import io, numpy as np
        >>> b = io.BytesIO(); save([np.arange(3)], b); _ = b.seek(0)
        >>> load(b)
        [array([0, 1, 2])]
    """
    place = placement(map_location)
    budget = _budget(max_bytes)
    name = file_name(f)
    _check_mmap(f, mmap)
    if isinstance(f, (str, bytes, os.PathLike)):
        with open(os.fspath(f), "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            return _load_from(fh, size, name, weights_only, place, True, budget)
    if not hasattr(f, "read"):
        raise TypeError(f"load() takes a path or a binary file object, got {type(f).__name__}")
    size = None
    at_start = False
    with contextlib.suppress(Exception):
        if f.seekable():
            pos = f.tell()
            size = f.seek(0, io.SEEK_END) - pos
            f.seek(pos)
            at_start = pos == 0
    return _load_from(f, size, name, weights_only, place, at_start, budget)


def _check_mmap(f: Any, mmap: Any) -> None:
    if mmap is not None and not isinstance(mmap, bool):
        raise TypeError(f"load(mmap=...) takes True, False or None, got {mmap!r}")
    if mmap and not isinstance(f, (str, bytes, os.PathLike)):
        raise ValueError("load(mmap=True) needs a file path, not a file object: pass the "
                         "path, or leave mmap out")


def _memory_available() -> Optional[int]:
    """Bytes this process can still allocate, as far as the system tells (None: unknown)."""
    found: List[int] = []
    with contextlib.suppress(OSError, ValueError):
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    found.append(int(line.split()[1]) * 1024)
                    break
    if not found:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            found.append(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    with contextlib.suppress(OSError, ValueError):  # a container's own bound (cgroup v2)
        with open("/sys/fs/cgroup/memory.max") as fh:
            top = fh.read().strip()
        with open("/sys/fs/cgroup/memory.current") as fh:
            now = int(fh.read().strip())
        if top != "max":
            found.append(max(int(top) - now, 0))
    return min(found) if found else None


_RAISE = ("pass load(..., max_bytes=N) with a larger N, or set MPITENSOR_LOAD_MAX_BYTES (a "
          "byte count, or off), if the file is trusted and the memory is there")


def _budget(max_bytes: Optional[int]) -> _tf.Budget:
    """The memory one load may allocate: ``max_bytes``, the switch, or what is available."""
    if max_bytes is not None:
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int):
            raise TypeError(f"max_bytes must be an int (bytes) or None, got {max_bytes!r}")
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        return _tf.Budget(max_bytes, f" (max_bytes); {_RAISE}")
    if _config.LOAD_MAX_BYTES is not None:
        if _config.LOAD_MAX_BYTES >= _config.OFF_BYTES:
            return _tf.Budget(None)
        return _tf.Budget(_config.LOAD_MAX_BYTES, f" (MPITENSOR_LOAD_MAX_BYTES); {_RAISE}")
    return _tf.Budget(_memory_available(), f" (the memory available now); {_RAISE}")


def _load_from(fh: BinaryIO, size: Optional[int], name: str, weights_only: bool,
               place: _tf.Place, at_start: bool, budget: Optional[_tf.Budget] = None) -> Any:
    budget = _tf.Budget() if budget is None else budget
    try:
        return _dispatch(fh, size, weights_only, place, at_start, budget)
    except (BadFile, _tf.FormatError) as exc:
        raise CheckpointError(f"cannot load checkpoint {name}: {exc}") from None
    except Reraise as exc:
        raise exc.original from None


def _dispatch(fh: BinaryIO, size: Optional[int], weights_only: bool, place: _tf.Place,
              at_start: bool, budget: _tf.Budget) -> Any:
    head = fh.read(SNIFF) or b""
    if not head or (MAGIC.startswith(head[:8]) if len(head) < 8 else head[:8] == MAGIC):
        return _parse(fh, size, weights_only, place, head, budget)

    def whole() -> Tuple[BinaryIO, int]:
        # zipfile needs random access from the file's start, which a stream may not give
        if at_start and size is not None:
            fh.seek(0)
            return fh, size
        data = head + read_rest(fh, size)
        return io.BytesIO(data), len(data)

    if head.startswith((b"PK\x03\x04", b"PK\x05\x06")):
        src, total = whole()
        return _tf.read_zip(src, place, weights_only, Parameter, total, budget)
    if _tf.is_legacy(head):
        src, _ = whole()
        return _tf.read_legacy(src, place, weights_only, Parameter, budget)
    if is_safetensors(head, size):
        if size is not None:  # the file's bytes, and a copy of its arrays
            budget.need(2 * size, "the safetensors file's bytes and its arrays")
        src, _ = whole()
        return read_safetensors(src.read(), place)
    if head.split(b"\0")[0] in (b"sys_info", b"pickle", b"storages", b"tensors") and \
            b"\0" in head:
        raise BadFile("it is a tar archive, the layout of torch < 0.4, which mpitensor does not "
                   "read; load it with torch and save it again")
    raise BadFile(f"not an mpitensor checkpoint, torch.save file or safetensors file: it starts "
               f"with {head[:8]!r}{_sniff(head)}")


# ----------------------------------------------------------------------------------- distributed
def _dist() -> Any:
    import mpitensor.distributed as dist  # noqa: PLC0415 - keep checkpoint importable alone

    return dist


def save_on_rank0(obj: Any, f: PathOrFile, group: Any = None, *,
                  allow_pickle: Optional[bool] = None, format: Optional[str] = None) -> None:
    """Write ``obj`` on rank 0 of ``group`` only, then make every rank agree on the outcome.

    Every rank of the group must call it (it is a collective). Rank 0 saves (atomically) and
    broadcasts success or the error; when the save failed every rank raises the same
    :class:`CheckpointError`. When it returns, the file is complete on rank 0's filesystem. Without
    an initialised process group it is plain :func:`save`.

    Args:
        obj: the object tree; only rank 0's is used.
        f: the path to write (on rank 0).
        group: the process group (default: the world).
        allow_pickle: as in :func:`save`.
        format: as in :func:`save`.

    Raises:
        CheckpointError: rank 0 could not save (same message on every rank).

    Example:
        >>> import os, tempfile, mpitensor as mt
        >>> save_on_rank0({"epoch": 1}, os.path.join(tempfile.mkdtemp(), "c.mt"))
    """
    dist = _dist()
    if not dist.is_initialized():
        save(obj, f, allow_pickle=allow_pickle, format=format)
        return
    rank = dist.get_rank(group)
    err: Optional[str] = None
    cause: Optional[BaseException] = None
    if rank == 0:
        try:
            save(obj, f, allow_pickle=allow_pickle, format=format)
        except Exception as exc:  # every rank must learn about any failure
            cause = exc
            err = f"{type(exc).__name__}: {exc}"
    box = [err]
    dist.broadcast_object_list(box, group=group, group_src=0)
    if box[0] is not None:
        raise CheckpointError(
            f"rank 0 failed to save checkpoint {file_name(f)}: {box[0]}") from cause


def load_on_all_ranks(f: PathOrFile, map_location: Any = None, weights_only: bool = True,
                      group: Any = None, *, read_on_rank0: bool = False,
                      max_bytes: Optional[int] = None) -> Any:
    """Load a checkpoint on every rank of ``group``; a bad file raises the same error everywhere.

    Every rank of the group must call it (it is a collective). By default each rank reads the
    file itself (a shared filesystem); with ``read_on_rank0=True`` rank 0 reads the bytes and
    broadcasts them, for files only rank 0 can see. Either way the ranks then agree: if the file
    is missing, unreadable or bad on any rank, every rank raises one :class:`CheckpointError`
    naming the file, the failing ranks and the first failure.

    Args:
        f: the path (or, with ``read_on_rank0``, a file object on rank 0).
        map_location: as in :func:`load`.
        weights_only: as in :func:`load`.
        group: the process group (default: the world).
        read_on_rank0: read on rank 0 only and broadcast the bytes.
        max_bytes: as in :func:`load`.

    Returns:
        The object tree, loaded independently on each rank.

    Raises:
        CheckpointError: the file is bad or unreadable on some rank (same message everywhere).

    Example:
        >>> import os, tempfile
        >>> p = os.path.join(tempfile.mkdtemp(), "c.mt"); save({"epoch": 2}, p)
        >>> load_on_all_ranks(p)["epoch"]
        2
    """
    dist = _dist()
    if not dist.is_initialized():
        return load(f, map_location, weights_only, max_bytes=max_bytes)
    rank = dist.get_rank(group)
    name = file_name(f)
    if read_on_rank0:
        box: List[Any] = [None, None]
        if rank == 0:
            try:
                if isinstance(f, (str, bytes, os.PathLike)):
                    with open(os.fspath(f), "rb") as fh:
                        box[0] = fh.read()
                else:
                    box[0] = f.read()
            except OSError as exc:
                box[1] = f"{type(exc).__name__}: {exc}"
        dist.broadcast_object_list(box, group=group, group_src=0)
        if box[1] is not None:
            raise CheckpointError(f"cannot load checkpoint {name} on rank(s) [0]: {box[1]}")
        src: Any = io.BytesIO(box[0])
        src.name = name
    else:
        src = f
    result, err = None, None
    try:
        result = load(src, map_location, weights_only, max_bytes=max_bytes)
    except CheckpointError as exc:
        err = str(exc).replace(f"cannot load checkpoint {name}: ", "", 1)
    except Exception as exc:  # every rank must take part in the agreement below
        err = f"{type(exc).__name__}: {exc}"
    errors: List[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(errors, None if err is None else (name, err), group=group)
    bad = [r for r, e in enumerate(errors) if e is not None]
    if bad:
        first_name, first_err = errors[bad[0]]
        raise CheckpointError(f"cannot load checkpoint {first_name} on rank(s) {bad}: "
                              f"{first_err}")
    return result
