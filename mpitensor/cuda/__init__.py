"""``mpitensor.cuda``: ask about GPUs and choose one, with ``torch.cuda``'s names, through CuPy.

A torch program's device set-up runs unchanged::

    import mpitensor as torch

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        torch.cuda.set_device(local_rank)

The current GPU is CuPy's (``cupy.cuda.Device(i).use()``), so what ``set_device`` chooses is
where ``"cuda"`` tensors and CuPy's own arrays go, per thread as in torch.

Without CuPy or without a GPU, the questions have answers (``is_available()`` is False,
``device_count()`` is 0, ``is_initialized()`` is False, ``memory_allocated()`` is 0), calls that
only tune GPU state are safe no-ops (``manual_seed``, ``manual_seed_all``, ``empty_cache``), and
calls that need a GPU (``set_device``, ``current_device``, ``synchronize``, ``get_device_name``,
``init``, entering ``device(i)``) raise :class:`CudaUnavailableError`, which says why and how to
get CuPy. CuPy is imported only when a function here needs to ask it.
"""

from __future__ import annotations

from typing import Any, Optional

from mpitensor import backend as _backend
from mpitensor._core.devices import cuda_index_arg

from ._common import (  # noqa: F401 - the package's own helpers, kept here for callers
    CudaUnavailableError,
    DeviceArg,
    _cupy,
    _loaded_cupy,
    _no_gpu,
    _resolve,
)

CudaUnavailableError.__module__ = __name__  # its public home

__all__ = [
    "CudaUnavailableError", "is_available", "device_count", "is_initialized", "init",
    "set_device", "current_device", "synchronize", "device",
    "empty_cache", "get_device_name", "get_device_capability", "is_bf16_supported",
]



def is_available() -> bool:
    """Return True when CuPy imports and at least one GPU is visible.

    Example:
        >>> import mpitensor as torch
        >>> device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    """
    return _backend.cupy_available()


def device_count() -> int:
    """Return the number of GPUs this process sees (0 without CuPy or a GPU).

    Example:
        >>> import mpitensor as torch
        >>> n = torch.cuda.device_count()  # 0 on a machine without a GPU
    """
    if not _backend.cupy_available():
        return 0
    return int(_backend.get_cupy().cuda.runtime.getDeviceCount())


def is_initialized() -> bool:
    """Return True once CuPy has been loaded (by a GPU tensor, a call here, ...) and sees a GPU.

    Example:
        >>> import mpitensor as torch
        >>> torch.cuda.is_initialized()  # False until something uses the GPU
        False
    """
    return _loaded_cupy() is not None and _backend.cupy_available()


def init() -> None:
    """Load CuPy and make sure a GPU can be used (other functions here do this themselves).

    Raises:
        CudaUnavailableError: CuPy or a GPU is missing.

    Example:
        >>> import mpitensor as torch
        >>> if torch.cuda.is_available():
        ...     torch.cuda.init()
    """
    cp = _cupy("init")
    cp.cuda.runtime.getDevice()


def set_device(device: DeviceArg) -> None:
    """Make GPU ``device`` the current one for this thread (a negative number changes nothing).

    Args:
        device: a GPU number, ``"cuda:N"`` or ``mpitensor.device("cuda", N)``.

    Raises:
        ValueError: a CPU device, None, ``"cuda"`` without a number, or another kind of value.
        CudaUnavailableError: CuPy or a GPU is missing.
        RuntimeError: there is no GPU with that number (also a ValueError).

    Example:
        >>> import mpitensor as torch
        >>> if torch.cuda.is_available():
        ...     torch.cuda.set_device(0)
    """
    idx = cuda_index_arg(device, "set_device", optional=False)
    if idx < 0:
        return
    cp = _cupy("set_device")
    cp.cuda.Device(_resolve(cp, idx, "set_device")).use()


def current_device() -> int:
    """Return the number of the current GPU.

    Raises:
        CudaUnavailableError: CuPy or a GPU is missing.

    Example:
        >>> import mpitensor as torch
        >>> gpu = torch.cuda.current_device() if torch.cuda.is_available() else None
    """
    return int(_cupy("current_device").cuda.runtime.getDevice())


def synchronize(device: DeviceArg = None) -> None:
    """Wait until every kernel queued on a GPU (the current one by default) has finished.

    Args:
        device: a GPU number, ``"cuda"``/``"cuda:N"``, a CUDA device, or None.

    Raises:
        ValueError: a CPU device or another kind of value.
        CudaUnavailableError: CuPy or a GPU is missing.
        RuntimeError: there is no GPU with that number (also a ValueError).

    Example:
        >>> import mpitensor as torch
        >>> if torch.cuda.is_available():
        ...     torch.cuda.synchronize()  # before reading a timer
    """
    idx = cuda_index_arg(device, "synchronize")
    cp = _cupy("synchronize")
    cp.cuda.Device(_resolve(cp, idx, "synchronize")).synchronize()


class device:  # noqa: N801 - named like torch.cuda.device
    """A context manager that makes a GPU current inside a ``with`` block, then restores it.

    A negative number or None changes nothing (and needs no GPU), as in torch.

    Args:
        device: a GPU number, ``"cuda:N"``, a CUDA device, or None.

    Raises:
        ValueError: a CPU device or another kind of value (when made).
        CudaUnavailableError: CuPy or a GPU is missing (when entered).

    Example:
        >>> import mpitensor as torch
        >>> if torch.cuda.device_count() > 1:
        ...     with torch.cuda.device(1):
        ...         x = torch.zeros(3, device="cuda")  # on GPU 1
    """

    def __init__(self, device: DeviceArg) -> None:
        self.idx = cuda_index_arg(device, "device")
        self.prev: Optional[int] = None

    def __enter__(self) -> device:
        if self.idx is None or self.idx < 0:
            return self
        cp = _cupy("device")
        idx = _resolve(cp, self.idx, "device")
        self.prev = int(cp.cuda.runtime.getDevice())
        if idx != self.prev:
            cp.cuda.Device(idx).use()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.prev is not None:
            _backend.get_cupy().cuda.Device(self.prev).use()
            self.prev = None


class device_of(device):  # noqa: N801 - named like torch.cuda.device_of
    """:class:`device` for the GPU that holds ``obj`` (a tensor); for a CPU tensor a context that
    changes nothing (and needs no GPU), as in torch.

    Example:
        >>> import mpitensor as torch
        >>> with torch.cuda.device_of(torch.zeros(2)):  # a CPU tensor: nothing changes
        ...     pass
    """

    def __init__(self, obj: Any) -> None:
        super().__init__(obj.get_device() if obj.is_cuda else -1)


def empty_cache() -> None:
    """Give the current GPU's unused cached memory (CuPy's memory pools) back to the driver.

    Does nothing where CuPy was never loaded: then no memory was cached.

    Example:
        >>> import mpitensor as torch
        >>> torch.cuda.empty_cache()
    """
    cp = _loaded_cupy()
    if cp is None or not _backend.cupy_available():
        return
    cp.get_default_memory_pool().free_all_blocks()
    cp.get_default_pinned_memory_pool().free_all_blocks()


def _properties(device: DeviceArg, what: str) -> dict:
    idx = cuda_index_arg(device, what)
    cp = _cupy(what)
    return cp.cuda.runtime.getDeviceProperties(_resolve(cp, idx, what))


def get_device_name(device: DeviceArg = None) -> str:
    """Return a GPU's name (the current GPU's by default), e.g. ``"NVIDIA H100 80GB HBM3"``.

    Raises:
        ValueError, RuntimeError, CudaUnavailableError: as :func:`synchronize`, for the same
            ``device`` arguments.

    Example:
        >>> import mpitensor as torch
        >>> if torch.cuda.is_available():
        ...     print(torch.cuda.get_device_name(0))
    """
    name = _properties(device, "get_device_name")["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


def get_device_capability(device: DeviceArg = None) -> tuple:
    """Return a GPU's compute capability as ``(major, minor)``, e.g. ``(9, 0)`` for an H100.

    Raises:
        ValueError, CudaUnavailableError, RuntimeError: as :func:`get_device_name`.

    Example:
        >>> import mpitensor as torch
        >>> if torch.cuda.is_available():
        ...     major, minor = torch.cuda.get_device_capability()
    """
    props = _properties(device, "get_device_capability")
    return int(props["major"]), int(props["minor"])



def is_bf16_supported(including_emulation: bool = True) -> bool:
    """Return whether bfloat16 tensors can be used on the current GPU (False without one).

    True where a bfloat16 tensor can be made there; with ``including_emulation=False`` the GPU
    must also compute in bfloat16 natively (compute capability 8.0 or newer), as in torch.

    Example:
        >>> import mpitensor as torch
        >>> dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    """
    if not is_available():
        return False
    if not including_emulation and get_device_capability()[0] < 8:
        return False
    from mpitensor import dtypes
    from mpitensor._ops.create import zeros

    try:
        zeros(1, dtype=dtypes.bfloat16, device="cuda")
    except (TypeError, ValueError, RuntimeError):
        return False  # CuPy without bfloat16 arrays
    return True


from . import graphs, nvtx, profiler  # noqa: E402 - torch.cuda's submodules
from .graphs import *  # noqa: E402, F403 - CUDA graphs (not available: they raise)
from .memory import *  # noqa: E402, F403 - torch.cuda's memory statistics
from .properties import *  # noqa: E402, F403 - device properties, NVML readings, errors
from .random import *  # noqa: E402, F403 - the GPUs' seeds and random states
from .streams import *  # noqa: E402, F403 - torch.cuda's Event and Stream
from .tensor_types import *  # noqa: E402, F403 - torch.cuda.FloatTensor, ...

__all__ += [*graphs.__all__, *memory.__all__, *properties.__all__, *random.__all__,  # noqa: F405
            *streams.__all__, *tensor_types.__all__, "device_of", "default_generators",  # noqa: F405
            "graphs", "memory", "nvtx", "profiler", "random", "streams"]


def __getattr__(name: str) -> Any:
    # mpitensor.cuda.amp imports mpitensor.amp, which needs the tensor ops that import this
    # module: it is loaded on first use
    if name == "amp":
        import importlib

        return importlib.import_module("mpitensor.cuda.amp")
    if name == "default_generators":  # one per GPU this process sees, asked each time
        return random.default_generators()  # noqa: F405
    raise AttributeError(f"module 'mpitensor.cuda' has no attribute {name!r}")
