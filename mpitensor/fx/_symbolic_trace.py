"""Symbolic tracing: run a module's ``forward`` on proxies and keep what it did as a Graph."""

from __future__ import annotations

import builtins
import inspect
import math
from collections.abc import Callable
from typing import Any, Optional, Union

from mpitensor import nn
from mpitensor.tensor import Tensor

from . import _dispatch
from ._names import WRAPPED
from .graph import Graph
from .node import Argument
from .proxy import TracerBase

__all__ = ["Tracer", "symbolic_trace", "wrap", "PH"]

# (id of globals dict, name) -> that globals dict, for every fx.wrap call
_WRAP_SITES: dict = {}


class _PlaceholderMarker:
    def __repr__(self) -> str:
        return "PH"


PH = _PlaceholderMarker()  # a concrete_args value that asks for a normal placeholder


def wrap(fn_or_name: Union[str, Callable]) -> Union[str, Callable]:
    """Make calls to a module-level function leaves of tracing: recorded as one
    ``call_function`` node instead of being traced through. Call it at the top level of
    the module that defines or imports the function; returns its argument.

    Raises:
        NotImplementedError: when called inside a function.
        TypeError: for something without a name.
    """
    frame = inspect.currentframe()
    caller = frame.f_back if frame is not None else None
    if caller is None or caller.f_code.co_name != "<module>":
        raise NotImplementedError("fx.wrap must be called at the top level of a module")
    if isinstance(fn_or_name, str):
        name = fn_or_name
    elif callable(fn_or_name) and hasattr(fn_or_name, "__name__"):
        name = fn_or_name.__name__
    else:
        raise TypeError(f"fx.wrap takes a function or the name of one, got {fn_or_name!r}")
    if name.startswith("<"):
        raise NotImplementedError("fx.wrap cannot wrap a lambda; give the function a name")
    g = caller.f_globals
    _WRAP_SITES[(id(g), name)] = g
    target = g.get(name, getattr(builtins, name, None))
    if target is not None:
        WRAPPED[id(target)] = target
    return fn_or_name


class _LeafCall:
    """Stands in for a wrapped function during a trace."""

    __slots__ = ("__wrapped__",)

    def __init__(self, fn: Callable) -> None:
        self.__wrapped__ = fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        proxy = _dispatch.find_proxy(args, kwargs)
        if proxy is None:
            return self.__wrapped__(*args, **kwargs)
        return proxy.tracer.create_proxy("call_function", self.__wrapped__, args, kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__wrapped__, name)


class Tracer(TracerBase):
    """Records a Graph by running ``forward`` (or a function) on :class:`Proxy` values.

    Built-in ``mpitensor.nn`` modules are leaves (one ``call_module`` node each); user
    modules are traced through. Override ``is_leaf_module``, ``call_module``,
    ``create_proxy``, ``create_node``, ``create_arg`` or ``getattr`` to change that.

    Args:
        autowrap_modules: modules whose functions, bound by name in the traced code's
            globals, are recorded as leaves (``math`` by default).
        autowrap_functions: single functions to treat the same way.
        param_shapes_constant: accepted for torch's signature (sizes are recorded anyway).
    """

    def __init__(self, autowrap_modules: tuple = (math,), autowrap_functions: tuple = (),
                 param_shapes_constant: bool = False) -> None:
        super().__init__()
        self._autowrap_ids = {id(v) for m in autowrap_modules for k, v in vars(m).items()
                              if not k.startswith("_") and callable(v)}
        self._autowrap_ids |= {id(f) for f in autowrap_functions}
        self.param_shapes_constant = param_shapes_constant
        self.root: Optional[nn.Module] = None
        self.submodule_paths: Optional[dict] = None

    # --- hooks -------------------------------------------------------------------------------
    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        """Whether a module call is recorded as one node (True for built-in nn modules)."""
        mod = type(m).__module__
        return (mod.startswith(("mpitensor.nn", "torch.nn")) and
                not isinstance(m, nn.Sequential))

    def path_of_module(self, mod: nn.Module) -> str:
        """The qualified name of ``mod`` inside the traced root.

        Raises:
            NameError: ``mod`` is not a submodule of the root.
        """
        if self.submodule_paths is None:
            self.submodule_paths = {id(m): n for n, m in self.root.named_modules()}
        path = self.submodule_paths.get(id(mod))
        if path is None:
            raise NameError(f"module {type(mod).__name__} is not a submodule of the traced "
                            f"root; assign it as an attribute in __init__")
        return path

    def call_module(self, m: nn.Module, forward: Callable[..., Any], args: tuple,
                    kwargs: dict) -> Any:
        """A module call met while tracing: a leaf becomes a ``call_module`` node, any
        other module's ``forward`` is traced through."""
        qualname = self.path_of_module(m)
        if not self.is_leaf_module(m, qualname):
            return forward(*args, **kwargs)
        return self.create_proxy("call_module", qualname, args, kwargs)

    def getattr(self, attr: str, attr_val: Any, parameter_proxy_cache: dict) -> Any:
        """A module attribute read while tracing: parameters and buffers of the root become
        ``get_attr`` proxies (one per name), other values are returned as they are."""
        if isinstance(attr_val, Tensor):
            path = self._tensor_paths.get(id(attr_val))
            if path is not None:
                if path not in parameter_proxy_cache:
                    parameter_proxy_cache[path] = self.create_proxy("get_attr", path, (), {})
                return parameter_proxy_cache[path]
        return attr_val

    def create_arg(self, a: Any) -> Argument:
        """Like TracerBase's, plus tensors and modules: those of the root become
        ``get_attr`` nodes, other tensors are stored on the root as ``_tensor_constant<i>``."""
        if isinstance(a, Tensor):
            path = self._tensor_paths.get(id(a))
            if path is None:
                i = 0
                while hasattr(self.root, f"_tensor_constant{i}"):
                    i += 1
                path = f"_tensor_constant{i}"
                setattr(self.root, path, a)
                self._tensor_paths[id(a)] = path
                self._keep.append(a)
            return self.create_node("get_attr", path, (), {})
        if isinstance(a, nn.Module):
            return self.create_node("get_attr", self.path_of_module(a), (), {})
        return super().create_arg(a)

    # --- tracing -----------------------------------------------------------------------------
    def trace(self, root: Union[nn.Module, Callable[..., Any]],
              concrete_args: Optional[dict] = None) -> Graph:
        """Run ``root`` (a module's forward, or a function) on proxies; return the Graph.

        Args:
            root: the module or function to trace.
            concrete_args: inputs fixed to a value: the code sees the value (so Python
                control flow on it works), the graph keeps an optional input for it.

        Raises:
            TraceError: the code uses a traced value for control flow or iterates it.
        """
        if isinstance(root, nn.Module):
            self.root = root
            fn = type(root).forward
            bound: tuple = (root,)
        elif callable(root):
            self.root = nn.Module()
            fn = root
            bound = ()
        else:
            raise TypeError(f"trace() takes an nn.Module or a function, got "
                            f"{type(root).__name__}")
        self.submodule_paths = None
        self.graph = Graph(tracer_cls=type(self))
        self._keep: list = []
        self._tensor_paths: dict = {}
        for name, t in list(self.root.named_buffers()) + list(self.root.named_parameters()):
            self._tensor_paths.setdefault(id(t), name)
        for prefix, m in self.root.named_modules():  # plain tensor attributes too
            for name, t in vars(m).items():
                if isinstance(t, Tensor):
                    self._tensor_paths.setdefault(id(t), f"{prefix}.{name}" if prefix else name)
        cache: dict = {}
        extra = [fn.__globals__] if hasattr(fn, "__globals__") else []
        for m in self.root.modules():
            g = getattr(type(m).forward, "__globals__", None)
            if g is not None and all(g is not e for e in extra):
                extra.append(g)
        patched = self._patch_leaves(extra)
        orig_call, orig_getattr = nn.Module.__call__, nn.Module.__getattr__
        tracer = self

        def module_call(mod: nn.Module, *a: Any, **k: Any) -> Any:
            return tracer.call_module(mod, lambda *a2, **k2: orig_call(mod, *a2, **k2), a, k)

        def module_getattr(mod: nn.Module, name: str) -> Any:
            return tracer.getattr(name, orig_getattr(mod, name), cache)

        recording = _dispatch.tracing()
        recording.__enter__()
        try:
            args = self._placeholders(fn, len(bound), concrete_args or {})
            nn.Module.__call__ = module_call
            nn.Module.__getattr__ = module_getattr
            result = fn(*bound, *args)
            ret = inspect.signature(fn).return_annotation
            self.create_node("output", "output", (self.create_arg(result),), {},
                             type_expr=None if ret is inspect.Signature.empty else ret)
        finally:
            nn.Module.__call__ = orig_call
            nn.Module.__getattr__ = orig_getattr
            for g, name, orig in reversed(patched):
                if orig is _MISSING:
                    g.pop(name, None)
                else:
                    g[name] = orig
            recording.__exit__()
        return self.graph

    def _placeholders(self, fn: Callable, skip: int, concrete_args: dict) -> list:
        params = list(inspect.signature(fn).parameters.values())[skip:]
        unknown = set(concrete_args) - {p.name for p in params}
        if unknown:
            raise TypeError(f"concrete_args names {sorted(unknown)}, which "
                            f"{getattr(fn, '__qualname__', fn)} does not take")
        args = []
        for p in params:
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.KEYWORD_ONLY):
                raise NotImplementedError(
                    f"fx tracing takes positional parameters only; {p.name!r} of "
                    f"{getattr(fn, '__qualname__', fn)} is {p.kind.description}")
            if p.name in concrete_args and concrete_args[p.name] is not PH:
                value = concrete_args[p.name]
                self.create_node("placeholder", p.name, (value,), {})
                args.append(value)
                continue
            ann = None if p.annotation is inspect.Parameter.empty else p.annotation
            default = () if p.default is inspect.Parameter.empty else (p.default,)
            args.append(self.create_proxy("placeholder", p.name, default, {}, type_expr=ann))
        return args

    def _patch_leaves(self, extra: list) -> list:
        """Swap wrapped and autowrapped functions for leaf recorders; returns what to undo."""
        patched = []
        for (_, name), g in list(_WRAP_SITES.items()):
            orig = g.get(name, getattr(builtins, name, None))
            if orig is not None and type(orig) is not _LeafCall:
                patched.append((g, name, g.get(name, _MISSING)))
                g[name] = _LeafCall(orig)
        for g in extra:
            for name, val in list(g.items()):
                if id(val) in self._autowrap_ids and type(val) is not _LeafCall:
                    WRAPPED[id(val)] = val  # printed with its wrap() line, as torch does
                    patched.append((g, name, val))
                    g[name] = _LeafCall(val)
        return patched


_MISSING = object()


def symbolic_trace(root: Union[nn.Module, Callable[..., Any]],
                   concrete_args: Optional[dict] = None) -> Any:
    """Trace ``root`` with the default :class:`Tracer` and wrap the result in a GraphModule.

    Example:
        >>> import mpitensor as torch
        >>> gm = symbolic_trace(lambda x: torch.relu(x) + 1)
        >>> [n.op for n in gm.graph.nodes]
        ['placeholder', 'call_function', 'call_function', 'output']
    """
    from .graph_module import GraphModule

    tracer = Tracer()
    graph = tracer.trace(root, concrete_args)
    name = type(root).__name__ if isinstance(root, nn.Module) else root.__name__
    return GraphModule(tracer.root, graph, name)
