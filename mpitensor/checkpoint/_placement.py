"""Where loaded arrays go: ``map_location`` (None, a device, a dict from saved locations to
devices, or a callable on storages, as torch takes) turned into one placing function.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mpitensor import backend as _backend
from mpitensor.checkpoint import torch_format as _tf
from mpitensor.checkpoint._files import BadFile


def to_gpu(arr: np.ndarray, dev: str) -> Any:
    try:
        d = _backend.device(dev)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"map_location must be None, 'cpu', 'cuda', 'cuda:N' or a "
                        f"mpitensor.device, got {dev!r}") from exc
    if d.type == "cpu":
        return arr
    return _onto_gpu(arr, d, lambda reason: f"it holds GPU arrays (saved on {dev}) but {reason}; "
                                            f"pass map_location='cpu' to load them into host "
                                            f"memory")


def _onto_gpu(arr: np.ndarray, d: Any, why: Any) -> Any:
    """``arr`` copied onto GPU device ``d``; where no GPU can be used, ``_Bad(why(reason))``."""
    reason = _backend.cupy_unavailable_reason()
    if reason:
        raise BadFile(why(reason))
    cp = _backend.get_cupy()
    idx = d.index if d.index is not None else int(cp.cuda.runtime.getDevice())
    if idx >= cp.cuda.runtime.getDeviceCount():
        idx = int(cp.cuda.runtime.getDevice())
    with cp.cuda.Device(idx):
        return cp.asarray(arr)


class _LoadedStorage:
    """What a ``map_location`` callable receives: one storage's bytes, as in torch.

    It returns the storage itself (``lambda storage, loc: storage`` keeps it in host memory),
    ``storage.cuda(n)`` / ``storage.cpu()``, or None for the default placement.
    """

    __slots__ = ("_data",)

    def __init__(self, data: Any) -> None:
        self._data = data  # a 1-D uint8 NumPy or CuPy array

    @property
    def device(self) -> _backend.device:
        """Where the bytes are."""
        return _backend.device_of(self._data)

    @property
    def is_cuda(self) -> bool:
        """Whether the bytes are on a GPU."""
        return self.device.type == "cuda"

    def cpu(self) -> _LoadedStorage:
        """The storage in host memory."""
        return _LoadedStorage(_backend.to_numpy(self._data))

    def cuda(self, device: Any = None, non_blocking: bool = False) -> _LoadedStorage:
        """The storage on GPU ``device`` (an index, ``"cuda:N"`` or a device; None: current)."""
        if device is None:
            dev = "cuda"
        elif isinstance(device, int):
            dev = f"cuda:{device}"
        else:
            dev = str(_backend.device(device))
        return _LoadedStorage(to_gpu(_backend.to_numpy(self._data), dev))

    def nbytes(self) -> int:
        """The number of bytes."""
        return int(self._data.nbytes)

    def size(self) -> int:
        """The number of bytes (an untyped storage's elements)."""
        return int(self._data.nbytes)

    def __len__(self) -> int:
        return int(self._data.nbytes)

    def __repr__(self) -> str:
        return f"<storage of {self.nbytes()} bytes on {self.device}>"


class Reraise(Exception):
    """Carries an exception of the user's ``map_location`` callable out of the format code."""

    def __init__(self, original: BaseException) -> None:
        super().__init__(str(original))
        self.original = original


def _place_on(data: np.ndarray, target: Any, saved: str) -> Any:
    """Put host bytes on ``target`` (a device or its name) for a storage saved on ``saved``."""
    try:
        dev = _backend.device(target)
    except (TypeError, ValueError):
        if target == saved:
            raise BadFile(f"it holds data saved on {saved!r}, a device mpitensor does not use "
                       f"(only cpu and cuda); pass map_location='cpu' (or a dict such as "
                       f"{{{saved!r}: 'cpu'}})") from None
        raise BadFile(f"map_location sends data saved on {saved!r} to {target!r}, which is not "
                   f"a device ('cpu', 'cuda' or 'cuda:N')") from None
    if dev.type == "cpu":
        return data
    if target == saved:
        return _onto_gpu(data, dev, lambda reason: f"it holds data saved on {saved} but {reason}; "
                                                   f"pass map_location='cpu' to load it into "
                                                   f"host memory")
    return _onto_gpu(data, dev, lambda reason: f"map_location puts data saved on {saved} on "
                                               f"{dev}, but {reason}")


def _place_saved(data: np.ndarray, saved: str) -> Any:
    return _place_on(data, saved, saved)


def placement(map_location: Any) -> _tf.Place:
    """Turn ``map_location`` into ``place(bytes, saved_location) -> bytes on the device``."""
    if map_location is None:
        return _place_saved
    if isinstance(map_location, (str, _backend.device)):
        target = str(_backend.device(map_location))  # a bad name fails here, before reading
        return lambda data, saved: _place_on(data, target, saved)
    if isinstance(map_location, dict):
        table = {str(k): v for k, v in map_location.items()}

        def by_table(data: np.ndarray, saved: str) -> Any:
            target = table.get(saved, saved)
            return _place_on(data, target if isinstance(target, str) else str(target), saved)

        return by_table
    if callable(map_location):

        def by_call(data: np.ndarray, saved: str) -> Any:
            try:
                out = map_location(_LoadedStorage(data), saved)
            except BadFile:
                raise
            except Exception as exc:  # the caller's own error: give it back unchanged
                raise Reraise(exc) from None
            if out is None:
                return _place_saved(data, saved)
            if not isinstance(out, _LoadedStorage):
                raise Reraise(TypeError(
                    f"map_location returned {type(out).__name__}; it must return the storage "
                    f"it was given (storage, storage.cpu(), storage.cuda(n)) or None"))
            return out._data

        return by_call
    raise TypeError(f"map_location must be None, a device name ('cpu', 'cuda:0'), a "
                    f"mpitensor.device, a dict from saved locations to devices, or a "
                    f"callable(storage, location), got {type(map_location).__name__}")
