"""The tensor ops, gathered: importing this module imports every op module.

Each op module keeps an op's forward and backward side by side and, when imported, adds its
methods to :class:`~mpitensor.tensor.Tensor` and hands the functions of
``mpitensor.tensor.__all__`` to that module (``opkit.serve``). ``mpitensor/__init__.py``
imports this module before any other part of the package, so every tensor has all its methods
and ``from mpitensor.tensor import zeros`` works wherever the package is imported.

==================  =====================================================================
``operators``       Python's operators (``+ - * / // % ** @``, comparisons, bitwise)
``elementwise``     ``exp``, ``log``, ``sqrt``, ``relu``, ``sigmoid``, ``tanh``, ``clamp``
``math``            ``sin``, ``erf``, ``floor``, ``atan2``, ``hypot``, ``isnan``, ``eq_``, ...
``complex``         ``real``, ``imag``, ``conj``, ``angle``, ``mH``, ``adjoint``
``special``         the special functions' kernels (``erf``, ``lgamma``, ``digamma``, ...)
``softmax``         ``softmax``, ``log_softmax``
``reductions``      ``sum``, ``mean``, ``var``, ``max``/``min``, ``argmax``, ``all``, ...
``views``           ``view``, ``reshape``, ``flatten``, ``permute``, ``expand``, ...
``indexing``        ``t[key]``, ``t[key] = value``, ``nonzero``
``gather_scatter``  ``gather``, ``scatter``, ``index_select``, ``masked_select``, ``take``, ...
``scans``           ``cumsum``, ``cumprod``, ``cummax``, ``cummin``, ``logcumsumexp``
``statistics``      ``median``, ``nanmedian``, ``kthvalue``, ``mode``
``linalg``          ``mm``, ``einsum``, ``tril``, ``diagonal``, ``det``, ``solve``, ...
``norms``           ``norm``, ``vector_norm``, ``matrix_norm``, ``dist``, ``cdist``, ``renorm``
``shape``           ``flip``, ``roll``, ``movedim``, ``meshgrid``, ``hstack``, ``diff``, ...
``counting``        ``bincount``, ``histc``, ``searchsorted``, ``unique``
``cast``            ``to``, ``cpu``, ``cuda``, ``float``, ``type``, ...
``combine``         ``cat``, ``stack``, ``where``, ``allclose``, ``equal``
``create``          ``tensor``, ``zeros``, ``arange``, ``*_like``, ``Tensor.new_*``
``random``          generators, seeds and random tensors
``functions``       ``mpitensor.exp(x)`` and the other function forms of the methods
``sparse``          sparse COO and CSR tensors (a package: coo, products, csr, grad)
``linalg_legacy``   ``torch.qr``, ``torch.svd``, ``torch.cholesky``, ``torch.lu``, ...
``spectral``        window functions, ``stft``, ``istft``
``runtime``         process-wide switches (``use_deterministic_algorithms``), ``as_strided``
==================  =====================================================================
"""

from __future__ import annotations

from mpitensor import tensor as _t

from . import (
    cast,
    combine,
    complex,
    counting,
    create,
    elementwise,
    functions,
    gather_scatter,
    indexing,
    linalg,
    linalg_legacy,
    math,
    norms,
    operators,
    random,
    reductions,
    runtime,
    scans,
    shape,
    softmax,
    spectral,
    statistics,
    views,
)

OP_MODULES = (operators, elementwise, math, complex, softmax, reductions, views, indexing,
              gather_scatter, scans, statistics, linalg, norms, shape, counting,
              cast, combine, create, random, functions, linalg_legacy, spectral, runtime)

_missing = sorted(set(_t._SERVED_NAMES) - set(_t._served))
if _missing:  # a name of mpitensor.tensor.__all__ that no op module defines
    raise ImportError(f"mpitensor.tensor.__all__ names {_missing}, which no op module serves")
