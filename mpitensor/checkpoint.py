"""Checkpoints: ``save(obj, f)`` / ``load(f)`` in a safe, checksummed, atomically written format.

``obj`` may nest dicts (any keys of the supported leaf types), OrderedDicts, lists and tuples of
Tensors (``nn.Parameter`` included), NumPy and CuPy arrays, NumPy scalars and dtypes, Python
``int`` (any size) / ``float`` / ``complex`` / ``bool`` / ``str`` / ``bytes`` and ``None``: enough
for ``model.state_dict()``, ``optimizer.state_dict()``, sampler state, epoch counters and RNG
states (``mpitensor.get_rng_state()``, ``numpy.random.Generator.bit_generator.state``,
``random.getstate()``). Loading never runs pickle unless asked (``weights_only=False``).

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
file or the new one, never half of one.

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
import tempfile
from typing import Any, BinaryIO, Dict, List, Optional, Tuple, Union

import numpy as np

from mpitensor import backend as _backend
from mpitensor.errors import MpiTensorError
from mpitensor.tensor import Size, Tensor

__all__ = ["save", "load", "save_on_rank0", "load_on_all_ranks", "CheckpointError"]

_log = logging.getLogger("mpitensor.checkpoint")

MAGIC = b"MPITCKPT"
VERSION = 1
_PREFIX = struct.Struct("<8sIIQQ32s")  # magic, version, flags, header len, payload len, sha
_ALIGN = 64
_FLAG_PICKLE = 1
_ARRAY_KINDS = "biufcSU"  # numeric, bool and fixed-width string dtypes; never object/void
_MAX_HEADER = 1 << 31

PathOrFile = Union[str, "os.PathLike[str]", BinaryIO]


class CheckpointError(MpiTensorError, ValueError):
    """A checkpoint file is missing pieces, corrupt, not a checkpoint, or could not be written."""


def _name(f: Any) -> str:
    if isinstance(f, (str, bytes, os.PathLike)):
        return os.fsdecode(os.fspath(f))
    return str(getattr(f, "name", None) or f"<{type(f).__name__} object>")


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
        if host.dtype.kind not in _ARRAY_KINDS or host.dtype.fields is not None:
            raise TypeError(f"cannot save an array of dtype {host.dtype}: only numeric, bool and "
                            f"fixed-width string dtypes are stored")
        if not host.flags.c_contiguous:
            host = host.copy(order="C")  # (np.ascontiguousarray would make 0-d arrays 1-d)
        i = len(self.arrays)
        self.arrays.append(host)
        self.meta.append({"dtype": host.dtype.str, "shape": list(host.shape), **extra})
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
            if x.dtype.kind not in _ARRAY_KINDS:
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
            return {"k": "dtype", "v": x.str}
        if self.allow_pickle:
            self.pickled = True
            data = pickle.dumps(x, protocol=pickle.HIGHEST_PROTOCOL)
            return {"k": "pickle", "i": self._add(np.frombuffer(data, np.uint8), None,
                                                  {"device": "cpu"})}
        raise TypeError(
            f"cannot save {path}: objects of type {t.__module__}.{t.__qualname__} are not part of "
            f"the safe checkpoint format (dict, OrderedDict, list, tuple, Tensor, NumPy/CuPy "
            f"array, NumPy scalar, int, float, complex, bool, str, bytes, None); convert it "
            f"(e.g. dict(x), list(x)) or pass allow_pickle=True (then loading needs "
            f"weights_only=False)"
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


def _umask() -> int:
    with contextlib.suppress(OSError, ValueError):
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    return 0o022


def _fsync_dir(d: str) -> None:
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:  # e.g. platforms that cannot open directories
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def save(obj: Any, f: PathOrFile, *, allow_pickle: bool = False) -> None:
    """Write ``obj`` to ``f`` in the safe checkpoint format, atomically when ``f`` is a path.

    CuPy arrays are copied to the host and written with their device, so :func:`load` puts them
    back on the GPU (unless ``map_location="cpu"``). Non-contiguous views are written compactly;
    an array or Tensor that appears twice is stored once and loads as one object.

    Args:
        obj: the object tree (see the module docstring for the supported types).
        f: a path (written atomically: temporary file, fsync, rename, directory fsync) or a
            binary file object opened for writing (written in place at its position).
        allow_pickle: pickle leaves of other types instead of refusing them; such a file loads
            only with ``weights_only=False``.

    Raises:
        TypeError: ``obj`` holds an unsupported type (the message gives its path in ``obj``).
        CheckpointError: the file could not be written (the old file, if any, is left intact).

    Example:
        >>> import os, tempfile, mpitensor as mt
        >>> p = os.path.join(tempfile.mkdtemp(), "ckpt.mt")
        >>> save({"w": mt.zeros(3), "step": 10}, p)
        >>> load(p)["step"]
        10
    """
    head, arrays, _ = _serialize(obj, allow_pickle)
    if not isinstance(f, (str, bytes, os.PathLike)):
        if not hasattr(f, "write"):
            raise TypeError(f"save() takes a path or a binary file object, got "
                            f"{type(f).__name__}")
        _write(f, head, arrays)
        return
    path = os.path.abspath(os.fsdecode(os.fspath(f)))
    directory = os.path.dirname(path)
    if os.path.isdir(path):
        raise CheckpointError(f"cannot save checkpoint to {path}: it is a directory; give a file "
                              f"name inside it")
    try:
        fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp",
                                   dir=directory)
    except OSError as exc:
        raise CheckpointError(f"cannot save checkpoint to {path}: cannot create a file in "
                              f"{directory} ({exc.strerror or exc}); check that the directory "
                              f"exists and is writable") from exc
    try:
        try:
            mode = os.stat(path).st_mode & 0o7777  # keep an existing file's permissions
        except OSError:
            mode = 0o666 & ~_umask()
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as fh:
            _write(fh, head, arrays)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise CheckpointError(f"cannot save checkpoint to {path}: {exc.strerror or exc}; "
                                  f"the previous file (if any) is unchanged") from exc
        raise
    _fsync_dir(directory)


# -------------------------------------------------------------------------------------- decoding
class _Bad(Exception):
    """Internal: what is wrong with a file; turned into a CheckpointError naming the file."""


def _read_exact(fh: BinaryIO, n: int, what: str, size: Optional[int], at: int) -> bytes:
    data = fh.read(n)
    if data is None or len(data) != n:
        got = 0 if data is None else len(data)
        total = f"{size} bytes" if size is not None else f"{at + got} bytes"
        raise _Bad(f"truncated: the {what} needs {n} bytes at offset {at} but the file ends "
                   f"after {total}")
    return data


_STREAM_CHUNK = 1 << 26  # a stream of unknown size is read in pieces of this many bytes


def _aligned(n: int, what: str) -> np.ndarray:
    """A fresh 64-byte aligned uint8 array of n bytes (a view that keeps its base alive)."""
    try:
        raw = np.empty(n + _ALIGN, dtype=np.uint8)
    except (MemoryError, ValueError):
        raise _Bad(f"the {what} claims {n} bytes, more than this machine can allocate "
                   "(a forged or corrupt length)") from None
    start = _pad(raw.ctypes.data)
    return raw[start:start + n]


def _read_into(fh: BinaryIO, n: int, what: str, size: Optional[int], at: int) -> np.ndarray:
    """Read n bytes into a fresh 64-byte aligned uint8 array.

    From a stream of unknown size, a large ``n`` is read in pieces first: a forged length
    then ends in "truncated" when the stream does, instead of allocating what it claims.
    """
    if size is None and n > _STREAM_CHUNK:
        parts, got = [], 0
        while got < n:
            chunk = fh.read(min(_STREAM_CHUNK, n - got))
            if not chunk:
                raise _Bad(f"truncated: the {what} needs {n} bytes at offset {at} but the "
                           f"stream ends after {at + got} bytes")
            parts.append(chunk)
            got += len(chunk)
        out = _aligned(n, what)
        pos = 0
        for chunk in parts:
            out[pos:pos + len(chunk)] = np.frombuffer(chunk, np.uint8)
            pos += len(chunk)
        return out
    out = _aligned(n, what)
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
            raise _Bad(f"truncated: the {what} needs {n} bytes at offset {at} but the file ends "
                       f"after {total}")
        got += k
    return out


def _sniff(magic: bytes) -> str:
    if magic.startswith(b"PK\x03\x04"):
        return " (it looks like a zip file, e.g. one written by torch.save: load it with torch)"
    if magic[:1] == b"\x80":
        return " (it looks like a pickle file: mpitensor never unpickles a whole file)"
    if magic.startswith(b"\x93NUMPY"):
        return " (it is a .npy file: load it with numpy.load)"
    return ""


def _parse(fh: BinaryIO, size: Optional[int], weights_only: bool, map_location: Any) -> Any:
    prefix = fh.read(_PREFIX.size)
    if not prefix:
        raise _Bad("the file is empty")
    if len(prefix) < 8 or prefix[:8] != MAGIC:
        if len(prefix) < 8 and MAGIC.startswith(prefix):
            raise _Bad(f"truncated: the file is only {len(prefix)} bytes long")
        raise _Bad(f"not an mpitensor checkpoint: it starts with {prefix[:8]!r}, not "
                   f"{MAGIC!r}{_sniff(prefix)}")
    if len(prefix) < _PREFIX.size:
        raise _Bad(f"truncated: the file is only {len(prefix)} bytes long, shorter than the "
                   f"{_PREFIX.size}-byte fixed header")
    _, version, flags, hlen, plen, hsha = _PREFIX.unpack(prefix)
    if version != VERSION:
        raise _Bad(f"format version {version} is not supported (this mpitensor reads version "
                   f"{VERSION}); {'upgrade mpitensor' if version > VERSION else 'bad header'}")
    if hlen > _MAX_HEADER or (size is not None and _PREFIX.size + hlen > size):
        raise _Bad(f"truncated or corrupt: the header claims {hlen} bytes but the file has "
                   f"{size} bytes")
    hbytes = _read_exact(fh, hlen, "header", size, _PREFIX.size)
    if hashlib.sha256(hbytes).digest() != hsha:
        raise _Bad("corrupt: the header's SHA-256 checksum does not match")
    try:
        header = json.loads(hbytes.decode("utf-8"))
        arrays_meta = header["arrays"]
        tree = header["tree"]
        payload_sha = header["payload_sha256"]
    except (UnicodeDecodeError, ValueError, KeyError, TypeError, RecursionError) as exc:
        raise _Bad(f"malformed header ({type(exc).__name__}: {exc})") from None
    pad = _pad(_PREFIX.size + hlen)
    _read_exact(fh, pad, "header padding", size, _PREFIX.size + hlen)
    start = _PREFIX.size + hlen + pad
    if size is not None and start + plen != size:
        if start + plen > size:
            raise _Bad(f"truncated: the payload needs {plen} bytes after offset {start} but the "
                       f"file has {size} bytes")
        raise _Bad(f"corrupt: {size - start - plen} unexpected bytes after the payload")
    payload = _read_into(fh, plen, "payload", size, start)
    if hashlib.sha256(payload).hexdigest() != payload_sha:
        raise _Bad("corrupt: the payload's SHA-256 checksum does not match (the file was "
                   "modified or damaged after it was written)")
    if (flags & _FLAG_PICKLE) and weights_only:
        raise _Bad("it contains pickled objects (it was saved with allow_pickle=True), which "
                   "weights_only=True refuses; pass weights_only=False only if you trust the "
                   "file's source")
    try:
        dec = _Decoder(payload, arrays_meta, weights_only, map_location)
        return dec.decode(tree)
    except _Bad:
        raise
    except (KeyError, TypeError, ValueError, IndexError, OverflowError, RecursionError) as exc:
        raise _Bad(f"malformed header ({type(exc).__name__}: {exc})") from None


def _target_device(map_location: Any, saved: str) -> str:
    if map_location is None:
        return saved
    return str(map_location)


class _Decoder:
    def __init__(self, payload: np.ndarray, meta: list, weights_only: bool,
                 map_location: Any) -> None:
        self.payload = payload
        self.meta = meta
        self.weights_only = weights_only
        self.map_location = map_location
        self.cache: Dict[Tuple[int, str], Any] = {}

    def host(self, i: int) -> np.ndarray:
        m = self.meta[i]
        dt = np.dtype(m["dtype"])
        if dt.kind not in _ARRAY_KINDS or dt.fields is not None:
            raise _Bad(f"array {i} has dtype {m['dtype']!r}, which the safe format never stores")
        shape = tuple(int(s) for s in m["shape"])
        off, nbytes = int(m["offset"]), int(m["nbytes"])
        if any(s < 0 for s in shape) or int(np.prod(shape)) * dt.itemsize != nbytes \
                or off < 0 or off + nbytes > self.payload.size:
            raise _Bad(f"array {i} (dtype {dt}, shape {shape}) does not fit the payload")
        return self.payload[off:off + nbytes].view(dt).reshape(shape)

    def array(self, i: int, kind: str) -> Any:
        dev = _target_device(self.map_location, self.meta[i].get("device", "cpu"))
        key = (i, kind)
        if key in self.cache:
            return self.cache[key]
        arr = self.host(i)
        if dev != "cpu":
            arr = _to_gpu(arr, dev)
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
            if self.weights_only:
                raise _Bad("it contains a pickled object, which weights_only=True refuses; pass "
                           "weights_only=False only if you trust the file's source")
            return pickle.loads(self.host(n["i"]).tobytes())
        raise _Bad(f"unknown node kind {k!r} in the header")


def _to_gpu(arr: np.ndarray, dev: str) -> Any:
    try:
        d = _backend.device(dev)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"map_location must be None, 'cpu', 'cuda', 'cuda:N' or a "
                        f"mpitensor.device, got {dev!r}") from exc
    if d.type == "cpu":
        return arr
    reason = _backend.cupy_unavailable_reason()
    if reason:
        raise _Bad(f"it holds GPU arrays (saved on {dev}) but {reason}; pass "
                   f"map_location='cpu' to load them into host memory")
    cp = _backend.get_cupy()
    idx = d.index if d.index is not None else int(cp.cuda.runtime.getDevice())
    if idx >= cp.cuda.runtime.getDeviceCount():
        idx = int(cp.cuda.runtime.getDevice())
    with cp.cuda.Device(idx):
        return cp.asarray(arr)


def load(f: PathOrFile, map_location: Any = None, weights_only: bool = True) -> Any:
    """Read an object written by :func:`save`, verifying both checksums first.

    Tensors come back as mpitensor Tensors (with their ``requires_grad``), arrays as arrays.

    Args:
        f: a path or a binary file object opened for reading.
        map_location: None restores arrays where they were saved (GPU arrays to the GPU);
            ``"cpu"`` loads everything into host memory; ``"cuda"``/``"cuda:N"`` (or a
            ``mpitensor.device``) puts every array on that GPU.
        weights_only: refuse files that hold pickled objects (the default). Pass False only for
            files from a trusted source that were saved with ``allow_pickle=True``.

    Returns:
        The object tree.

    Raises:
        FileNotFoundError: ``f`` does not exist.
        CheckpointError: the file is truncated, corrupt, not a checkpoint, holds pickled objects
            while ``weights_only`` is True, or holds GPU arrays where no GPU is usable; the message
            names the file.
        TypeError: ``map_location`` is of an unsupported kind.

    Example:
        >>> import io, numpy as np
        >>> b = io.BytesIO(); save([np.arange(3)], b); _ = b.seek(0)
        >>> load(b)
        [array([0, 1, 2])]
    """
    if map_location is not None and not isinstance(map_location, (str, _backend.device)):
        raise TypeError(f"map_location must be None, 'cpu', 'cuda', 'cuda:N' or a "
                        f"mpitensor.device, got {type(map_location).__name__}")
    if map_location is not None:
        map_location = str(_backend.device(map_location))
    name = _name(f)
    if isinstance(f, (str, bytes, os.PathLike)):
        with open(os.fspath(f), "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            return _load_from(fh, size, name, weights_only, map_location)
    if not hasattr(f, "read"):
        raise TypeError(f"load() takes a path or a binary file object, got {type(f).__name__}")
    size = None
    with contextlib.suppress(Exception):
        if f.seekable():
            pos = f.tell()
            size = f.seek(0, io.SEEK_END) - pos
            f.seek(pos)
    return _load_from(f, size, name, weights_only, map_location)


def _load_from(fh: BinaryIO, size: Optional[int], name: str, weights_only: bool,
               map_location: Any) -> Any:
    try:
        return _parse(fh, size, weights_only, map_location)
    except _Bad as exc:
        raise CheckpointError(f"cannot load checkpoint {name}: {exc}") from None


# ----------------------------------------------------------------------------------- distributed
def _dist() -> Any:
    import mpitensor.distributed as dist  # noqa: PLC0415 - keep checkpoint importable alone

    return dist


def save_on_rank0(obj: Any, f: PathOrFile, group: Any = None, *,
                  allow_pickle: bool = False) -> None:
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

    Raises:
        CheckpointError: rank 0 could not save (same message on every rank).

    Example:
        >>> import os, tempfile, mpitensor as mt
        >>> save_on_rank0({"epoch": 1}, os.path.join(tempfile.mkdtemp(), "c.mt"))
    """
    dist = _dist()
    if not dist.is_initialized():
        save(obj, f, allow_pickle=allow_pickle)
        return
    rank = dist.get_rank(group)
    err: Optional[str] = None
    cause: Optional[BaseException] = None
    if rank == 0:
        try:
            save(obj, f, allow_pickle=allow_pickle)
        except Exception as exc:  # every rank must learn about any failure
            cause = exc
            err = f"{type(exc).__name__}: {exc}"
    box = [err]
    dist.broadcast_object_list(box, group=group, group_src=0)
    if box[0] is not None:
        raise CheckpointError(f"rank 0 failed to save checkpoint {_name(f)}: {box[0]}") from cause


def load_on_all_ranks(f: PathOrFile, map_location: Any = None, weights_only: bool = True,
                      group: Any = None, *, read_on_rank0: bool = False) -> Any:
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
        return load(f, map_location, weights_only)
    rank = dist.get_rank(group)
    name = _name(f)
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
        result = load(src, map_location, weights_only)
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
