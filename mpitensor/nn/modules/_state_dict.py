"""``Module.load_state_dict``'s plan: every key is matched to its owner and checked (missing,
unexpected, shape) before anything is written, so a failed load leaves the model untouched;
:class:`_IncompatibleKeys` is the report torch returns."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

from mpitensor.autograd import no_grad
from mpitensor.tensor import Tensor

from ..parameter import Parameter
from ._common import _as_array, _on_device_of


class _IncompatibleKeys(NamedTuple):
    """What :meth:`Module.load_state_dict` returns: the keys it could not pair up."""

    missing_keys: list
    unexpected_keys: list

    def __repr__(self) -> str:
        if self.missing_keys or self.unexpected_keys:
            # the class name is part of what torch prints, so scripts see the same text
            return (f"_IncompatibleKeys(missing_keys={self.missing_keys!r}, "
                    f"unexpected_keys={self.unexpected_keys!r})")
        return "<All keys matched successfully>"

    __str__ = __repr__


class _LoadPlan:
    """The outcome of matching a state dict against a module tree, computed up front."""

    def __init__(self) -> None:
        self.missing: list = []
        self.unexpected: list = []
        self.errors: list = []
        self.copies: list = []  # (owner module, local name, current tensor, new array)

    @classmethod
    def build(cls, root: Any, state_dict: Mapping) -> _LoadPlan:
        plan = cls()
        arriving = _keys_by_owner(root, state_dict)
        for path, module in _walk_with_paths(root):
            lazy = getattr(module, "_lazy_load_hook", None)
            if lazy is not None:  # a lazy module takes its shapes from the state dict
                lazy(state_dict, path)
            own = dict(module._persistent_state())
            for name, current in own.items():
                plan._match(module, name, current, path + name, state_dict)
            if getattr(module, "_transparent_child", None) in module._modules:
                continue  # a wrapper: the keys at its path are its child's
            plan.unexpected += [key for key, rest in arriving.get(path, ()) if rest not in own]
        return plan

    def _match(self, module: Any, name: str, current: Tensor, key: str,
               state_dict: Mapping) -> None:
        if key not in state_dict:
            self.missing.append(key)
            return
        try:
            arr = _as_array(state_dict[key], key)
        except TypeError as exc:
            self.errors.append(str(exc))
            return
        want = tuple(current._data.shape)
        if want == () and tuple(arr.shape) == (1,):
            arr = arr.reshape(())  # checkpoints from torch 0.3 stored scalars as shape (1,)
        if tuple(arr.shape) != want:
            self.errors.append(f"{key}: shape {tuple(arr.shape)} in the state dict, "
                               f"{want} in the model")
            return
        self.copies.append((module, name, current, arr))

    def report(self, strict: bool) -> list:
        """The lines of the RuntimeError to raise (empty when loading may go ahead)."""
        lines = []
        if strict and self.missing:
            lines.append(f"missing from the state dict (the model has them): "
                         f"{_quoted(self.missing)}")
        if strict and self.unexpected:
            lines.append(f"not in the model (the state dict has them): "
                         f"{_quoted(self.unexpected)}")
        return lines + self.errors

    def apply(self, assign: bool) -> None:
        with no_grad():
            for module, name, current, arr in self.copies:
                if not assign:
                    current.copy_(arr)
                    continue
                fresh = _on_device_of(arr, current._data)
                if fresh is arr:
                    fresh = fresh.copy()  # never alias the caller's array
                if name in module._parameters:
                    module._parameters[name] = Parameter(fresh, current.requires_grad)
                else:
                    module._buffers[name] = Tensor._wrap(fresh)


def _quoted(keys: list) -> str:
    return ", ".join(f'"{k}"' for k in keys)


def _walk_with_paths(root: Any) -> Iterator[tuple]:
    """``(dotted prefix ending in '.', module)`` pre-order; a shared child under each name."""
    pending = [("", root)]
    while pending:
        path, module = pending.pop()
        yield path, module
        through = getattr(module, "_transparent_child", None)  # a wrapper's: no name of its own
        children = [(path if n == through else f"{path}{n}.", c)
                    for n, c in module._modules.items() if c is not None]
        pending.extend(reversed(children))


def _keys_by_owner(root: Any, state_dict: Mapping) -> dict:
    """Group the incoming keys by the deepest module their dotted path leads to.

    Returns ``{module prefix: [(key, rest of the key), ...]}``. Keys that run into a child
    slot holding None are dropped: they are neither loaded nor reported, as in torch.
    """
    owners: dict = {}
    for key in state_dict:
        module, path, rest = root, "", key
        while module is not None:
            through = getattr(module, "_transparent_child", None)
            if through in module._modules:  # a wrapper: its child's keys carry no name for it
                module = module._modules[through]
                continue
            if "." not in rest:
                break
            head, tail = rest.split(".", 1)
            if head not in module._modules:
                break
            module, path, rest = module._modules[head], f"{path}{head}.", tail
        if module is not None:
            owners.setdefault(path, []).append((key, rest))
    return owners
