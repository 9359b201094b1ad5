"""The safetensors format: ``save_safetensors``/``load_safetensors``, and reading such files in
:func:`mpitensor.checkpoint.load` (recognised by their first bytes).
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, Optional

import numpy as np

from mpitensor import backend as _backend
from mpitensor.checkpoint import torch_format as _tf
from mpitensor.checkpoint._files import (
    SNIFF,
    BadFile,
    CheckpointError,
    PathOrFile,
    file_name,
    write_to,
)
from mpitensor.checkpoint._placement import placement
from mpitensor.tensor import Tensor

_MAX_ST_HEADER = 100 << 20  # safetensors' own limit on its JSON header


def _safetensors_numpy() -> Any:
    try:
        import safetensors.numpy as stn  # noqa: PLC0415 - an optional dependency
    except ImportError as exc:
        raise ImportError("safetensors files need the safetensors package: pip install "
                          "safetensors (or pip install 'mpitensor[safetensors]')") from exc
    return stn


# safetensors' dtype names that NumPy, and so mpitensor, can hold
_ST_DTYPES = {"BOOL": np.bool_, "U8": np.uint8, "I8": np.int8, "U16": np.uint16,
              "I16": np.int16, "U32": np.uint32, "I32": np.int32, "U64": np.uint64,
              "I64": np.int64, "F16": np.float16, "F32": np.float32, "F64": np.float64,
              "C64": np.complex64}


def is_safetensors(head: bytes, size: Optional[int]) -> bool:
    if len(head) < 9 or head[8:9] != b"{":
        return False
    n = int.from_bytes(head[:8], "little")
    return n <= _MAX_ST_HEADER and (size is None or 8 + n <= size)


def read_safetensors(data: bytes, place: _tf.Place) -> Dict[str, Tensor]:
    n = int.from_bytes(data[:8], "little")
    try:
        header = json.loads(data[8:8 + n].decode("utf-8"))
        entries = [(k, v["dtype"]) for k, v in header.items() if k != "__metadata__"]
    except (UnicodeDecodeError, ValueError, TypeError, KeyError, AttributeError,
            RecursionError) as exc:
        raise BadFile(f"malformed safetensors header ({type(exc).__name__}: {exc})") from None
    for key, dtype in entries:
        if dtype not in _ST_DTYPES:
            hint = (" (the safetensors package reads no bfloat16 into NumPy: load the file in "
                    "torch and convert, e.g. {k: v.float() for k, v in state_dict.items()}, or "
                    "torch.save it)" if dtype == "BF16" else "")
            raise BadFile(f"tensor {key!r} has dtype {dtype}, which mpitensor does not "
                       f"support{hint}")
    stn = _safetensors_numpy()
    try:
        arrays = stn.load(data)
    except Exception as exc:  # the library's own error types vary between its versions
        raise BadFile(f"corrupt safetensors file ({type(exc).__name__}: {exc})") from None
    if sorted(arrays) != sorted(k for k, _ in entries):
        raise BadFile("corrupt safetensors file: its header and its tensors disagree")
    out: Dict[str, Tensor] = {}
    for key, _ in entries:  # the header's order: the library returns them in any order
        arr = np.array(arrays[key], copy=True, order="C")  # own, writable memory, apart from `data`
        placed = place(arr.reshape(-1).view(np.uint8), "cpu")
        out[key] = Tensor(placed.view(arr.dtype).reshape(arr.shape))
    return out


def safetensors_bytes(tensors: Any, metadata: Optional[Dict[str, str]]) -> bytes:
    if not isinstance(tensors, dict):
        raise TypeError(f"safetensors hold a flat dict of name -> tensor, got "
                        f"{type(tensors).__name__}")
    if metadata is not None and not (isinstance(metadata, dict) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())):
        raise TypeError("safetensors metadata must be a dict of str -> str")
    arrays: Dict[str, np.ndarray] = {}
    for k, v in tensors.items():
        if not isinstance(k, str):
            raise TypeError(f"safetensors keys must be str, got {k!r}")
        if isinstance(v, Tensor):
            v = v._data
        if not (isinstance(v, np.ndarray) or _backend.is_cupy_array(v)):
            raise TypeError(f"cannot save {k!r} as safetensors: {type(v).__name__} is not a "
                            f"tensor or array")
        host = _backend.to_numpy(v)
        if host.dtype.type not in _ST_DTYPES.values():
            raise TypeError(f"cannot save {k!r} as safetensors: dtype {host.dtype}")
        arr = host.astype(host.dtype.newbyteorder("<"), copy=False)
        # (np.ascontiguousarray would make 0-d arrays 1-d)
        arrays[k] = arr if arr.flags.c_contiguous else arr.copy(order="C")
    return _safetensors_numpy().save(arrays, metadata=metadata)


def save_safetensors(tensors: Dict[str, Any], filename: PathOrFile,
                     metadata: Optional[Dict[str, str]] = None) -> None:
    """Write a flat dict of tensors as a safetensors file (atomically for a path).

    Like ``safetensors.torch.save_file``: the file holds only arrays and a str -> str metadata
    dict, so loading it runs no code. Views are written as compact copies (shared memory is not
    kept); GPU tensors are copied to the host.

    Args:
        tensors: name -> Tensor, NumPy or CuPy array (e.g. ``model.state_dict()``).
        filename: a path or a binary file object.
        metadata: optional text metadata stored in the header.

    Raises:
        TypeError: a key is not str, a value is not a tensor or array, or its dtype has no
            safetensors name.
        ImportError: the ``safetensors`` package is missing.
        CheckpointError: the file could not be written.

    Example:
        >>> import os, tempfile, mpitensor as mt
        >>> p = os.path.join(tempfile.mkdtemp(), "m.safetensors")
        >>> save_safetensors({"w": mt.ones(2)}, p)
        >>> load_safetensors(p)["w"]
        tensor([1., 1.])
    """
    data = safetensors_bytes(tensors, metadata)
    write_to(filename, lambda fh: fh.write(data))


def load_safetensors(filename: PathOrFile, device: Any = "cpu") -> Dict[str, Tensor]:
    """Read a safetensors file into a dict of name -> Tensor.

    Like ``safetensors.torch.load_file``; :func:`load` reads these files too.

    Args:
        filename: a path or a binary file object.
        device: where the tensors go (``"cpu"``, ``"cuda:N"``, a device, or any
            ``map_location`` :func:`load` accepts).

    Returns:
        The tensors, in the file's order.

    Raises:
        CheckpointError: not a safetensors file, corrupt, or a dtype mpitensor lacks (BF16).
        ImportError: the ``safetensors`` package is missing.

    Example:
        >>> import io, mpitensor as mt
        >>> b = io.BytesIO(); save_safetensors({"b": mt.zeros(1)}, b); _ = b.seek(0)
        >>> load_safetensors(b)["b"]
        tensor([0.])
    """
    place = placement(device)
    name = file_name(filename)
    if isinstance(filename, (str, bytes, os.PathLike)):
        with open(os.fspath(filename), "rb") as fh:
            data = fh.read()
    else:
        data = filename.read()
    try:
        if not is_safetensors(data[:SNIFF], len(data)):
            raise BadFile("not a safetensors file")
        return read_safetensors(data, place)
    except BadFile as exc:
        raise CheckpointError(f"cannot load checkpoint {name}: {exc}") from None


