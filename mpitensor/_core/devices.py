"""Where an array lives: device arguments, and arrays moved to or made on a device.

A tensor's device is its array's: a NumPy array is on the CPU, a CuPy array on the GPU that
holds it. CuPy is imported only once a CUDA device is actually asked for
(``backend.get_cupy``), so CPU-only programs never load it.
"""

from __future__ import annotations

from typing import Any, Optional, Union

import numpy as np

from mpitensor import backend as _backend

DeviceLike = Union[str, int, "_backend.device", None]

_ndarray = np.ndarray


def xp(x: Any) -> Any:
    """The array module (``numpy`` or ``cupy``) that computes on ``x`` (for a meta array,
    NumPy whose array makers make meta arrays)."""
    return np if type(x) is _ndarray else _backend.array_module(x)


def is_cupy(x: Any) -> bool:
    """True when ``x`` is a CuPy array (checked without importing CuPy)."""
    return not isinstance(x, _ndarray) and _backend.is_cupy_array(x)


def device_str(x: Any) -> str:
    """``"cpu"`` or ``"cuda:N"``, for messages."""
    return str(_backend.device_of(x))


def parse_device(device: DeviceLike) -> Optional[_backend.device]:
    """Read a device argument (``"cpu"``, ``"cuda:1"``, a GPU index, a device, or None).

    Raises:
        TypeError: none of those.
    """
    if device is None or isinstance(device, _backend.device):
        return device
    if isinstance(device, str):
        return _backend.device(device)
    if isinstance(device, (int, np.integer)) and not isinstance(device, bool):
        return _backend.device("cuda", int(device))
    raise TypeError(
        f"device must be 'cpu', 'cuda', 'cuda:N', a GPU index or a mpitensor.device, "
        f"got {device!r}"
    )


def factory_device(device: DeviceLike) -> Optional[_backend.device]:
    """A factory's device argument: :func:`parse_device`, where None is the default device
    (``with mpitensor.device(...)``, ``set_default_device``; still None where none was set)."""
    if device is None:
        return _backend.default_factory_device()
    return parse_device(device)


def device_or_dtype(a: Any) -> tuple:
    """The role of one positional argument of ``to()``: ``(True, device)`` for a device, a
    device number or a device string (``"cuda:0"``), else ``(False, a)``: a dtype or a dtype
    name, left for the caller to check."""
    if isinstance(a, (_backend.device, int, np.integer)):
        return True, a
    if isinstance(a, str):
        try:
            return True, _backend.device(a)
        except ValueError:
            pass  # "float64" and friends
    return False, a


def cuda_index(dev: _backend.device) -> int:
    """The GPU number of a CUDA device; ``cuda`` without a number is the current GPU."""
    if dev.index is not None:
        return dev.index
    return int(_backend.get_cupy().cuda.runtime.getDevice())


def cuda_index_arg(device: Any, what: str, optional: bool = True) -> Optional[int]:
    """Read the GPU argument of a ``mpitensor.cuda`` function: a GPU number, ``"cuda:N"``, a device.

    Args:
        device: an int, a ``"cuda"``/``"cuda:N"`` string, a CUDA :class:`device`, or None.
        what: the calling function's name, for messages.
        optional: whether None and ``"cuda"`` without a number may stand for the current GPU.

    Returns:
        The GPU number (a negative int is passed through: torch reads it as "no change"), or
        None for the current GPU.

    Raises:
        ValueError: a CPU device (a RuntimeError too, as torch.accelerator raises), or an
            argument of another kind, or no number where one is required.
    """
    if isinstance(device, (int, np.integer)) and not isinstance(device, bool):
        return int(device)
    if isinstance(device, (str, _backend.device)):
        dev = _backend.device(device)
        if dev.type != "cuda":
            raise _backend._BadDeviceError(
                f"{what}() takes a CUDA device, got {str(dev)!r}: pass a GPU number or 'cuda:N'")
        if dev.index is not None or optional:
            return dev.index
    elif device is None and optional:
        return None
    raise ValueError(f"{what}() takes a GPU number or a CUDA device with a number "
                     f"('cuda:0', mpitensor.device('cuda', 0)), got {device!r}")


def _meta(x: Any) -> bool:
    return isinstance(x, _backend.MetaArray)


def is_cpu(dev: Optional[_backend.device]) -> bool:
    """True for the CPU, and for None (no device asked for: host arrays are the default)."""
    return dev is None or dev.type == "cpu"


def is_on(x: Any, dev: Optional[_backend.device]) -> bool:
    """True when ``x`` already lives on ``dev`` (always, for None), so no move is needed."""
    if dev is None:
        return True
    if dev.type == "cpu":
        return isinstance(x, _ndarray) and not _meta(x)
    if dev.type == "meta":
        return _meta(x)
    return is_cupy(x) and int(x.device.id) == cuda_index(dev)


def move(arr: Any, dev: Optional[_backend.device]) -> Any:
    """``arr`` on device ``dev``: the same array when it is already there, else a copy."""
    if is_on(arr, dev):
        return arr
    if dev.type == "meta":
        return _backend.meta_array(arr.shape, arr.dtype)
    if _meta(arr):
        raise NotImplementedError(
            f"a meta tensor has no data to copy to {dev}: make it there with "
            f"Module.to_empty(device=...) (then initialize it) or a factory")
    if dev.type == "cpu":
        return arr.get()
    cp = _backend.get_cupy()
    with cp.cuda.Device(cuda_index(dev)):
        # from the host, or from another GPU (copy() allocates on the current device)
        return arr.copy() if is_cupy(arr) else cp.asarray(arr)


def create(dev: Optional[_backend.device], name: str, *args: Any, **kwargs: Any) -> Any:
    """Call the array constructor ``name`` (``zeros``, ``full``, ...) of ``dev``'s module there
    (on the meta device: an array of that shape and dtype without storage)."""
    if is_cpu(dev):
        return getattr(np, name)(*args, **kwargs)
    if dev.type == "meta":
        return getattr(_backend.META_NUMPY, name)(*args, **kwargs)
    cp = _backend.get_cupy()
    with cp.cuda.Device(cuda_index(dev)):
        return getattr(cp, name)(*args, **kwargs)


def same_device(x: Any, y: Any) -> tuple:
    """Two operands on one device; a host zero-dim array next to a GPU or meta array acts as a
    number.

    Raises:
        RuntimeError: a host array with dimensions meets a GPU or meta array.
    """
    if not hasattr(x, "ndim") or not hasattr(y, "ndim"):  # a Python number goes anywhere
        return x, y
    xc, yc = is_cupy(x), is_cupy(y)
    xm, ym = _meta(x), _meta(y)
    if xc == yc and xm == ym:
        return x, y
    if not yc and not ym and y.ndim == 0:
        return x, y.item()
    if not xc and not xm and x.ndim == 0:
        return x.item(), y
    raise RuntimeError(
        f"Expected all tensors to be on the same device, but found at least two devices, "
        f"{device_str(x)} and {device_str(y)}! Move one with .to(device) first."
    )
