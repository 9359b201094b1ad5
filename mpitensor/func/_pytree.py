"""Nested containers of tensors (tuples, lists, dicts): flattened to leaves and rebuilt."""

from __future__ import annotations

from typing import Any, Callable, List, Tuple


def flatten(tree: Any) -> Tuple[List[Any], Any]:
    """(the leaves of ``tree`` in order, a spec that :func:`unflatten` rebuilds it from)."""
    leaves: List[Any] = []
    return leaves, _flatten(tree, leaves)


def _flatten(tree: Any, leaves: list) -> Any:
    if isinstance(tree, dict):
        return (type(tree), list(tree), [_flatten(v, leaves) for v in tree.values()])
    if isinstance(tree, (tuple, list)):
        return (type(tree), None, [_flatten(v, leaves) for v in tree])
    leaves.append(tree)
    return None


def unflatten(leaves: List[Any], spec: Any) -> Any:
    """Rebuild the tree described by ``spec`` with ``leaves`` in place of its leaves."""
    it = iter(leaves)
    return _unflatten(it, spec)


def _unflatten(it: Any, spec: Any) -> Any:
    if spec is None:
        return next(it)
    kind, keys, children = spec
    values = [_unflatten(it, c) for c in children]
    if keys is not None:
        return kind(zip(keys, values))
    if kind is tuple or kind is list:
        return kind(values)
    return kind(*values)  # a namedtuple


def tree_map(fn: Callable[[Any], Any], tree: Any) -> Any:
    """``tree`` with ``fn`` applied to every leaf."""
    leaves, spec = flatten(tree)
    return unflatten([fn(x) for x in leaves], spec)


def broadcast_prefix(prefix: Any, tree: Any, what: str) -> List[Any]:
    """One entry of ``prefix`` per leaf of ``tree``: a non-container entry of ``prefix``
    covers the whole subtree at its place (as torch.func's ``in_dims`` / ``out_dims``)."""
    out: List[Any] = []
    _broadcast(prefix, tree, out, what)
    return out


def _broadcast(prefix: Any, tree: Any, out: list, what: str) -> None:
    if not isinstance(prefix, (tuple, list, dict)):
        out.extend([prefix] * len(flatten(tree)[0]))
        return
    if isinstance(prefix, dict) != isinstance(tree, dict) or not isinstance(
            tree, (tuple, list, dict)) or len(prefix) != len(tree):
        raise ValueError(f"{what}: {prefix!r} does not match the structure of its input "
                         f"({type(tree).__name__} of {len(flatten(tree)[0])} leaves); give one "
                         f"int or None, or a container shaped like the input")
    if isinstance(prefix, dict):
        if set(prefix) != set(tree):
            raise ValueError(f"{what}: keys {sorted(prefix)} do not match the input's "
                             f"{sorted(tree)}")
        for k in tree:
            _broadcast(prefix[k], tree[k], out, what)
    else:
        for p, t in zip(prefix, tree):
            _broadcast(p, t, out, what)
