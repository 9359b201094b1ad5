"""``nn.Module``: the base class of every layer and model, with PyTorch's registration rules.

Plain attribute assignment files a value by its type: a :class:`~mpitensor.nn.Parameter` into
``_parameters``, a Module into ``_modules``, and a Tensor assigned over a name already
registered with :meth:`Module.register_buffer` into ``_buffers``; anything else stays an
ordinary attribute. Each of the three tables keeps insertion order, and everything that walks
a model (``parameters()``, ``state_dict()``, ``to()``, ``train()``) reads them in that order,
so names and orders agree with PyTorch's and a ``state_dict`` saved by one loads into the other.

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

import warnings
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from typing import Any, Callable, Optional

import numpy as np

from mpitensor import backend as _backend
from mpitensor import dtypes as _dt
from mpitensor._core.devices import create as _create
from mpitensor._core.devices import device_or_dtype
from mpitensor.tensor import Tensor, _move, _parse_device

from ..parameter import Buffer, Parameter, _pending, is_lazy
from ._common import _qualified_type
from ._hooks import RemovableHandle, _HookChain
from ._state_dict import _IncompatibleKeys, _LoadPlan

__all__ = ["Module", "RemovableHandle"]


# --------------------------------------------------------------------------------------------
# Small helpers


def _indent_continuation(text: str, spaces: int) -> str:
    """Indent every line of ``text`` but the first, so it can follow a ``(name): `` label."""
    return text.replace("\n", "\n" + " " * spaces)


def _dotted(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


# --------------------------------------------------------------------------------------------
# Arguments of Module.to and values of load_state_dict


def _split_to_args(args: tuple, kwargs: dict) -> tuple:
    """Sort ``Module.to``'s arguments into (device or None, dtype or None) as given."""
    device = kwargs.pop("device", None)
    dtype = kwargs.pop("dtype", None)
    like = kwargs.pop("tensor", None)
    for ignored in ("non_blocking", "memory_format"):
        kwargs.pop(ignored, None)  # meaningful on torch's allocator only
    if kwargs:
        raise TypeError(f"to() got unexpected keyword arguments {sorted(kwargs)}; it takes "
                        f"device=, dtype=, tensor= and non_blocking=")
    if len(args) > 3:
        raise TypeError(f"to() takes at most 3 positional arguments (device, dtype, "
                        f"non_blocking), got {len(args)}")
    for a in args:
        if a is None or isinstance(a, bool):  # a bool here is non_blocking
            continue
        if isinstance(a, Tensor):
            like = a
            continue
        is_device, v = device_or_dtype(a)
        if is_device:
            device = v
        else:
            dtype = v
    if like is not None:
        device, dtype = like.device, like.dtype
    return _parse_device(device), _float_dtype_or_none(dtype)


def _float_dtype_or_none(dtype: Any) -> Any:
    if dtype is None:
        return None
    try:
        dt = _dt.to_dtype(dtype)
    except TypeError:
        raise TypeError(
            f"to() takes a device, a dtype or a tensor, got {dtype!r}; e.g. "
            f"model.to('cuda') or model.to(mpitensor.float64)"
        ) from None
    if _dt.kind_of(dt) not in "fc":
        raise TypeError(
            f"Module.to() casts to floating point or complex dtypes only, got "
            f"{_dt.dt_repr(dt)}; integer buffers keep their own dtype whatever is asked"
        )
    return dt


# --------------------------------------------------------------------------------------------
# Module


def _fresh_module_state() -> dict:
    """The instance attributes ``Module.__init__`` creates (``__setstate__`` fills gaps)."""
    return {
        "training": True,
        "_parameters": OrderedDict(),
        "_buffers": OrderedDict(),
        "_modules": OrderedDict(),
        "_transient_buffers": set(),  # names of buffers registered with persistent=False
        "_forward_pre_hooks": _HookChain(),
        "_forward_hooks": _HookChain(),
    }


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

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if args or kwargs:
            raise TypeError(
                f"{type(self).__name__}.__init__() got unexpected arguments: Module.__init__ "
                f"takes none; pass them to your subclass's own __init__ instead"
            )
        self.__dict__.update(_fresh_module_state())

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        for name, default in _fresh_module_state().items():
            self.__dict__.setdefault(name, default)

    # ---- the forward call ------------------------------------------------------------------

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Compute the module's output; every subclass defines it."""
        raise NotImplementedError(
            f"Module [{type(self).__name__}] is missing forward(); define "
            f"forward(self, ...) in the subclass to say what calling it computes"
        )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._forward_pre_hooks or self._forward_hooks:
            return self._hooked_call(args, kwargs)
        return self.forward(*args, **kwargs)

    def _hooked_call(self, args: tuple, kwargs: dict) -> Any:
        ran_always: set = set()
        output = None
        try:
            for hook in self._forward_pre_hooks.snapshot():
                args, kwargs = hook.before(self, args, kwargs)
            output = self.forward(*args, **kwargs)
            for hook in self._forward_hooks.snapshot():
                if hook.always_call:
                    ran_always.add(hook.key)
                output = hook.after(self, args, kwargs, output)
            return output
        except Exception:
            self._run_always_call_hooks(args, kwargs, output, ran_always)
            raise

    def _run_always_call_hooks(self, args: tuple, kwargs: dict, output: Any,
                               ran: set) -> None:
        """Give ``always_call`` hooks their turn after a failure, without masking it."""
        for hook in self._forward_hooks.snapshot():
            if not hook.always_call or hook.key in ran:
                continue
            try:
                output = hook.after(self, args, kwargs, output)
            except Exception as exc:  # noqa: BLE001 - the failure being raised matters more
                warnings.warn(
                    f"{type(self).__name__}: an always_call forward hook failed with "
                    f"{exc!r} while handling an earlier error; that earlier error is raised",
                    RuntimeWarning, stacklevel=3,
                )

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
        return self._forward_pre_hooks.add(hook, prepend, with_kwargs)

    def register_forward_hook(self, hook: Callable, *, prepend: bool = False,
                              with_kwargs: bool = False,
                              always_call: bool = False) -> RemovableHandle:
        """Run ``hook(module, args, output)`` after every ``forward``; non-None replaces output.

        Args:
            hook: the callable; with ``with_kwargs=True`` it is
                ``hook(module, args, kwargs, output)``.
            prepend: run it before the hooks already registered.
            with_kwargs: pass the keyword arguments too.
            always_call: also call it when ``forward`` or another hook raises (with the output
                so far, None if ``forward`` did not return); the error is then re-raised.

        Returns:
            A handle whose ``remove()`` unregisters the hook.

        Example:
            >>> import mpitensor.nn as nn
            >>> m = nn.Identity()
            >>> h = m.register_forward_hook(lambda mod, args, out: out + 1)
            >>> m(1)
            2
        """
        return self._forward_hooks.add(hook, prepend, with_kwargs, always_call)

    # ---- registration ----------------------------------------------------------------------

    def _claim_name(self, name: Any, kind: str, table: dict) -> None:
        """Check that ``name`` may be (re)used for a ``kind`` kept in ``table``, or raise."""
        if "_parameters" not in self.__dict__:
            raise AttributeError(
                f"cannot register {kind} {name!r} before Module.__init__() has run; call "
                f"super().__init__() at the top of {type(self).__name__}.__init__"
            )
        if not isinstance(name, str):
            raise TypeError(f"a {kind} name must be a str, got {_qualified_type(name)} {name!r}")
        if not name:
            raise KeyError(f"a {kind} name can't be the empty string")
        if "." in name:
            raise KeyError(f'{kind} names can\'t contain ".", got: {name} (dots are reserved '
                           f"for paths such as 'fc1.weight'; use '_' instead)")
        if name not in table and hasattr(self, name):
            raise KeyError(f"attribute '{name}' already exists on {type(self).__name__}; "
                           f"delete it first or choose another {kind} name")

    def register_parameter(self, name: str, param: Optional[Parameter]) -> None:
        """Add a parameter (or None, a declared-but-absent one) under ``name``.

        Raises:
            TypeError: ``param`` is not a Parameter or None.
            KeyError: a bad name or one already used by another attribute.
            ValueError: ``param`` was produced by a recorded operation (not a leaf).

        Example:
            >>> import mpitensor as mt, mpitensor.nn as nn
            >>> m = nn.Module(); m.register_parameter("w", nn.Parameter(mt.zeros(2)))
            >>> list(m.state_dict())
            ['w']
        """
        self._claim_name(name, "parameter", self._parameters)
        if param is not None:
            if not isinstance(param, Parameter):
                raise TypeError(
                    f"parameter '{name}' got a {_qualified_type(param)}, but an "
                    f"mpitensor.nn.Parameter or None required; wrap it: nn.Parameter(t)"
                )
            if param.grad_fn is not None:
                raise ValueError(
                    f"parameter '{name}' would be a non-leaf tensor (it has a grad_fn), so "
                    f"gradients would never reach it; register nn.Parameter(t.detach())"
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
        self._claim_name(name, "buffer", self._buffers)
        if tensor is not None and not isinstance(tensor, Tensor):
            raise TypeError(
                f"buffer '{name}' got a {_qualified_type(tensor)}, but an mpitensor Tensor or "
                f"None required; convert it with mpitensor.as_tensor(...)"
            )
        self._transient_buffers.discard(name)
        if not persistent:
            self._transient_buffers.add(name)
        self._buffers[name] = tensor

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
            raise TypeError(f"add_module('{name}', ...) got {_qualified_type(module)}, which "
                            f"is not a Module subclass (nor None)")
        self._claim_name(name, "module", self._modules)
        self._modules[name] = module

    def register_module(self, name: str, module: Optional[Module]) -> None:
        """Alias of :meth:`add_module`."""
        self.add_module(name, module)

    def __getattr__(self, name: str) -> Any:
        # Only reached when normal lookup fails, i.e. for registered members.
        tables = self.__dict__
        if "_parameters" in tables:
            for table in (tables["_parameters"], tables["_buffers"], tables["_modules"]):
                if name in table:
                    return table[name]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def _unregister(self, name: str, keep: Optional[dict] = None) -> None:
        """Forget ``name`` in every table but ``keep``.

        The table about to receive the new value keeps its entry, so that replacing a
        parameter (or child) leaves it at its place in the iteration order.
        """
        self.__dict__.pop(name, None)
        for table in (self._parameters, self._buffers, self._modules):
            if table is not keep:
                table.pop(name, None)
        self._transient_buffers.discard(name)

    def __setattr__(self, name: str, value: Any) -> None:
        d = self.__dict__
        ready = "_parameters" in d
        if isinstance(value, Buffer) and ready:
            self._unregister(name, keep=self._buffers)
            self.register_buffer(name, value, persistent=value.persistent)
        elif isinstance(value, (Parameter, Module)):
            if not ready:
                raise AttributeError(
                    f"cannot assign {type(value).__name__} '{name}' before Module.__init__() "
                    f"has run; call super().__init__() first in {type(self).__name__}.__init__"
                )
            if name in d["_parameters"] and not isinstance(value, Parameter):
                self._reject(name, value, "parameter", "mpitensor.nn.Parameter or None")
            if isinstance(value, Parameter):
                self._unregister(name, keep=self._parameters)
                self.register_parameter(name, value)
            else:
                self._unregister(name, keep=self._modules)
                self._modules[name] = value
        elif ready and name in d["_parameters"]:
            if value is not None:
                self._reject(name, value, "parameter", "mpitensor.nn.Parameter or None")
            self._parameters[name] = None
        elif ready and name in d["_modules"]:
            if value is not None:
                self._reject(name, value, "child module", "mpitensor.nn.Module or None")
            self._modules[name] = None
        elif ready and name in d["_buffers"]:
            if value is not None and not isinstance(value, Tensor):
                self._reject(name, value, "buffer", "mpitensor Tensor or None")
            self._buffers[name] = value
        else:
            object.__setattr__(self, name, value)

    @staticmethod
    def _reject(name: str, value: Any, kind: str, allowed: str) -> None:
        raise TypeError(
            f"cannot assign '{_qualified_type(value)}' as {kind} '{name}' ({allowed} "
            f"expected); delete the attribute first to store something else under that name"
        )

    def __delattr__(self, name: str) -> None:
        d = self.__dict__
        if "_parameters" in d and any(
            name in d[t] for t in ("_parameters", "_buffers", "_modules")
        ):
            self._unregister(name)
        else:
            object.__delattr__(self, name)

    def __dir__(self) -> list:
        names = set(super().__dir__()).union(self._parameters, self._buffers, self._modules)
        # numbered children ("0", "1" of a Sequential) are not identifiers
        return sorted(n for n in names if not n[:1].isdigit())

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
        module: Module = self
        walked = ""
        for part in target.split(".") if target else ():
            found = getattr(module, part, _ABSENT)
            if found is _ABSENT:
                raise AttributeError(f"{module._get_name()} (at '{walked}' in '{target}') has "
                                     f"no attribute `{part}`")
            if not isinstance(found, Module):
                raise AttributeError(f"`{part}` (in '{target}') is not an nn.Module but a "
                                     f"{_qualified_type(found)}")
            module, walked = found, _dotted(walked, part)
        return module

    def _member(self, target: str) -> tuple:
        """``(owning module, attribute name, value)`` for a dotted path to an attribute."""
        owner_path, _, name = target.rpartition(".")
        owner = self.get_submodule(owner_path)
        value = getattr(owner, name, _ABSENT)
        if value is _ABSENT:
            raise AttributeError(f"{owner._get_name()} has no attribute `{name}` (looking up "
                                 f"'{target}')")
        return owner, name, value

    def get_parameter(self, target: str) -> Parameter:
        """Return the parameter at dotted path ``target`` (``"fc1.weight"``).

        Raises:
            AttributeError: the path does not name a Parameter.
        """
        _, name, value = self._member(target)
        if not isinstance(value, Parameter):
            raise AttributeError(f"`{name}` (in '{target}') is not an nn.Parameter but a "
                                 f"{_qualified_type(value)}")
        return value

    def get_buffer(self, target: str) -> Tensor:
        """Return the buffer at dotted path ``target``.

        Raises:
            AttributeError: the path does not name a buffer.
        """
        owner, name, _ = self._member(target)
        if name not in owner._buffers:
            raise AttributeError(f"`{name}` (in '{target}') is not a buffer of "
                                 f"{owner._get_name()}; see named_buffers() for those it has")
        return owner._buffers[name]

    # ---- iteration -------------------------------------------------------------------------

    def named_modules(
        self, memo: Optional[set] = None, prefix: str = "", remove_duplicate: bool = True
    ) -> Iterator[tuple]:
        """Yield ``(name, module)`` for self and every descendant, depth first, each once.

        Args:
            memo: modules to leave out (and, with ``remove_duplicate``, to add those seen to).
            prefix: prepended to every name.
            remove_duplicate: yield a module reachable under several names only once.

        Example:
            >>> import mpitensor.nn as nn
            >>> [n for n, _ in nn.Sequential(nn.Linear(2, 2), nn.ReLU()).named_modules()]
            ['', '0', '1']
        """
        seen = set() if memo is None else memo
        pending = [(prefix, self)]
        while pending:
            path, module = pending.pop()
            if module in seen:
                continue
            if remove_duplicate:
                seen.add(module)
            yield path, module
            kids = [(_dotted(path, n), c) for n, c in module._modules.items() if c is not None]
            pending.extend(reversed(kids))

    def modules(self) -> Iterator[Module]:
        """Yield self and every descendant module, depth first, each once."""
        return (m for _, m in self.named_modules())

    def named_children(self) -> Iterator[tuple]:
        """Yield ``(name, module)`` for each direct child, each once."""
        seen: set = set()
        for name, child in self._modules.items():
            if child is None or id(child) in seen:
                continue
            seen.add(id(child))
            yield name, child

    def children(self) -> Iterator[Module]:
        """Yield each direct child module once."""
        return (m for _, m in self.named_children())

    def _named_tensors(
        self, table: str, prefix: str, recurse: bool, remove_duplicate: bool
    ) -> Iterator[tuple]:
        """Walk the ``table`` ("_parameters" or "_buffers") of self and, maybe, descendants."""
        owners = (self.named_modules(prefix=prefix, remove_duplicate=remove_duplicate)
                  if recurse else [(prefix, self)])
        seen: set = set()
        for path, owner in owners:
            for name, tensor in getattr(owner, table).items():
                if tensor is None or id(tensor) in seen:
                    continue
                if remove_duplicate:
                    seen.add(id(tensor))
                yield _dotted(path, name), tensor

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
        return self._named_tensors("_parameters", prefix, recurse, remove_duplicate)

    def parameters(self, recurse: bool = True) -> Iterator[Parameter]:
        """Yield the parameters in registration order, each once (optimisers take this)."""
        return (p for _, p in self.named_parameters(recurse=recurse))

    def named_buffers(
        self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True
    ) -> Iterator[tuple]:
        """Yield ``(name, buffer)`` in registration order, each once (same arguments)."""
        return self._named_tensors("_buffers", prefix, recurse, remove_duplicate)

    def buffers(self, recurse: bool = True) -> Iterator[Tensor]:
        """Yield the buffers in registration order, each once."""
        return (b for _, b in self.named_buffers(recurse=recurse))

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
            raise ValueError(f"train(mode) needs a boolean (True or False), got {mode!r}")
        self.training = mode
        for child in self.children():
            child.train(mode)  # through the method, so that subclasses' overrides take part
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
            grad = p.grad
            if grad is None:
                continue
            if set_to_none:
                p.grad = None
                continue
            # zeroed in place so that views handed out earlier (e.g. DDP buckets) stay valid
            grad.grad_fn = None
            grad._requires_grad = False
            grad._data.fill(0)

    # ---- state_dict ------------------------------------------------------------------------

    def _persistent_state(self) -> Iterator[tuple]:
        """``(name, tensor)`` of this module's own saved entries: parameters, then buffers."""
        for name, param in self._parameters.items():
            if param is not None:
                yield name, param
        for name, buf in self._buffers.items():
            if buf is not None and name not in self._transient_buffers:
                yield name, buf

    def state_dict(
        self, *, destination: Optional[dict] = None, prefix: str = "", keep_vars: bool = False
    ) -> dict:
        """Return the parameters and persistent buffers by dotted name (``"conv1.weight"``).

        Values are detached tensors sharing storage with the module (the Parameters themselves
        with ``keep_vars=True``), in registration order; a sub-module registered under two
        names appears under both.

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
        out = OrderedDict() if destination is None else destination
        for name, tensor in self._persistent_state():
            out[prefix + name] = tensor if keep_vars else tensor.detach()
        through = getattr(self, "_transparent_child", None)  # a wrapper's: no name of its own
        for name, child in self._modules.items():
            if child is not None:  # children may override state_dict, so ask each one
                child.state_dict(destination=out, prefix=prefix if name == through else
                                 f"{prefix}{name}.", keep_vars=keep_vars)
        return out

    def load_state_dict(
        self, state_dict: Mapping, strict: bool = True, assign: bool = False
    ) -> _IncompatibleKeys:
        """Copy parameters and buffers from ``state_dict`` into this module, in place.

        Values may be mpitensor Tensors, NumPy or CuPy arrays, or array-likes such as
        ``torch.Tensor``; they are cast to each parameter's dtype and moved to its device.
        Every key is checked before anything is written, so a failed load changes nothing.

        Args:
            state_dict: a mapping from dotted names to values, as :meth:`state_dict` returns.
            strict: require the keys to match this module's exactly.
            assign: replace the parameters by new ones wrapping the given values (keeping their
                dtype and device) instead of copying into the existing storage.

        Returns:
            ``(missing_keys, unexpected_keys)``, a namedtuple.

        Raises:
            RuntimeError: shape mismatches, or with ``strict`` missing or unexpected keys
                (all of them listed, in the same text as PyTorch's).
            TypeError: ``state_dict`` is not a mapping.

        Example:
            >>> import mpitensor.nn as nn
            >>> a, b = nn.Linear(2, 2), nn.Linear(2, 2)
            >>> b.load_state_dict(a.state_dict())
            <All keys matched successfully>
        """
        if not isinstance(state_dict, Mapping):
            raise TypeError(
                f"load_state_dict() needs a dict-like mapping from names to tensors, got "
                f"{_qualified_type(state_dict)}; pass what state_dict() returned"
            )
        plan = _LoadPlan.build(self, state_dict)
        lines = plan.report(strict)
        if lines:
            raise RuntimeError(
                f"load_state_dict into {type(self).__name__} refused, nothing was loaded:"
                + "".join(f"\n  {line}" for line in lines)
                + "\nstrict=False loads the matching keys and returns the missing and "
                "unexpected ones; a wrong shape or type is an error either way")
        plan.apply(assign)
        return _IncompatibleKeys(plan.missing, plan.unexpected)

    # ---- devices and dtypes ----------------------------------------------------------------

    def _convert_arrays(self, fn: Callable[[Any], Any]) -> Module:
        """Replace the array of every parameter, gradient and buffer by ``fn(array)``.

        Parameters and gradients keep their identity (only their array is swapped), so
        optimisers and hooks that already hold them see the converted values.
        """
        def pending(old: Any) -> Any:  # an uninitialized tensor keeps only dtype and device
            moved = fn(np.empty(0, dtype=old.dtype))
            new = _pending(moved.dtype)
            new.device_wanted = _backend.device_of(moved)
            return new

        for module in self.modules():
            for holder in module._parameters.values():
                for t in (holder, None if holder is None else holder.grad):
                    if t is not None:
                        t._data = pending(t._data) if is_lazy(t) else fn(t._data)
            for name, buf in module._buffers.items():
                if buf is None:
                    continue
                if is_lazy(buf):
                    buf._data = pending(buf._data)
                    continue
                converted = fn(buf._data)
                if converted is not buf._data:
                    replacement = Tensor._wrap(converted)
                    replacement._requires_grad = buf._requires_grad
                    module._buffers[name] = replacement
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
        for child in self.children():
            child.apply(fn)
        fn(self)
        return self

    def to(self, *args: Any, **kwargs: Any) -> Module:
        """Move and/or cast parameters and buffers in place; returns self.

        Accepts ``to(device)``, ``to(dtype)``, ``to(device, dtype)``, ``to(tensor)`` and the
        keywords ``device=``, ``dtype=``, ``non_blocking=``. A dtype applies to floating point
        and complex parameters and buffers only (integer buffers keep theirs), and a real
        dtype leaves complex ones complex, as in torch.

        Raises:
            TypeError: a non-floating dtype or an argument of another kind.
            RuntimeError: a CUDA device is asked for and CuPy is missing.

        Example:
            >>> import mpitensor as mt, mpitensor.nn as nn
            >>> m = nn.Linear(2, 2); w = m.weight
            >>> m.to(mt.float64).weight is w, w.dtype
            (True, dtype('float64'))
        """
        dev, dtype = _split_to_args(args, dict(kwargs))
        if dev is None and dtype is None:
            return self

        def convert(x: Any) -> Any:
            x = _move(x, dev)
            if dtype is None or _dt.kind_of(x.dtype) not in "fc":
                return x
            if x.dtype.kind == "c" and _dt.kind_of(dtype) == "f":
                return x
            return x if x.dtype == dtype else x.astype(dtype)

        return self._convert_arrays(convert)

    def to_empty(self, *, device: Any, recurse: bool = True) -> Module:
        """Give the parameters and buffers new, uninitialized memory on ``device`` (same
        shapes and dtypes); returns self. The way out of the meta device: build the model
        under ``with mpitensor.device("meta"):``, then ``to_empty(device="cpu")`` and
        initialize it (``reset_parameters()``, a state dict).

        A tensor already on ``device`` keeps its memory and values (uninitialized memory may
        hold anything), and so does a DTensor parameter (``fully_shard`` gave its shard
        memory of its own, on the parameter's device).

        Example:
            >>> import mpitensor as mt, mpitensor.nn as nn
            >>> with mt.device("meta"):
            ...     m = nn.Linear(2, 3)
            >>> m.to_empty(device="cpu").weight.device
            device(type='cpu')
        """
        dev = _parse_device(device)
        for module in (self.modules() if recurse else (self,)):
            for t in (*module._parameters.values(), *module._buffers.values()):
                if t is None or getattr(t, "placements", None) is not None or is_lazy(t):
                    continue
                x = t._data
                if not _backend.is_meta_array(x) and _backend.device_of(x) == dev:
                    continue
                t._data = _create(dev, "empty", x.shape, dtype=x.dtype)
                t.grad = None
        return self

    def cuda(self, device: Any = None) -> Module:
        """Move all parameters and buffers to a GPU (the current one by default)."""
        dev = _backend.device("cuda") if device is None else _parse_device(device)
        if dev.type != "cuda":
            raise ValueError(f"cuda() needs a CUDA device, got {dev}; use to({str(dev)!r}) "
                             f"for other devices")
        return self.to(dev)

    def cpu(self) -> Module:
        """Move all parameters and buffers to host memory."""
        return self.to(_backend.CPU)

    def share_memory(self) -> Module:
        """Move every parameter, buffer and existing gradient into memory shared between
        processes (``Tensor.share_memory_``), in place; return self. Call it before building
        the optimizer and before the processes start, as Hogwild! programs do."""
        seen = set()
        for t in (*self.parameters(), *self.buffers()):
            for u in (t, t.grad):
                if u is not None and id(u) not in seen:
                    seen.add(id(u))
                    u.share_memory_()
        return self

    def _recast(self, dt: np.dtype, only_floating: bool = True) -> Module:
        def convert(x: Any) -> Any:
            if x.dtype == dt or (only_floating and not _dt.is_floating_dtype(x.dtype)):
                return x
            return x.astype(dt)

        return self._convert_arrays(convert)

    def float(self) -> Module:
        """Cast floating point parameters and buffers to float32 in place."""
        return self._recast(_dt.float32)

    def double(self) -> Module:
        """Cast floating point parameters and buffers to float64 in place."""
        return self._recast(_dt.float64)

    def half(self) -> Module:
        """Cast floating point parameters and buffers to float16 in place."""
        return self._recast(_dt.float16)

    def bfloat16(self) -> Module:
        """Cast floating point parameters and buffers to bfloat16 in place."""
        return self._recast(_dt.bfloat16)

    def type(self, dst_type: Any) -> Module:
        """Cast all parameters and buffers to ``dst_type`` in place."""
        return self._recast(_dt.to_dtype(dst_type), only_floating=False)

    # ---- printing --------------------------------------------------------------------------

    def _get_name(self) -> str:
        return type(self).__name__

    def extra_repr(self) -> str:
        """The module-specific part of the repr (one line, or several); override it."""
        return ""

    def __repr__(self) -> str:
        extra = self.extra_repr()
        own = extra.split("\n") if extra else []
        kids = [f"({name}): {_indent_continuation(repr(child), 2)}"
                for name, child in self._modules.items()]
        if not kids and len(own) <= 1:
            return f"{self._get_name()}({''.join(own)})"
        body = "".join(f"\n  {line}" for line in own + kids)
        return f"{self._get_name()}({body}\n)"


_ABSENT = object()  # getattr default that no attribute value can equal
