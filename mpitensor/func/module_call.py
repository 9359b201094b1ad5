"""``torch.func.functional_call`` (run a module with given tensors in place of its parameters
and buffers) and ``stack_module_state`` (the states of several same-shaped modules, stacked).

``functional_call`` swaps the given tensors into the ``_parameters`` / ``_buffers`` tables of
the submodules that own the names, runs the module, and puts the originals back, also when
the call raises. The module object is reused, so hooks and submodules behave as in a plain call.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from mpitensor.nn.modules.module import Module
from mpitensor.tensor import Tensor, stack

__all__ = ["functional_call", "stack_module_state"]

_MISSING = object()


def _tables(module: Module) -> Dict[str, Tuple[Module, str, str]]:
    """Every parameter and buffer name, shared ones under each of their names:
    name -> (owning module, table, attribute name)."""
    found: Dict[str, Tuple[Module, str, str]] = {}
    stack_: List[Tuple[str, Module]] = [("", module)]
    seen_paths = set()
    while stack_:
        prefix, m = stack_.pop()
        if prefix in seen_paths:
            continue
        seen_paths.add(prefix)
        for table in ("_parameters", "_buffers"):
            for name, value in m.__dict__[table].items():
                if value is not None:
                    found[prefix + name] = (m, table, name)
        for name, child in m.__dict__["_modules"].items():
            if child is not None:
                stack_.append((f"{prefix}{name}.", child))
    return found


def _merge(dicts: Union[Dict[str, Any], Sequence[Dict[str, Any]]]) -> Dict[str, Any]:
    if isinstance(dicts, dict):
        return dict(dicts)
    merged: Dict[str, Any] = {}
    for d in dicts:
        twice = set(merged) & set(d)
        if twice:
            raise ValueError(f"functional_call: {sorted(twice)} appear in more than one of the "
                             f"given dicts; give each name once")
        merged.update(d)
    return merged


def _with_ties(values: Dict[str, Any], tables: dict) -> Dict[str, Any]:
    """Give every name tied to a given one (the same tensor in the module) the same value."""
    groups: Dict[int, List[str]] = {}
    for name, (m, table, attr) in tables.items():
        groups.setdefault(id(m.__dict__[table][attr]), []).append(name)
    out = dict(values)
    for names in groups.values():
        given = [n for n in names if n in values]
        if len(names) < 2 or not given:
            continue
        first = values[given[0]]
        if any(values[n] is not first for n in given[1:]):
            raise ValueError(f"functional_call: the tied names {sorted(given)} (one tensor in "
                             f"the module) were given different values; give one of them, or "
                             f"pass tie_weights=False")
        for n in names:
            out.setdefault(n, first)
    return out


def functional_call(module: Module, parameter_and_buffer_dicts: Any, args: Any = None,
                    kwargs: Optional[Dict[str, Any]] = None, *, tie_weights: bool = True,
                    strict: bool = False) -> Any:
    """Call ``module(*args, **kwargs)`` with the given tensors in place of its parameters and
    buffers (by their ``named_parameters`` / ``named_buffers`` names), then restore them.

    Args:
        module: the module.
        parameter_and_buffer_dicts: a dict name -> tensor, or a sequence of such dicts.
        args: the positional argument(s): a tuple, or one argument.
        kwargs: keyword arguments for the call.
        tie_weights: a tensor shared under several names (tied weights) is replaced under all
            of them when one is given.
        strict: every parameter and buffer must be given, and nothing else.

    Returns:
        What the module returns.

    Example:
        >>> import mpitensor as mt
        >>> lin = mt.nn.Linear(2, 1)
        >>> functional_call(lin, {"weight": mt.ones(1, 2), "bias": mt.zeros(1)}, (mt.ones(2),))
        tensor([2.])
    """
    values = _merge(parameter_and_buffer_dicts)
    tables = _tables(module)
    if tie_weights:
        values = _with_ties(values, tables)
    if strict:
        missing = sorted(set(tables) - set(values))
        unexpected = sorted(set(values) - set(tables))
        if missing or unexpected:
            raise RuntimeError(f"functional_call(strict=True): missing keys {missing}, "
                               f"unexpected keys {unexpected}")
    saved: List[Tuple[Any, str, str, Any]] = []
    try:
        for name, value in values.items():
            saved.append(_swap(module, tables, name, value))
        call_args = args if isinstance(args, tuple) else (() if args is None else (args,))
        return module(*call_args, **(kwargs or {}))
    finally:
        for owner, table, attr, old in reversed(saved):
            if table:
                owner.__dict__[table][attr] = old
            elif old is _MISSING:
                object.__delattr__(owner, attr)
            else:
                object.__setattr__(owner, attr, old)


def _swap(module: Module, tables: dict, name: str, value: Any) -> Tuple[Any, str, str, Any]:
    """Put ``value`` under ``name``; return what restores the old state."""
    if name in tables:
        owner, table, attr = tables[name]
        old = owner.__dict__[table][attr]
        owner.__dict__[table][attr] = value
        return owner, table, attr, old
    # A name that is no parameter or buffer: a plain attribute of its submodule, as torch
    *path, attr = name.split(".")
    owner = module
    for p in path:
        owner = getattr(owner, p)
    old = owner.__dict__.get(attr, _MISSING)
    object.__setattr__(owner, attr, value)
    return owner, "", attr, old


def stack_module_state(models: Sequence[Module]) -> Tuple[Dict[str, Tensor], Dict[str, Tensor]]:
    """The parameters and buffers of same-shaped ``models``, each stacked along a new first
    dimension: ``(params, buffers)``, ready for ``vmap(functional_call ...)`` over the models.
    The stacked parameters are new leaves (requiring grad where the originals did).

    Example:
        >>> import mpitensor as mt
        >>> params, buffers = stack_module_state([mt.nn.Linear(3, 2) for _ in range(4)])
        >>> tuple(params["weight"].shape)
        (4, 2, 3)
    """
    models = list(models)
    if not models:
        raise RuntimeError("stack_module_state: expected at least one model, got none")
    if len({m.training for m in models}) != 1:
        raise RuntimeError("stack_module_state: the models mix training and eval mode; put "
                           "them all in the same mode")
    if len({type(m) for m in models}) != 1:
        raise RuntimeError("stack_module_state: the models are of different classes; they "
                           "must share one structure")
    named = [dict(m.named_parameters()) for m in models]
    bufs = [dict(m.named_buffers()) for m in models]
    params = {k: stack([p[k].detach() for p in named]).requires_grad_(named[0][k].requires_grad)
              for k in named[0]}
    buffers = {k: stack([b[k] for b in bufs]) for k in bufs[0]}
    return params, buffers
