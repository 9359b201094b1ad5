"""``Stateful`` (``torch.distributed.checkpoint.stateful``): objects that ``save`` and ``load``
ask for their state.

An object with a ``state_dict()`` and a ``load_state_dict(state_dict)`` method is ``Stateful``
(a structural protocol: no base class is needed, though subclassing it is allowed). A value
of the dict given to ``save``/``async_save``/``load`` that is ``Stateful`` (a model, an
optimizer, a scheduler, an application's wrapper of them) is handled for you:

- ``save`` writes what its ``state_dict()`` returns, in its place;
- ``load`` calls ``state_dict()`` to get the tensors to fill, loads into them in place, then
  calls ``load_state_dict()`` with the loaded state.

Only the top-level values are looked at, as in torch. ``state_dict()`` must return a dict.

Example:
    >>> class App(Stateful):  # doctest: +SKIP
    ...     def __init__(self, model): self.model = model
    ...     def state_dict(self): return {"model": self.model.state_dict()}
    ...     def load_state_dict(self, sd): self.model.load_state_dict(sd["model"])
    >>> dcp.save({"app": App(model)}, checkpoint_id="ckpt")  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any, Dict, List, Protocol, Tuple, TypeVar, runtime_checkable

__all__ = ["Stateful", "StatefulT"]


@runtime_checkable
class Stateful(Protocol):
    """An object whose state a checkpoint saves and restores (see the module docstring)."""

    def state_dict(self) -> Dict[str, Any]:
        """This object's state as a dict; ``load`` calls it too, to get what to fill in place."""
        ...

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Restore this object from ``state_dict`` (what ``state_dict()`` returned, loaded)."""
        ...


StatefulT = TypeVar("StatefulT", bound=Stateful)


def _expand(state_dict: Dict[str, Any]) -> Tuple[Dict[str, Any], List[str], List[str]]:
    """``state_dict`` with each top-level Stateful value replaced by its ``state_dict()``;
    the keys replaced, and what went wrong (a ``state_dict()`` that raised or returned no dict).

    Problems are returned, not raised, so that every rank learns of them together.
    """
    out: Dict[str, Any] = dict(state_dict)
    keys: List[str] = []
    problems: List[str] = []
    for key, value in state_dict.items():
        if not isinstance(value, Stateful) or isinstance(value, type):
            continue
        name = f"{type(value).__name__}.state_dict()"
        try:
            sd = value.state_dict()
        except Exception as exc:  # noqa: BLE001 - reported on every rank, then raised there
            problems.append(f"{key!r}: {name} raised {type(exc).__name__}: {exc}")
            continue
        if not isinstance(sd, dict):
            problems.append(f"{key!r}: {name} returned {type(sd).__name__}, not a dict; a "
                            f"Stateful's state_dict() must return a dict")
            continue
        out[key] = sd
        keys.append(key)
    return out, keys, problems
