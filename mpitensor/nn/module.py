"""``nn.Module``: the base class of every layer and model, with PyTorch's registration rules.

A Module keeps its learnable :class:`~mpitensor.nn.Parameter` objects, its buffers (tensors that
are state but not trained) and its sub-modules in three ordered dicts, ``_parameters``,
``_buffers`` and ``_modules``, filled by plain attribute assignment (``self.fc = Linear(4, 2)``).
Everything that walks a model (``parameters()``, ``state_dict()``, ``to()``, ``train()``) walks
those dicts in registration order, so names and orders match PyTorch's exactly and a
``state_dict`` saved by one loads into the other.

Example:
    >>> import mpitensor.nn as nn
    >>> class Net(nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.fc1 = nn.Linear(4, 3)
    ...         self.fc2 = nn.Linear(3, 2)
    ...     def forward(self, x):
    ...         return self.fc2(self.fc1(x))
    >>> list(Net().state_dict())
    ['fc1.weight', 'fc1.bias', 'fc2.weight', 'fc2.bias']
"""

from __future__ import annotations

import itertools
from collections import OrderedDict, namedtuple
from collections.abc import Iterator, Mapping
from typing import Any, Callable, Optional

import numpy as np

from mpitensor import backend as _backend
from mpitensor import dtypes as _dt
from mpitensor.autograd import no_grad
from mpitensor.tensor import Size, Tensor, _new, _parse_device

from .parameter import Parameter

__all__ = ["Module", "RemovableHandle"]


class _IncompatibleKeys(namedtuple("IncompatibleKeys", ["missing_keys", "unexpected_keys"])):
    """What :meth:`Module.load_state_dict` returns: the keys it did not match."""

    __slots__ = ()

    def __repr__(self) -> str:
        if not self.missing_keys and not self.unexpected_keys:
            return "<All keys matched successfully>"
        return super().__repr__()

    __str__ = __repr__


class RemovableHandle:
    """Returned by the ``register_*_hook`` methods; ``remove()`` unregisters the hook.

    Also a context manager: the hook is removed on leaving the ``with`` block.

    Example:
        >>> import mpitensor.nn as nn
        >>> m = nn.Identity()
        >>> h = m.register_forward_hook(lambda mod, args, out: None)
        >>> h.remove()
    """

    _ids = itertools.count()

    def __init__(self, *dicts: dict) -> None:
        self.id = next(RemovableHandle._ids)
        self._dicts = dicts

    def remove(self) -> None:
        """Unregister the hook (a no-op when it is already gone)."""
        for d in self._dicts:
            d.pop(self.id, None)

    def __enter__(self) -> RemovableHandle:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()


def _addindent(s: str, num_spaces: int) -> str:
    lines = s.split("\n")
    if len(lines) == 1:
        return s
    first = lines.pop(0)
    return first + "\n" + "\n".join(num_spaces * " " + line for line in lines)


def _typename(v: Any) -> str:
    t = type(v)
    return t.__name__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def _parse_to(args: tuple, kwargs: dict) -> tuple:
    """Read ``Module.to``'s arguments: (device or None, float dtype or None)."""
    device = kwargs.pop("device", None)
    dtype = kwargs.pop("dtype", None)
    tensor = kwargs.pop("tensor", None)
    kwargs.pop("non_blocking", None)
    kwargs.pop("memory_format", None)
    if kwargs:
        raise TypeError(f"to() got unexpected keyword arguments {sorted(kwargs)}")
    if len(args) > 3:
        raise TypeError(f"to() takes at most 3 positional arguments, got {len(args)}")
    for a in args:
        if isinstance(a, Tensor):
            tensor = a
        elif isinstance(a, bool):  # non_blocking given positionally
            continue
        elif isinstance(a, (_backend.device, int, np.integer)):
            device = a
        elif isinstance(a, str):
            try:
                device = _backend.device(a)
            except ValueError:
                dtype = a
        elif a is None:
            continue
        else:
            dtype = a
    if tensor is not None:
        device, dtype = tensor.device, tensor.dtype
    dev = _parse_device(device)
    if dtype is not None:
        try:
            dtype = _dt.to_dtype(dtype)
        except TypeError:
            raise TypeError(
                f"to() takes a device, a dtype or a tensor, got {dtype!r}; e.g. "
                f"model.to('cuda') or model.to(mpitensor.float64)"
            ) from None
        if dtype.kind not in "fc":
            raise TypeError(
                f"nn.Module.to only accepts floating point or complex dtypes, but got desired "
                f"dtype={_dt.dt_repr(dtype)}"
            )
    return dev, dtype


def _to_array(value: Any, key: str) -> Any:
    """An array (NumPy or CuPy) for a ``load_state_dict`` value, or a TypeError."""
    if isinstance(value, Tensor):
        return value._data
    if _backend.is_array(value):
        return value
    if hasattr(value, "__array__") or hasattr(value, "__array_interface__"):
        # torch.Tensor and other array-likes: a view when possible, no copy
        arr = value.detach().cpu().numpy() if hasattr(value, "detach") else np.asarray(value)
        return arr
    raise TypeError(
        f'While copying the parameter named "{key}", expected mpitensor.Tensor or Tensor-like '
        f"object from checkpoint but received {type(value)}"
    )


class Module:
    """Base class of all layers and models, with ``torch.nn.Module``'s interface.

    Subclasses call ``super().__init__()`` first, assign parameters, buffers and sub-modules as
    attributes, and define ``forward``; calling the module runs ``forward`` with its hooks.

    Attributes:
        training: True in training mode (see :meth:`train` / :meth:`eval`).

    Example:
        >>> import mpitensor as mt
        >>> import mpitensor.nn as nn
        >>> class Scale(nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.w = nn.Parameter(mt.ones(2))
        ...     def forward(self, x):
        ...         return x * self.w
        >>> [n for n, _ in Scale().named_parameters()]
        ['w']
    """

    training: bool
    _version: int = 1
    dump_patches: bool = False
    call_super_init: bool = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if args or kwargs:
            raise TypeError(
                f"{type(self).__name__}.__init__() got unexpected arguments: Module.__init__ "
                f"takes none; pass them to your subclass's own __init__ instead"
            )
        setattr_ = object.__setattr__
        setattr_(self, "training", True)
        setattr_(self, "_parameters", OrderedDict())
        setattr_(self, "_buffers", OrderedDict())
        setattr_(self, "_non_persistent_buffers_set", set())
        setattr_(self, "_modules", OrderedDict())
        setattr_(self, "_forward_pre_hooks", OrderedDict())
        setattr_(self, "_forward_pre_hooks_with_kwargs", OrderedDict())
        setattr_(self, "_forward_hooks", OrderedDict())
        setattr_(self, "_forward_hooks_with_kwargs", OrderedDict())
        setattr_(self, "_forward_hooks_always_called", OrderedDict())

    # ---- the forward call ------------------------------------------------------------------

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Compute the module's output; every subclass defines it."""
        raise NotImplementedError(
            f'Module [{type(self).__name__}] is missing the required "forward" function; '
            f"define forward(self, ...) in the subclass"
        )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not (self._forward_pre_hooks or self._forward_hooks):
            return self.forward(*args, **kwargs)
        return self._call_with_hooks(args, kwargs)

    def _call_with_hooks(self, args: tuple, kwargs: dict) -> Any:
        for hid, hook in list(self._forward_pre_hooks.items()):
            if hid in self._forward_pre_hooks_with_kwargs:
                r = hook(self, args, kwargs)
                if r is not None:
                    if not (isinstance(r, tuple) and len(r) == 2):
                        raise RuntimeError(
                            f"forward pre-hook must return None or a tuple of (new_args, "
                            f"new_kwargs), but got {r!r}"
                        )
                    args, kwargs = r
            else:
                r = hook(self, args)
                if r is not None:
                    args = r if isinstance(r, tuple) else (r,)
        try:
            result = self.forward(*args, **kwargs)
        except BaseException:
            for hid, hook in list(self._forward_hooks.items()):
                if hid in self._forward_hooks_always_called:
                    try:
                        if hid in self._forward_hooks_with_kwargs:
                            hook(self, args, kwargs, None)
                        else:
                            hook(self, args, None)
                    except Exception:  # noqa: BLE001, S110 - the original error matters more
                        pass
            raise
        for hid, hook in list(self._forward_hooks.items()):
            if hid in self._forward_hooks_with_kwargs:
                r = hook(self, args, kwargs, result)
            else:
                r = hook(self, args, result)
            if r is not None:
                result = r
        return result

    def register_forward_pre_hook(
        self, hook: Callable, *, prepend: bool = False, with_kwargs: bool = False
    ) -> RemovableHandle:
        """Run ``hook(module, args)`` before every ``forward``; a non-None result replaces args.

        Args:
            hook: the callable; with ``with_kwargs=True`` it is ``hook(module, args, kwargs)``
                and may return ``(new_args, new_kwargs)``.
            prepend: run it before the hooks already registered.
            with_kwargs: pass the keyword arguments too.

        Returns:
            A handle whose ``remove()`` unregisters the hook.

        Example:
            >>> import mpitensor.nn as nn
            >>> m = nn.Identity()
            >>> h = m.register_forward_pre_hook(lambda mod, args: (args[0] * 2,))
            >>> m(3)
            6
        """
        if not callable(hook):
            raise TypeError(f"hook must be callable, got {_typename(hook)}")
        handle = RemovableHandle(self._forward_pre_hooks, self._forward_pre_hooks_with_kwargs)
        self._forward_pre_hooks[handle.id] = hook
        if with_kwargs:
            self._forward_pre_hooks_with_kwargs[handle.id] = True
        if prepend:
            self._forward_pre_hooks.move_to_end(handle.id, last=False)
        return handle

    def register_forward_hook(
        self,
        hook: Callable,
        *,
        prepend: bool = False,
        with_kwargs: bool = False,
        always_call: bool = False,
    ) -> RemovableHandle:
        """Run ``hook(module, args, output)`` after every ``forward``; non-None replaces output.

        Args:
            hook: the callable; with ``with_kwargs=True`` it is
                ``hook(module, args, kwargs, output)``.
            prepend: run it before the hooks already registered.
            with_kwargs: pass the keyword arguments too.
            always_call: call it (with output None) even when forward raises.

        Returns:
            A handle whose ``remove()`` unregisters the hook.

        Example:
            >>> import mpitensor.nn as nn
            >>> m = nn.Identity()
            >>> h = m.register_forward_hook(lambda mod, args, out: out + 1)
            >>> m(1)
            2
        """
        if not callable(hook):
            raise TypeError(f"hook must be callable, got {_typename(hook)}")
        handle = RemovableHandle(
            self._forward_hooks, self._forward_hooks_with_kwargs,
            self._forward_hooks_always_called,
        )
        self._forward_hooks[handle.id] = hook
        if with_kwargs:
            self._forward_hooks_with_kwargs[handle.id] = True
        if always_call:
            self._forward_hooks_always_called[handle.id] = True
        if prepend:
            self._forward_hooks.move_to_end(handle.id, last=False)
        return handle

    # ---- registration ----------------------------------------------------------------------

    def _check_name(self, name: Any, what: str) -> None:
        if "_parameters" not in self.__dict__:
            raise AttributeError(f"cannot assign {what} before Module.__init__() call")
        if not isinstance(name, str):
            raise TypeError(f"{what} name should be a string. Got {_typename(name)}")
        if name == "":
            raise KeyError(f'{what} name can\'t be empty string ""')
        if "." in name:
            raise KeyError(f'{what} name can\'t contain ".", got: {name}')

    def register_parameter(self, name: str, param: Optional[Parameter]) -> None:
        """Add a parameter (or None, a declared-but-absent one) under ``name``.

        Raises:
            TypeError: ``param`` is not a Parameter or None.
            KeyError: a bad name or one already used by another attribute.

        Example:
            >>> import mpitensor as mt, mpitensor.nn as nn
            >>> m = nn.Module(); m.register_parameter("w", nn.Parameter(mt.zeros(2)))
            >>> list(m.state_dict())
            ['w']
        """
        self._check_name(name, "parameter")
        if hasattr(self, name) and name not in self._parameters:
            raise KeyError(f"attribute '{name}' already exists")
        if param is not None and not isinstance(param, Parameter):
            raise TypeError(
                f"cannot assign '{_typename(param)}' object to parameter '{name}' "
                f"(mpitensor.nn.Parameter or None required); wrap it: nn.Parameter(t)"
            )
        if param is not None and param.grad_fn is not None:
            raise ValueError(
                f"Cannot assign non-leaf Tensor to parameter '{name}'. Model parameters must be "
                f"created explicitly; wrap a detached tensor: nn.Parameter(t.detach())"
            )
        self._parameters[name] = param

    def register_buffer(self, name: str, tensor: Optional[Tensor], persistent: bool = True) -> None:
        """Add a buffer: module state that is not trained (e.g. running statistics).

        Args:
            name: the attribute name.
            tensor: a Tensor (or None).
            persistent: whether it is part of ``state_dict()``.

        Raises:
            TypeError: ``tensor`` is not a Tensor or None.
            KeyError: a bad name or one already used by another attribute.

        Example:
            >>> import mpitensor as mt, mpitensor.nn as nn
            >>> m = nn.Module(); m.register_buffer("steps", mt.zeros(1))
            >>> list(m.state_dict())
            ['steps']
        """
        self._check_name(name, "buffer")
        if hasattr(self, name) and name not in self._buffers:
            raise KeyError(f"attribute '{name}' already exists")
        if tensor is not None and not isinstance(tensor, Tensor):
            raise TypeError(
                f"cannot assign '{_typename(tensor)}' object to buffer '{name}' "
                f"(mpitensor Tensor or None required)"
            )
        self._buffers[name] = tensor
        if persistent:
            self._non_persistent_buffers_set.discard(name)
        else:
            self._non_persistent_buffers_set.add(name)

    def add_module(self, name: str, module: Optional[Module]) -> None:
        """Add a child module (or None) under ``name``.

        Raises:
            TypeError: ``module`` is not a Module or None.
            KeyError: a bad name or one already used by another attribute.

        Example:
            >>> import mpitensor.nn as nn
            >>> m = nn.Module(); m.add_module("fc", nn.Linear(2, 2))
            >>> [n for n, _ in m.named_children()]
            ['fc']
        """
        if module is not None and not isinstance(module, Module):
            raise TypeError(f"{_typename(module)} is not a Module subclass")
        self._check_name(name, "module")
        if hasattr(self, name) and name not in self._modules:
            raise KeyError(f"attribute '{name}' already exists")
        self._modules[name] = module

    def register_module(self, name: str, module: Optional[Module]) -> None:
        """Alias of :meth:`add_module`."""
        self.add_module(name, module)

    def __getattr__(self, name: str) -> Any:
        d = self.__dict__
        if "_parameters" in d:
            params = d["_parameters"]
            if name in params:
                return params[name]
            buffers = d["_buffers"]
            if name in buffers:
                return buffers[name]
            modules = d["_modules"]
            if name in modules:
                return modules[name]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def __setattr__(self, name: str, value: Any) -> None:
        d = self.__dict__
        params = d.get("_parameters")
        if isinstance(value, Parameter):
            if params is None:
                raise AttributeError("cannot assign parameters before Module.__init__() call")
            d.pop(name, None)
            self._buffers.pop(name, None)
            self._modules.pop(name, None)
            self._non_persistent_buffers_set.discard(name)
            self.register_parameter(name, value)
        elif params is not None and name in params:
            if value is not None:
                raise TypeError(
                    f"cannot assign '{_typename(value)}' as parameter '{name}' "
                    f"(mpitensor.nn.Parameter or None expected)"
                )
            self.register_parameter(name, value)
        elif isinstance(value, Module):
            if params is None:
                raise AttributeError("cannot assign module before Module.__init__() call")
            d.pop(name, None)
            params.pop(name, None)
            self._buffers.pop(name, None)
            self._non_persistent_buffers_set.discard(name)
            self._modules[name] = value
        elif params is not None and name in d["_modules"]:
            if value is not None:
                raise TypeError(
                    f"cannot assign '{_typename(value)}' as child module '{name}' "
                    f"(mpitensor.nn.Module or None expected)"
                )
            d["_modules"][name] = value
        elif params is not None and name in d["_buffers"]:
            if value is not None and not isinstance(value, Tensor):
                raise TypeError(
                    f"cannot assign '{_typename(value)}' as buffer '{name}' "
                    f"(mpitensor Tensor or None expected)"
                )
            d["_buffers"][name] = value
        else:
            object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        d = self.__dict__
        for key in ("_parameters", "_buffers", "_modules"):
            store = d.get(key)
            if store is not None and name in store:
                del store[name]
                if key == "_buffers":
                    self._non_persistent_buffers_set.discard(name)
                return
        object.__delattr__(self, name)

    def __dir__(self) -> list:
        keys = list(super().__dir__())
        keys += list(self._parameters) + list(self._buffers) + list(self._modules)
        return sorted(k for k in set(keys) if not k[:1].isdigit())

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        for key in ("_forward_pre_hooks_with_kwargs", "_forward_hooks_with_kwargs",
                    "_forward_hooks_always_called", "_forward_pre_hooks", "_forward_hooks"):
            if key not in self.__dict__:
                object.__setattr__(self, key, OrderedDict())
        if "_non_persistent_buffers_set" not in self.__dict__:
            object.__setattr__(self, "_non_persistent_buffers_set", set())

    # ---- lookups ---------------------------------------------------------------------------

    def get_submodule(self, target: str) -> Module:
        """Return the sub-module at dotted path ``target`` (``""`` is self).

        Raises:
            AttributeError: a path element is missing or is not a Module.

        Example:
            >>> import mpitensor.nn as nn
            >>> net = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
            >>> type(net.get_submodule("1")).__name__
            'ReLU'
        """
        if target == "":
            return self
        mod: Module = self
        for item in target.split("."):
            if not hasattr(mod, item):
                raise AttributeError(f"{mod._get_name()} has no attribute `{item}`")
            mod = getattr(mod, item)
            if not isinstance(mod, Module):
                raise AttributeError(f"`{item}` is not an nn.Module")
        return mod

    def _owner_of(self, target: str) -> tuple:
        """The submodule holding dotted path ``target`` and the attribute's name in it."""
        module_path, _, name = target.rpartition(".")
        mod = self.get_submodule(module_path)
        if not hasattr(mod, name):
            raise AttributeError(f"{mod._get_name()} has no attribute `{name}`")
        return mod, name

    def get_parameter(self, target: str) -> Parameter:
        """Return the parameter at dotted path ``target`` (``"fc1.weight"``).

        Raises:
            AttributeError: the path does not name a Parameter.
        """
        mod, name = self._owner_of(target)
        param = getattr(mod, name)
        if not isinstance(param, Parameter):
            raise AttributeError(f"`{name}` is not an nn.Parameter")
        return param

    def get_buffer(self, target: str) -> Tensor:
        """Return the buffer at dotted path ``target``.

        Raises:
            AttributeError: the path does not name a buffer.
        """
        mod, name = self._owner_of(target)
        if name not in mod._buffers:
            raise AttributeError(f"`{name}` is not a buffer")
        return mod._buffers[name]

    # ---- iteration -------------------------------------------------------------------------

    def named_modules(
        self, memo: Optional[set] = None, prefix: str = "", remove_duplicate: bool = True
    ) -> Iterator[tuple]:
        """Yield ``(name, module)`` for self and every descendant, depth first, each once.

        Example:
            >>> import mpitensor.nn as nn
            >>> [n for n, _ in nn.Sequential(nn.Linear(2, 2), nn.ReLU()).named_modules()]
            ['', '0', '1']
        """
        if memo is None:
            memo = set()
        if self in memo:
            return
        if remove_duplicate:
            memo.add(self)
        yield prefix, self
        for name, module in self._modules.items():
            if module is None:
                continue
            sub = prefix + ("." if prefix else "") + name
            yield from module.named_modules(memo, sub, remove_duplicate)

    def modules(self) -> Iterator[Module]:
        """Yield self and every descendant module, depth first, each once."""
        for _, m in self.named_modules():
            yield m

    def named_children(self) -> Iterator[tuple]:
        """Yield ``(name, module)`` for each direct child, each once."""
        memo = set()
        for name, module in self._modules.items():
            if module is not None and module not in memo:
                memo.add(module)
                yield name, module

    def children(self) -> Iterator[Module]:
        """Yield each direct child module once."""
        for _, m in self.named_children():
            yield m

    def _named_members(
        self, get: Callable, prefix: str, recurse: bool, remove_duplicate: bool
    ) -> Iterator[tuple]:
        memo = set()
        if recurse:
            mods = self.named_modules(prefix=prefix, remove_duplicate=remove_duplicate)
        else:
            mods = [(prefix, self)]
        for mod_prefix, mod in mods:
            for k, v in get(mod).items():
                if v is None or v in memo:
                    continue
                if remove_duplicate:
                    memo.add(v)
                yield mod_prefix + ("." if mod_prefix else "") + k, v

    def named_parameters(
        self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True
    ) -> Iterator[tuple]:
        """Yield ``(name, parameter)`` in registration order; a shared parameter once.

        Args:
            prefix: prepended to every name.
            recurse: include the parameters of sub-modules.
            remove_duplicate: yield a parameter shared by several modules only once.

        Example:
            >>> import mpitensor.nn as nn
            >>> [n for n, _ in nn.Sequential(nn.Linear(2, 2)).named_parameters()]
            ['0.weight', '0.bias']
        """
        return self._named_members(lambda m: m._parameters, prefix, recurse, remove_duplicate)

    def parameters(self, recurse: bool = True) -> Iterator[Parameter]:
        """Yield the parameters in registration order, each once (optimisers take this)."""
        for _, p in self.named_parameters(recurse=recurse):
            yield p

    def named_buffers(
        self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True
    ) -> Iterator[tuple]:
        """Yield ``(name, buffer)`` in registration order, each once."""
        return self._named_members(lambda m: m._buffers, prefix, recurse, remove_duplicate)

    def buffers(self, recurse: bool = True) -> Iterator[Tensor]:
        """Yield the buffers in registration order, each once."""
        for _, b in self.named_buffers(recurse=recurse):
            yield b

    # ---- modes and gradients ---------------------------------------------------------------

    def train(self, mode: bool = True) -> Module:
        """Set training mode (``mode=True``) or evaluation mode on self and all descendants.

        Raises:
            ValueError: ``mode`` is not a bool.

        Example:
            >>> import mpitensor.nn as nn
            >>> net = nn.Sequential(nn.Dropout()).train(False)
            >>> net[0].training
            False
        """
        if not isinstance(mode, bool):
            raise ValueError(f"training mode is expected to be boolean, got {mode!r}")
        self.training = mode
        for module in self.children():
            module.train(mode)
        return self

    def eval(self) -> Module:
        """Set evaluation mode (``train(False)``): dropout off. Returns self."""
        return self.train(False)

    def requires_grad_(self, requires_grad: bool = True) -> Module:
        """Set ``requires_grad`` on every parameter (to freeze or unfreeze). Returns self."""
        for p in self.parameters():
            p.requires_grad_(requires_grad)
        return self

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Reset the gradients of all parameters.

        Args:
            set_to_none: drop ``.grad`` (the default, as torch); False zeroes it in place.
        """
        for p in self.parameters():
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                g = p.grad
                g.grad_fn = None
                g._requires_grad = False
                g._data.fill(0)

    # ---- state_dict ------------------------------------------------------------------------

    def _save_to_state_dict(self, destination: dict, prefix: str, keep_vars: bool) -> None:
        for name, param in self._parameters.items():
            if param is not None:
                destination[prefix + name] = param if keep_vars else param.detach()
        for name, buf in self._buffers.items():
            if buf is not None and name not in self._non_persistent_buffers_set:
                destination[prefix + name] = buf if keep_vars else buf.detach()

    def state_dict(
        self, *args: Any, destination: Optional[dict] = None, prefix: str = "",
        keep_vars: bool = False,
    ) -> dict:
        """Return the parameters and persistent buffers by dotted name (``"conv1.weight"``).

        Values are detached tensors sharing storage with the module (the Parameters themselves
        with ``keep_vars=True``), in registration order.

        Args:
            destination: a mapping to fill (default: a new OrderedDict).
            prefix: prepended to every key.
            keep_vars: return the Parameters rather than detached tensors.

        Returns:
            The OrderedDict (or ``destination``).

        Example:
            >>> import mpitensor.nn as nn
            >>> list(nn.Linear(2, 3).state_dict())
            ['weight', 'bias']
        """
        if args:  # torch's deprecated positional form: state_dict(destination, prefix, keep_vars)
            if len(args) > 3:
                raise TypeError(f"state_dict() takes at most 3 positional arguments, got "
                                f"{len(args)}")
            destination = args[0]
            if len(args) > 1:
                prefix = args[1]
            if len(args) > 2:
                keep_vars = args[2]
        if destination is None:
            destination = OrderedDict()
        self._save_to_state_dict(destination, prefix, keep_vars)
        for name, module in self._modules.items():
            if module is not None:
                module.state_dict(destination=destination, prefix=prefix + name + ".",
                                  keep_vars=keep_vars)
        return destination

    def _check_state(
        self, state_dict: Mapping, prefix: str, missing: list, unexpected: list,
        errors: list, todo: list,
    ) -> None:
        """Match this module's own entries against ``state_dict`` (torch's rules)."""
        local = {}
        for k, v in self._parameters.items():
            if v is not None:
                local[k] = (v, True)
        for k, v in self._buffers.items():
            if v is not None and k not in self._non_persistent_buffers_set:
                local[k] = (v, False)
        for name, (target, is_param) in local.items():
            key = prefix + name
            if key not in state_dict:
                missing.append(key)
                continue
            try:
                arr = _to_array(state_dict[key], key)
            except TypeError as exc:
                errors.append(str(exc))
                continue
            shape = tuple(target._data.shape)
            if not shape and tuple(arr.shape) == (1,):  # torch's 0.3-era 1-element checkpoints
                arr = arr.reshape(())
            if tuple(arr.shape) != shape:
                errors.append(
                    f"size mismatch for {key}: copying a param with shape {Size(arr.shape)} "
                    f"from checkpoint, the shape in current model is {Size(shape)}."
                )
                continue
            todo.append((self, name, target, is_param, arr))
        for key in state_dict:
            if not key.startswith(prefix):
                continue
            parts = key[len(prefix):].split(".", 1)
            if len(parts) > 1:
                if parts[0] not in self._modules:
                    unexpected.append(key)
            elif parts[0] not in local:
                unexpected.append(key)

    def load_state_dict(
        self, state_dict: Mapping, strict: bool = True, assign: bool = False
    ) -> _IncompatibleKeys:
        """Copy parameters and buffers from ``state_dict`` into this module, in place.

        Values may be mpitensor Tensors, NumPy or CuPy arrays, or array-likes such as
        ``torch.Tensor``; they are cast to each parameter's dtype and moved to its device.

        Args:
            state_dict: a mapping from dotted names to values, as :meth:`state_dict` returns.
            strict: require the keys to match this module's exactly.
            assign: replace the parameters by new ones wrapping the given values (keeping their
                dtype and device) instead of copying into the existing storage.

        Returns:
            ``(missing_keys, unexpected_keys)``, a namedtuple.

        Raises:
            RuntimeError: shape mismatches, or with ``strict`` missing or unexpected keys
                (all of them listed, in PyTorch's words).
            TypeError: ``state_dict`` is not a mapping, or a value is not array-like.

        Example:
            >>> import mpitensor.nn as nn
            >>> a, b = nn.Linear(2, 2), nn.Linear(2, 2)
            >>> b.load_state_dict(a.state_dict())
            <All keys matched successfully>
        """
        if not isinstance(state_dict, Mapping):
            raise TypeError(
                f"Expected state_dict to be dict-like, got {_typename(state_dict)}."
            )
        missing: list = []
        unexpected: list = []
        errors: list = []
        todo: list = []

        def load(module: Module, local_sd: Mapping, prefix: str) -> None:
            module._check_state(local_sd, prefix, missing, unexpected, errors, todo)
            for name, child in module._modules.items():
                if child is not None:
                    cp = prefix + name + "."
                    load(child, {k: v for k, v in local_sd.items() if k.startswith(cp)}, cp)

        load(self, state_dict, "")
        if strict:
            if unexpected:
                errors.insert(0, "Unexpected key(s) in state_dict: {}. ".format(
                    ", ".join(f'"{k}"' for k in unexpected)))
            if missing:
                errors.insert(0, "Missing key(s) in state_dict: {}. ".format(
                    ", ".join(f'"{k}"' for k in missing)))
        if errors:
            raise RuntimeError("Error(s) in loading state_dict for {}:\n\t{}".format(
                type(self).__name__, "\n\t".join(errors)))
        with no_grad():
            for module, name, target, is_param, arr in todo:
                if assign:
                    new = _move_cast(arr, target._data)
                    if new is arr:
                        new = new.copy()
                    if is_param:
                        p = Parameter(_new(new), requires_grad=target.requires_grad)
                        module._parameters[name] = p
                    else:
                        module._buffers[name] = _new(new)
                else:
                    target.copy_(arr)
        return _IncompatibleKeys(missing, unexpected)

    # ---- devices and dtypes ----------------------------------------------------------------

    def _apply(self, fn: Callable[[Any], Any]) -> Module:
        """Replace the array of every parameter, gradient and buffer by ``fn(array)``.

        Parameters keep their identity (their ``.data`` is swapped), so optimisers built
        before the call still hold the same objects.
        """
        for module in self.modules():
            for p in module._parameters.values():
                if p is None:
                    continue
                new = fn(p._data)
                if new is not p._data:
                    p._data = new
                g = p.grad
                if g is not None:
                    gnew = fn(g._data)
                    if gnew is not g._data:
                        g._data = gnew
            for k, b in module._buffers.items():
                if b is None:
                    continue
                new = fn(b._data)
                if new is not b._data:
                    nb = _new(new)
                    nb._requires_grad = b._requires_grad
                    module._buffers[k] = nb
        return self

    def apply(self, fn: Callable[[Module], Any]) -> Module:
        """Call ``fn(m)`` on every sub-module (children first) and then on self; returns self.

        Example:
            >>> import mpitensor.nn as nn
            >>> seen = []
            >>> _ = nn.Sequential(nn.ReLU()).apply(lambda m: seen.append(type(m).__name__))
            >>> seen
            ['ReLU', 'Sequential']
        """
        for module in self.children():
            module.apply(fn)
        fn(self)
        return self

    def to(self, *args: Any, **kwargs: Any) -> Module:
        """Move and/or cast parameters and buffers in place; returns self.

        Accepts ``to(device)``, ``to(dtype)``, ``to(device, dtype)``, ``to(tensor)`` and the
        keywords ``device=``, ``dtype=``, ``non_blocking=``. A dtype applies to floating point
        parameters and buffers only (integer buffers keep theirs), as in torch.

        Raises:
            TypeError: a non-floating dtype or an argument of another kind.
            RuntimeError: a CUDA device is asked for and CuPy is missing.

        Example:
            >>> import mpitensor as mt, mpitensor.nn as nn
            >>> m = nn.Linear(2, 2); w = m.weight
            >>> m.to(mt.float64).weight is w, w.dtype
            (True, dtype('float64'))
        """
        dev, dtype = _parse_to(args, dict(kwargs))
        if dev is None and dtype is None:
            return self
        from mpitensor.tensor import _move  # noqa: PLC0415 - private helper

        def convert(x: Any) -> Any:
            if dev is not None:
                x = _move(x, dev)
            if dtype is not None and x.dtype.kind in "fc":
                target = dtype
                if dtype.kind == "f" and x.dtype.kind == "c":
                    target = x.dtype  # torch: real dtypes leave complex tensors alone
                if x.dtype != target:
                    x = x.astype(target)
            return x

        return self._apply(convert)

    def cuda(self, device: Any = None) -> Module:
        """Move all parameters and buffers to a GPU (the current one by default)."""
        dev = _backend.device("cuda") if device is None else _parse_device(device)
        if dev.type != "cuda":
            raise ValueError(f"cuda() needs a CUDA device, got {dev}")
        return self.to(dev)

    def cpu(self) -> Module:
        """Move all parameters and buffers to host memory."""
        return self.to(_backend.CPU)

    def _cast_float(self, dt: np.dtype) -> Module:
        def convert(x: Any) -> Any:
            return x.astype(dt) if x.dtype.kind == "f" and x.dtype != dt else x

        return self._apply(convert)

    def float(self) -> Module:
        """Cast floating point parameters and buffers to float32 in place."""
        return self._cast_float(_dt.float32)

    def double(self) -> Module:
        """Cast floating point parameters and buffers to float64 in place."""
        return self._cast_float(_dt.float64)

    def half(self) -> Module:
        """Cast floating point parameters and buffers to float16 in place."""
        return self._cast_float(_dt.float16)

    def type(self, dst_type: Any) -> Module:
        """Cast all parameters and buffers to ``dst_type`` in place."""
        dt = _dt.to_dtype(dst_type)
        return self._apply(lambda x: x if x.dtype == dt else x.astype(dt))

    # ---- printing --------------------------------------------------------------------------

    def _get_name(self) -> str:
        return type(self).__name__

    def extra_repr(self) -> str:
        """The module-specific part of the repr (one line, or several); override it."""
        return ""

    def __repr__(self) -> str:
        extra = self.extra_repr()
        extra_lines = extra.split("\n") if extra else []
        child_lines = [
            f"({key}): " + _addindent(repr(module), 2) for key, module in self._modules.items()
        ]
        lines = extra_lines + child_lines
        main = self._get_name() + "("
        if lines:
            if len(extra_lines) == 1 and not child_lines:
                main += extra_lines[0]
            else:
                main += "\n  " + "\n  ".join(lines) + "\n"
        return main + ")"


def _move_cast(arr: Any, like: Any) -> Any:
    """``arr`` on ``like``'s device and with its dtype."""
    from mpitensor.tensor import _move  # noqa: PLC0415 - private helper

    out = _move(arr, _backend.device_of(like))
    if out.dtype != like.dtype:
        out = out.astype(like.dtype)
    return out
