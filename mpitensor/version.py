"""``mpitensor.version`` (``torch.version``): ``__version__``, and ``cuda`` (the CUDA version
CuPy was built for, or None without CuPy, as a CPU build of torch answers), ``hip`` (None),
``debug`` (False), ``git_version`` (the release, for want of a build hash).

Example:
    >>> import mpitensor as torch
    >>> torch.version.hip is None
    True
"""

from __future__ import annotations

from typing import Any, Optional

__all__ = ["__version__", "cuda", "hip", "debug", "git_version"]  # noqa: F822 - cuda: lazy

__version__ = "0.1.0"  # kept equal to mpitensor.__version__ by a test
hip: Optional[str] = None
debug = False
git_version = __version__


def _cuda_version() -> Optional[str]:
    try:
        import cupy  # noqa: PLC0415 - only when asked: importing CuPy is slow
    except Exception:
        return None
    try:
        v = int(cupy.cuda.runtime.runtimeGetVersion())
    except Exception:
        return None
    return f"{v // 1000}.{(v % 1000) // 10}"


def __getattr__(name: str) -> Any:
    if name == "cuda":
        return _cuda_version()
    raise AttributeError(f"module 'mpitensor.version' has no attribute {name!r}")
