"""What mpitensor.cuda's modules share: the error for a missing GPU and finding CuPy and a GPU."""

from __future__ import annotations

import sys
from typing import Any, Optional, Union

from mpitensor import backend as _backend
from mpitensor.errors import MpiTensorError

DeviceArg = Union[int, str, _backend.device, None]


class CudaUnavailableError(MpiTensorError, AssertionError):
    """A GPU function was called where CuPy or a GPU is missing.

    A RuntimeError, as ``torch.accelerator`` raises here, and an AssertionError, as a CPU-only
    build of ``torch.cuda`` raises, so either ``except`` of a torch program catches it.
    """


def _no_gpu(what: str) -> CudaUnavailableError:
    """The error for ``what``: a name in mpitensor.cuda, or ``accelerator.<name>``."""
    reason = _backend.cupy_unavailable_reason() or "no CUDA device is visible"
    where = f"mpitensor.{what}" if what.startswith("accelerator.") else f"mpitensor.cuda.{what}"
    return CudaUnavailableError(
        f"{where}() needs a GPU, and none can be used here: {reason}. Ask "
        f"mpitensor.cuda.is_available() first, or run on device('cpu')")


def _cupy(what: str) -> Any:
    """The ``cupy`` module, where a GPU can be used; else a :class:`CudaUnavailableError`."""
    if not _backend.cupy_available():
        raise _no_gpu(what)
    return _backend.get_cupy()


def _loaded_cupy() -> Any:
    """The ``cupy`` module if something already imported it (then GPU state may exist)."""
    return sys.modules.get("cupy")


def _resolve(cp: Any, idx: Optional[int], what: str) -> int:
    """A GPU number that exists: ``idx`` checked against the count, or the current GPU."""
    if idx is None or idx < 0:
        return int(cp.cuda.runtime.getDevice())
    n = int(cp.cuda.runtime.getDeviceCount())
    if idx >= n:
        seen = "GPU 0" if n == 1 else f"GPUs 0 to {n - 1}"
        raise _backend._BadDeviceError(
            f"mpitensor.cuda.{what}(): there is no GPU {idx}; this process sees {seen}. Pick "
            f"one of those (CUDA_VISIBLE_DEVICES decides which GPUs a process sees)")
    return idx
