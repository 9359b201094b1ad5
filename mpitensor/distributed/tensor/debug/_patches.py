"""Functions swapped while a context is active, put back when the last one leaves (the tools
here cost nothing outside their contexts)."""

from __future__ import annotations

from typing import Any, Callable, List, Tuple

__all__ = ["Patches"]


class Patches:
    """Swaps made by ``install`` when the first holder enters, undone when the last leaves."""

    def __init__(self, install: Callable[["Patches"], None]) -> None:
        self._install = install
        self._saved: List[Tuple[Any, str, Any]] = []
        self.holders: List[Any] = []

    def swap(self, owner: Any, name: str, value: Any) -> None:
        """Set ``owner.name`` to ``value`` until the last holder leaves."""
        self._saved.append((owner, name, owner.__dict__[name]))
        setattr(owner, name, value)

    def enter(self, holder: Any) -> None:
        if not self.holders:
            self._install(self)
        self.holders.append(holder)

    def leave(self, holder: Any) -> None:
        self.holders.remove(holder)
        if not self.holders:
            while self._saved:
                owner, name, original = self._saved.pop()
                setattr(owner, name, original)
