"""ShapeProp: run a GraphModule and note each node's output shape and dtype in its meta."""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

from mpitensor.tensor import Tensor

from ..interpreter import Interpreter
from ..node import Node, map_aggregate

__all__ = ["ShapeProp", "TensorMetadata"]


class TensorMetadata(NamedTuple):
    """What ShapeProp records of a tensor value."""

    shape: Any
    dtype: Any
    requires_grad: bool
    stride: tuple
    memory_format: Optional[Any]
    is_quantized: bool
    qparams: dict


def _extract(t: Tensor) -> TensorMetadata:
    return TensorMetadata(t.shape, t.dtype, t.requires_grad, tuple(t.stride()), None, False, {})


class ShapeProp(Interpreter):
    """Run the module on example inputs; each node's ``meta['tensor_meta']`` gets the
    :class:`TensorMetadata` of its value (a structure of them for tuples/lists of tensors)
    and ``meta['type']`` the value's type.

    Example:
        >>> import mpitensor as torch
        >>> from mpitensor.fx import symbolic_trace
        >>> gm = symbolic_trace(lambda x: x.sum(0))
        >>> _ = ShapeProp(gm).propagate(torch.ones(2, 3))
        >>> [tuple(n.meta["tensor_meta"].shape) for n in gm.graph.nodes][1]
        (3,)
    """

    def run_node(self, n: Node) -> Any:
        result = super().run_node(n)
        found = False

        def note(x: Any) -> Any:
            nonlocal found
            if isinstance(x, Tensor):
                found = True
                return _extract(x)
            return x

        meta = map_aggregate(result, note)
        if found:
            n.meta["tensor_meta"] = meta
        n.meta["type"] = type(result)
        return result

    def propagate(self, *args: Any) -> Any:
        """Run the module on ``args``, recording metadata; returns its result."""
        return super().run(*args)
