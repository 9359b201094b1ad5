"""``torch.nn.modules.utils``: the argument helpers that layer code written for torch imports.

Example:
    >>> _pair(3), _triple((1, 2, 3))
    ((3, 3), (1, 2, 3))
"""

from __future__ import annotations

import collections.abc
from itertools import repeat
from typing import Any, Callable, List

__all__ = ["consume_prefix_in_state_dict_if_present"]


def _ntuple(n: int, name: str = "parse") -> Callable[[Any], tuple]:
    """A function that turns a value into an ``n``-tuple: an iterable is kept as a tuple, any
    other value is repeated ``n`` times."""
    def parse(x: Any) -> tuple:
        if isinstance(x, collections.abc.Iterable) and not isinstance(x, str):
            return tuple(x)
        return tuple(repeat(x, n))

    parse.__name__ = name
    return parse


_single = _ntuple(1, "_single")
_pair = _ntuple(2, "_pair")
_triple = _ntuple(3, "_triple")
_quadruple = _ntuple(4, "_quadruple")


def _reverse_repeat_tuple(t: Any, n: int) -> tuple:
    """Each element of ``t``, last first, repeated ``n`` times: ``(1, 2)``, 2 -> ``(2, 2, 1, 1)``
    (how padding per dimension becomes ``F.pad``'s order)."""
    return tuple(x for x in reversed(tuple(t)) for _ in range(n))


def _list_with_default(out_size: Any, defaults: List[int]) -> List[int]:
    """An adaptive pooling's output size with None entries taken from ``defaults`` (the input's
    trailing sizes)."""
    if isinstance(out_size, int):
        return [out_size]
    if len(defaults) <= len(out_size):
        raise ValueError(f"the input needs more than {len(out_size)} dimensions, got "
                         f"{len(defaults)}")
    tail = defaults[-len(out_size):]
    return [d if o is None else o for o, d in zip(out_size, tail)]


def consume_prefix_in_state_dict_if_present(state_dict: Any, prefix: str) -> None:
    """Strip ``prefix`` from every key of ``state_dict`` that starts with it, in place (and
    from its ``_metadata``, if any): how a DDP checkpoint's ``module.`` keys load into the bare
    model."""
    for key in sorted(state_dict.keys()):
        if key.startswith(prefix):
            state_dict[key[len(prefix):]] = state_dict.pop(key)
    meta = getattr(state_dict, "_metadata", None)
    if meta is not None:
        for key in list(meta.keys()):
            if len(key) == 0:
                continue
            if key == prefix.rstrip(".") or key.startswith(prefix):
                meta[key[len(prefix):] if key.startswith(prefix) else ""] = meta.pop(key)
