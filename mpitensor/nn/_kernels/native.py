"""conv2d's and 2x2 max pooling's compiled loops (``_cpu_kernels``, built from
``_cpu_kernels.c`` when mpitensor is installed) and the BLAS products they call.

The loops release the interpreter lock for all of their work, so that the threads a layer
shares its work out to (``mpitensor._base.parallel.run_split``) run in parallel. conv2d's take the
matrix products from the BLAS library NumPy itself loaded (its CBLAS ``?gemm``, found through
threadpoolctl's handle on the library), so that they run on the same kernels, under the same
thread limits, as NumPy's own ``matmul``. They are used where all of this holds, and the NumPy
loops in :mod:`mpitensor.nn._kernels` everywhere else:

- the extension was built (a C compiler at install time; without one the install still
  succeeds, as a pure-Python package);
- float32 or float64 NumPy arrays;
- for conv2d, a CBLAS ``sgemm``/``dgemm`` that takes 64-bit integers is found in a loaded BLAS
  (NumPy's wheels: OpenBLAS, ``scipy_cblas_sgemm64_``; also ``cblas_sgemm64_``);
- ``MPITENSOR_NATIVE`` is not off (``0``/``off``: the NumPy loops, e.g. to compare).
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any, Optional

import numpy as np

from mpitensor._base import native as _native

__all__: list = []  # private module

#: (symbol pattern, 64-bit integers) tried in this order over every loaded BLAS: only names
#: that say they take 64-bit integers (a bare ``cblas_sgemm`` is 32-bit in most builds but
#: 64-bit in some, e.g. MKL with MKL_INTERFACE_LAYER=ILP64, and a wrong guess corrupts memory;
#: a 32-bit one would overflow on a layer of more than 2**31 output elements)
_SYMBOLS = (("scipy_cblas_{}gemm64_", True), ("cblas_{}gemm64_", True))

_lock = threading.Lock()
_state: dict = {}


def _find_gemm(letter: str) -> Optional[tuple]:
    """``(address, ilp64)`` of a CBLAS ``?gemm`` in a BLAS that threadpoolctl sees loaded."""
    from mpitensor._base.parallel import _pools  # noqa: PLC0415 - the controllers, found once

    libs = [dll for dll in (getattr(lib, "dynlib", None) for lib in _pools.get())
            if dll is not None]
    for pattern, ilp64 in _SYMBOLS:
        for dll in libs:
            try:
                fn = getattr(dll, pattern.format(letter))
            except AttributeError:
                continue
            addr = ctypes.cast(fn, ctypes.c_void_p).value
            if addr:
                return addr, ilp64
    return None


def _load() -> dict:
    """The module (or None) and {itemsize: (module, gemm)} for conv2d's loops."""
    _cpu_kernels = _native.module()
    if _cpu_kernels is None:
        return {"module": None, "by_size": {}}
    found = {}
    for itemsize, letter in ((4, "s"), (8, "d")):
        gemm = _find_gemm(letter)
        if gemm is not None:
            found[itemsize] = (_cpu_kernels, gemm)
    return {"module": _cpu_kernels, "by_size": found}


def _loaded() -> dict:
    if "loaded" not in _state:
        with _lock:
            if "loaded" not in _state:
                _state.update(_load())
                _state["loaded"] = True
    return _state


def get(dtype: Any) -> Optional[tuple]:
    """``(module, gemm)`` for conv2d's compiled loops on ``dtype`` (float32, float64), or None
    where they do not apply."""
    state = _loaded()
    if dtype != np.float32 and dtype != np.float64:
        return None
    return state["by_size"].get(np.dtype(dtype).itemsize)


def module(dtype: Any) -> Any:
    """The compiled loops' module for a loop that needs no BLAS (pooling) on ``dtype``, or
    None."""
    state = _loaded()
    if dtype != np.float32 and dtype != np.float64:
        return None
    return state["module"]

