"""mpitensor.fx: capture a program as a graph, edit it, and run it again (torch.fx's API).

``symbolic_trace(module)`` runs ``forward`` on :class:`Proxy` values and records each
operation as a :class:`Node` of a :class:`Graph`; a :class:`GraphModule` turns the graph
back into Python (``gm.code``) and runs it. :class:`Interpreter` and :class:`Transformer`
walk a graph node by node; :func:`replace_pattern` rewrites subgraphs. How calls such as
``torch.relu(proxy)`` are recorded is explained in :mod:`mpitensor.fx._dispatch`.

Example:
    >>> import mpitensor as torch
    >>> from mpitensor.fx import symbolic_trace
    >>> class M(torch.nn.Module):
    ...     def forward(self, x):
    ...         return torch.relu(x) + 1
    >>> gm = symbolic_trace(M())
    >>> print(gm.code.strip())
    def forward(self, x):
        relu = torch.relu(x);  x = None
        add = relu + 1;  relu = None
        return add
"""

from . import (
           _symbolic_trace,
           graph,
           graph_module,
           interpreter,
           node,
           passes,
           proxy,
           subgraph_rewriter,
)
from ._symbolic_trace import PH, Tracer, symbolic_trace, wrap
from .graph import Graph, PythonCode
from .graph_module import GraphModule
from .interpreter import Interpreter, Transformer
from .node import Node, has_side_effect, map_arg
from .proxy import Proxy, TraceError
from .subgraph_rewriter import replace_pattern

__all__ = ["symbolic_trace", "Tracer", "Graph", "GraphModule", "Node", "Proxy", "wrap",
           "Interpreter", "Transformer", "replace_pattern", "map_arg", "has_side_effect",
           "PythonCode", "TraceError", "PH", "graph", "graph_module", "node", "proxy",
           "interpreter", "passes", "subgraph_rewriter", "_symbolic_trace"]
