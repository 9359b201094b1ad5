"""The tensors in a module's output, however it nests them (lists, tuples, dicts).

Both data-parallel wrappers need them: ``DataParallel`` guards each output's graph, DDP's
Reducer hooks the first node of backward under each output.
"""

from __future__ import annotations

from typing import Any, List

from mpitensor.tensor import Tensor

__all__ = ["collect_tensors"]


def collect_tensors(obj: Any, out: List[Tensor]) -> None:
    """Append every tensor in ``obj`` (nested lists, tuples and dict values) to ``out``."""
    if isinstance(obj, Tensor):
        out.append(obj)
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            collect_tensors(o, out)
    elif isinstance(obj, dict):
        for o in obj.values():
            collect_tensors(o, out)
