"""``torch.distributed.fsdp.wrap``: which submodules become FSDP units of their own.

A policy is a callable ``policy(module=, recurse=, nonwrapped_numel=) -> bool``, asked twice
per submodule, children before parents: with ``recurse=True`` (before looking inside it:
should its children be considered?) and, after its children were decided, with
``recurse=False`` and ``nonwrapped_numel`` = its parameters not already in a unit below it
(should it become a unit?). The root module given to ``FullyShardedDataParallel`` is a unit
anyway and is only asked about its children. A policy object (``ModuleWrapPolicy``,
``CustomPolicy``) may also answer with a dict of constructor arguments that override the
root's for that unit.

``enable_wrap``/``wrap`` are the manual way: inside ``with enable_wrap(wrapper_cls=FSDP,
**kwargs)``, ``wrap(module)`` returns ``FSDP(module, **kwargs)``; outside it returns the module
unchanged.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Set, Tuple, Union

from mpitensor.nn import Module, ModuleDict, ModuleList, MultiheadAttention

__all__ = ["CustomPolicy", "ModuleWrapPolicy", "always_wrap_policy", "enable_wrap",
           "lambda_auto_wrap_policy", "size_based_auto_wrap_policy",
           "transformer_auto_wrap_policy", "wrap"]


def always_wrap_policy(*args: Any, **kwargs: Any) -> bool:
    """Every submodule becomes a unit (and every one is looked inside)."""
    return True


def _as_classes(classes: Any, what: str) -> Tuple[type, ...]:
    out = (classes,) if isinstance(classes, type) else \
        tuple(classes) if isinstance(classes, (list, tuple, set, frozenset)) else None
    if out is None:
        raise TypeError(f"{what} must be a class or a set, list or tuple of classes, got "
                        f"{type(classes).__name__}")
    bad = [c for c in out if not isinstance(c, type)]
    if bad:
        raise TypeError(f"{what} must hold classes, got {bad!r}")
    return out


def lambda_auto_wrap_policy(module: Module, recurse: bool, nonwrapped_numel: int,
                            lambda_fn: Callable[[Module], bool]) -> bool:
    """Wrap the submodules for which ``lambda_fn(module)`` is true (bind ``lambda_fn`` with
    ``functools.partial``)."""
    return True if recurse else bool(lambda_fn(module))


def transformer_auto_wrap_policy(module: Module, recurse: bool, nonwrapped_numel: int,
                                 transformer_layer_cls: Any) -> bool:
    """Wrap the instances of ``transformer_layer_cls`` (a class or a set of classes; bind it
    with ``functools.partial``)."""
    return True if recurse else isinstance(module, _as_classes(transformer_layer_cls,
                                                               "transformer_layer_cls"))


def size_based_auto_wrap_policy(module: Module, recurse: bool, nonwrapped_numel: int,
                                min_num_params: int = int(1e8),
                                force_leaf_modules: Optional[Set[type]] = None,
                                exclude_wrap_modules: Optional[Set[type]] = None) -> bool:
    """Wrap a submodule once it holds at least ``min_num_params`` parameters that no unit
    below it took.

    Args:
        min_num_params: the threshold (bind it with ``functools.partial``).
        force_leaf_modules: classes never looked inside (default ``{MultiheadAttention}``).
        exclude_wrap_modules: classes never wrapped themselves (default ``{ModuleList,
            ModuleDict}``: containers without a forward of their own).

    Example:
        >>> policy = functools.partial(size_based_auto_wrap_policy, min_num_params=20000)
        >>> model = FSDP(model, auto_wrap_policy=policy)   # doctest: +SKIP
    """
    leaves = (MultiheadAttention,) if force_leaf_modules is None else tuple(force_leaf_modules)
    never = (ModuleList, ModuleDict) if exclude_wrap_modules is None \
        else tuple(exclude_wrap_modules)
    big = nonwrapped_numel >= min_num_params
    if recurse:
        return big and not isinstance(module, leaves)
    return big and not isinstance(module, never)


class _Policy:
    """A policy object: :meth:`decide` gives ``False`` (no unit) or the overrides of the
    root's constructor arguments for that unit (``{}``: none)."""

    def decide(self, module: Module) -> Union[bool, Dict[str, Any]]:
        raise NotImplementedError

    def __call__(self, module: Module, recurse: bool, nonwrapped_numel: int = 0) -> bool:
        """The callable form, for ``_or_policy`` and programs that call a policy directly."""
        return True if recurse else self.decide(module) is not False


class ModuleWrapPolicy(_Policy):
    """Wrap every instance of the given module classes.

    Example:
        >>> FSDP(model, auto_wrap_policy=ModuleWrapPolicy({nn.TransformerEncoderLayer}))
        ... # doctest: +SKIP
    """

    def __init__(self, module_classes: Iterable[type]) -> None:
        self._classes = _as_classes(module_classes, "ModuleWrapPolicy(module_classes)")

    def decide(self, module: Module) -> Union[bool, Dict[str, Any]]:
        return {} if isinstance(module, self._classes) else False

    def __repr__(self) -> str:
        return f"ModuleWrapPolicy({[c.__name__ for c in self._classes]})"


class CustomPolicy(_Policy):
    """Wrap where ``lambda_fn(module)`` says so: ``False`` or ``{}`` for no unit, ``True`` for a
    unit with the root's arguments, a non-empty dict for a unit with these arguments
    overriding the root's (``{"sharding_strategy": ShardingStrategy.NO_SHARD}``)."""

    def __init__(self, lambda_fn: Callable[[Module], Union[bool, Dict[str, Any]]]) -> None:
        if not callable(lambda_fn):
            raise TypeError(f"CustomPolicy takes a callable, got {type(lambda_fn).__name__}")
        self._fn = lambda_fn

    def decide(self, module: Module) -> Union[bool, Dict[str, Any]]:
        got = self._fn(module)
        if isinstance(got, dict):
            return dict(got) if got else False
        return {} if got else False


def _or_policy(module: Module, recurse: bool, nonwrapped_numel: int,
               policies: List[Callable]) -> bool:
    """True where any of ``policies`` is."""
    return any(p(module=module, recurse=recurse, nonwrapped_numel=nonwrapped_numel)
               for p in policies)


def check_policy(policy: Any) -> None:
    """``TypeError`` unless ``policy`` is None, a policy object or a callable."""
    if policy is not None and not callable(policy):
        raise TypeError(f"FullyShardedDataParallel: auto_wrap_policy must be callable "
                        f"(policy(module, recurse, nonwrapped_numel) -> bool) or a policy "
                        f"object such as ModuleWrapPolicy, got {type(policy).__name__}: "
                        f"{policy!r}")


def _ask(policy: Any, module: Module, recurse: bool, numel: int) -> Union[bool, Dict[str, Any]]:
    """``recurse``: whether to look inside ``module`` (a bool); else ``False`` or the overrides
    of a unit made of it."""
    if isinstance(policy, _Policy):
        return True if recurse else policy.decide(module)
    yes = policy(module=module, recurse=recurse, nonwrapped_numel=numel)
    return bool(yes) if recurse else ({} if yes else False)


def auto_wrap(root: Module, policy: Any, make_unit: Callable[[Module, Dict[str, Any]], Module],
              skip: Callable[[Module], bool], numel: Callable[[Module], int],
              extra: Callable[[Module], Union[bool, Dict[str, Any]]]) -> None:
    """Replace ``root``'s descendants that ``policy`` picks by ``make_unit(child, overrides)``,
    deepest first, in place.

    Args:
        skip: modules left alone, their subtree included (ignored modules, units already).
        numel: a module's parameters counted for the policy (ignored ones left out).
        extra: a second say, asked first (mixed precision's full-precision classes): ``False``
            or the overrides.
    """
    _wrap_children(root, (policy, make_unit, skip, numel, extra))


def _wrap_children(module: Module, how: Tuple[Any, ...]) -> int:
    """Wrap in ``module``'s children what the policy picks; returns how many of their
    parameters are in units now."""
    taken = 0
    for name, child in list(module.named_children()):
        if how[2](child):
            continue
        wrapped, n = _wrap_subtree(child, *how)
        if wrapped is not child:
            setattr(module, name, wrapped)
        taken += n
    return taken


def _wrap_subtree(module: Module, policy: Any, make_unit: Callable, skip: Callable,
                  numel: Callable, extra: Callable) -> Tuple[Module, int]:
    """``(module or its unit, how many of its parameters are in units now)``."""
    total = numel(module)
    taken = 0
    if _ask(policy, module, True, total):
        taken = _wrap_children(module, (policy, make_unit, skip, numel, extra))
    forced = extra(module)
    choice = forced if forced is not False else _ask(policy, module, False, total - taken)
    if choice is False:
        return module, taken
    return make_unit(module, choice), total


# ---- manual wrapping -----------------------------------------------------------------------

class _WrapContext:
    """The wrapper class and arguments of the innermost ``enable_wrap`` (a stack: nesting
    restores the outer one)."""

    stack: List[Tuple[Any, Dict[str, Any]]] = []


@contextlib.contextmanager
def enable_wrap(*, wrapper_cls: Any, **wrapper_kwargs: Any) -> Iterator[None]:
    """Within this block, :func:`wrap` wraps with ``wrapper_cls(module, **wrapper_kwargs)``.

    Example:
        >>> with enable_wrap(wrapper_cls=FSDP, sharding_strategy=ShardingStrategy.FULL_SHARD):
        ...     layer = wrap(nn.Linear(8, 8))       # doctest: +SKIP
    """
    if not callable(wrapper_cls):
        raise TypeError(f"enable_wrap: wrapper_cls must be a class, got {wrapper_cls!r}")
    _WrapContext.stack.append((wrapper_cls, dict(wrapper_kwargs)))
    try:
        yield
    finally:
        _WrapContext.stack.pop()


def wrap(module: Module, **wrap_overrides: Any) -> Module:
    """``wrapper_cls(module, **kwargs)`` inside :func:`enable_wrap` (``wrap_overrides`` take
    precedence over its arguments); ``module`` unchanged outside one."""
    if not _WrapContext.stack:
        return module
    cls, kwargs = _WrapContext.stack[-1]
    return cls(module, **{**kwargs, **wrap_overrides})
