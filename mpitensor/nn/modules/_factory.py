"""``torch.nn.factory_kwargs``: the tensor-creation keywords (``device``, ``dtype``,
``memory_format``) of a layer constructor's ``**kwargs``, merged with a ``factory_kwargs``
dict given among them."""

from __future__ import annotations

from typing import Any, Dict, Optional

__all__ = ["factory_kwargs"]

_SIMPLE = ("device", "dtype", "memory_format")


def factory_kwargs(kwargs: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """The creation keywords of ``kwargs`` as one dict.

    Raises:
        TypeError: a key other than device, dtype, memory_format and factory_kwargs, or one
            given both directly and inside ``factory_kwargs``.

    Example:
        >>> factory_kwargs({"dtype": "float64", "factory_kwargs": {"device": "cpu"}})
        {'device': 'cpu', 'dtype': 'float64'}
    """
    if kwargs is None:
        return {}
    unknown = set(kwargs) - {*_SIMPLE, "factory_kwargs"}
    if unknown:
        raise TypeError(f"factory_kwargs(): unexpected keys {sorted(unknown)}; only device, "
                        f"dtype, memory_format and factory_kwargs are creation keywords")
    merged = dict(kwargs.get("factory_kwargs") or {})
    for key in _SIMPLE:
        if key in kwargs:
            if key in merged:
                raise TypeError(f"factory_kwargs(): {key} is given twice, directly and inside "
                                f"factory_kwargs")
            merged[key] = kwargs[key]
    return merged
