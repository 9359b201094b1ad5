"""The tensor ops, gathered: importing this module imports every op module.

Each op module keeps an op's forward and backward side by side and, when imported, adds its
methods to :class:`~mpitensor.tensor.Tensor` and hands the functions of
``mpitensor.tensor.__all__`` to that module (``tensor._serve``). ``mpitensor/__init__.py``
imports this module before any other part of the package, so every tensor has all its methods
and ``from mpitensor.tensor import zeros`` works wherever the package is imported.

==================  =====================================================================
``_operators``      Python's operators (``+ - * / // % ** @``, comparisons, bitwise)
``_elementwise``    ``exp``, ``log``, ``sqrt``, ``relu``, ``sigmoid``, ``tanh``, ``clamp``
``_math_ops``       ``sin``, ``erf``, ``floor``, ``atan2``, ``hypot``, ``isnan``, ``eq_``, ...
``_softmax``        ``softmax``, ``log_softmax``
``_reductions``     ``sum``, ``mean``, ``var``, ``max``/``min``, ``argmax``, ``all``, ...
``_views``          ``view``, ``reshape``, ``flatten``, ``permute``, ``expand``, ...
``_indexing``       ``t[key]``, ``t[key] = value``, ``nonzero``
``_gather_scatter`` ``gather``, ``scatter``, ``index_select``, ``masked_select``, ``take``, ...
``_scans``          ``cumsum``, ``cumprod``, ``cummax``, ``cummin``, ``logcumsumexp``
``_statistics``     ``median``, ``nanmedian``, ``kthvalue``, ``mode``
``_linalg_ops``     ``mm``, ``einsum``, ``tril``, ``diagonal``, ``det``, ``norm``, ...
``_shape_ops``      ``flip``, ``roll``, ``movedim``, ``meshgrid``, ``hstack``, ``diff``, ...
``_counting``       ``bincount``, ``histc``, ``searchsorted``, ``unique``
``_casting``        ``to``, ``cpu``, ``cuda``, ``float``, ``type``, ...
``_combining``      ``cat``, ``stack``, ``where``, ``allclose``, ``equal``
``_creation``       ``tensor``, ``zeros``, ``arange``, ``*_like``, ``Tensor.new_*``
``_random``         generators, seeds and random tensors
``_functions``      ``mpitensor.exp(x)`` and the other function forms of the methods
==================  =====================================================================
"""

from __future__ import annotations

from mpitensor import (
    _casting,
    _combining,
    _counting,
    _creation,
    _elementwise,
    _functions,
    _gather_scatter,
    _indexing,
    _linalg_ops,
    _math_ops,
    _operators,
    _random,
    _reductions,
    _scans,
    _shape_ops,
    _softmax,
    _statistics,
    _views,
)
from mpitensor import tensor as _t

OP_MODULES = (_operators, _elementwise, _math_ops, _softmax, _reductions, _views, _indexing,
              _gather_scatter, _scans, _statistics, _linalg_ops, _shape_ops, _counting,
              _casting, _combining, _creation, _random, _functions)

_missing = sorted(set(_t._SERVED_NAMES) - set(_t._served))
if _missing:  # a name of mpitensor.tensor.__all__ that no op module defines
    raise ImportError(f"mpitensor.tensor.__all__ names {_missing}, which no op module serves")
