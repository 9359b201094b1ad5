"""How tensors turn into text: ``repr``/``str`` and the print options behind them.

The text is the one torch prints for the same values and options, so that doctests and logs read
the same under both libraries. Printing works in four passes:

1. *Trim*: a tensor with more than ``threshold`` elements keeps only ``edgeitems`` entries at
   each end of every long axis. This is done where the data lives, so a large GPU tensor sends
   only its edges to the host.
2. *Style*: one notation and one column width are chosen for all elements (fixed point,
   whole numbers written ``3.``, or scientific when magnitudes are far apart).
3. *Render*: every element becomes a string of that width.
4. *Lay out*: the strings go into nested brackets, wrapped at ``linewidth``, and the notes that
   the values cannot show (device, dtype, size, autograd) are appended.

Example:
    >>> import mpitensor as mt
    >>> with mt.printoptions(precision=2):
    ...     print(mt.tensor([1.2345, 10.0]))
    tensor([ 1.23, 10.00])
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Iterator
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from mpitensor import backend as _backend
from mpitensor import dtypes as _dt

__all__ = ["set_printoptions", "get_printoptions", "printoptions", "tensor_repr"]

# The named presets of set_printoptions(profile=...); sci_mode is not part of a profile.
_PROFILES: Dict[str, Dict[str, Any]] = {
    "default": {"precision": 4, "threshold": 1000, "edgeitems": 3, "linewidth": 80},
    "short": {"precision": 2, "threshold": 1000, "edgeitems": 2, "linewidth": 80},
    "full": {"precision": 4, "threshold": math.inf, "edgeitems": 3, "linewidth": 80},
}

# Process-wide, as in torch; key order is that of torch.get_printoptions().
_options: Dict[str, Any] = {**_PROFILES["default"], "sci_mode": None}


def set_printoptions(
    precision: Optional[int] = None,
    threshold: Optional[float] = None,
    edgeitems: Optional[int] = None,
    linewidth: Optional[int] = None,
    profile: Optional[str] = None,
    sci_mode: Optional[bool] = None,
) -> None:
    """Change how every tensor prints from now on (``torch.set_printoptions``).

    A ``profile`` is applied first, then the options given explicitly. ``sci_mode`` is reset to
    automatic by any call that does not pass it, as in torch.

    Args:
        precision: digits after the decimal point (default 4).
        threshold: more elements than this and the tensor is summarised with ``...`` (1000).
        edgeitems: entries kept at each end of a summarised axis (3).
        linewidth: characters per line before wrapping (80).
        profile: ``"default"``, ``"short"`` (precision 2, 2 edge items) or ``"full"`` (never
            summarise).
        sci_mode: True forces scientific notation, False forbids it, None lets the values decide.

    Raises:
        ValueError: ``profile`` is not one of the three names.

    Example:
        >>> set_printoptions(precision=2); set_printoptions(profile="default")
    """
    if profile is not None:
        if profile not in _PROFILES:
            raise ValueError(f"unknown print profile {profile!r}; pick one of "
                             f"{', '.join(map(repr, _PROFILES))}")
        _options.update(_PROFILES[profile])
    given = {"precision": precision, "threshold": threshold, "edgeitems": edgeitems,
             "linewidth": linewidth}
    _options.update({name: value for name, value in given.items() if value is not None})
    _options["sci_mode"] = sci_mode


def get_printoptions() -> Dict[str, Any]:
    """Return a copy of the print options, as keyword arguments for :func:`set_printoptions`."""
    return dict(_options)


@contextlib.contextmanager
def printoptions(**kwargs: Any) -> Iterator[None]:
    """Apply :func:`set_printoptions` ``(**kwargs)`` for the body of a ``with`` block only.

    Example:
        >>> import mpitensor as mt
        >>> with printoptions(sci_mode=True):
        ...     print(mt.tensor([1.0]))
        tensor([1.0000e+00])
    """
    saved = dict(_options)
    try:  # set inside the try: whatever it changed before failing is undone as well
        set_printoptions(**kwargs)
        yield
    finally:
        _options.clear()
        _options.update(saved)


# --------------------------------------------------------------------------------------------
# pass 1: trim


def _on_gpu(x: Any) -> bool:
    return not isinstance(x, np.ndarray) and _backend.is_cupy_array(x)


def _keep_edges(x: Any, edge: int) -> Tuple[np.ndarray, List[bool]]:
    """Drop the middle of every axis longer than ``2 * edge``; return the host copy and which
    axes lost their middle."""
    trimmed = []
    for axis, length in enumerate(x.shape):
        trimmed.append(length > 2 * edge)
        if trimmed[-1]:
            before = (slice(None),) * axis
            ends = (x[before + (slice(None, edge),)], x[before + (slice(length - edge, None),)])
            x = _backend.array_module(x).concatenate(ends, axis=axis)
    return _backend.to_numpy(x), trimmed


# --------------------------------------------------------------------------------------------
# passes 2 and 3: style and render


@dataclasses.dataclass(frozen=True)
class _Style:
    """One notation for a whole tensor.

    ``kind`` is ``"plain"`` (ints and bools, as ``str`` writes them), ``"whole"`` (floats that
    are all integers, written ``3.``), ``"fixed"`` or ``"sci"``; every element is right-aligned
    in ``width`` characters.
    """

    kind: str
    width: int
    precision: int

    def text(self, value: Any) -> str:
        """``value`` in this notation, unpadded."""
        if self.kind == "plain":
            return str(value)
        if self.kind == "sci":
            return f"{value:.{self.precision}e}"
        if self.kind == "fixed":
            return f"{value:.{self.precision}f}"
        # the trailing dot tells a float tensor of whole numbers from an int one
        return f"{value:.0f}." if math.isfinite(value) else f"{value:.0f}"

    def cell(self, value: Any) -> str:
        """``value`` in this notation, right-aligned to the common width."""
        return self.text(value).rjust(self.width)


def _choose_style(values: np.ndarray, options: Dict[str, Any]) -> _Style:
    """Pick the notation and width that fit every element of ``values`` (real numbers)."""
    precision = options["precision"]
    if _dt.kind_of(values.dtype) not in "fc":
        widest = max((len(str(v)) for v in values.ravel().tolist()), default=1)
        return _Style("plain", widest, precision)
    numbers = values.ravel().astype(np.float64)
    # Zeros, nan and inf print the same in every notation, so only the others decide it.
    deciding = numbers[np.isfinite(numbers) & (numbers != 0)]
    if deciding.size == 0:
        return _Style("whole", 1, precision)
    smallest, largest = np.abs(deciding).min(), np.abs(deciding).max()
    if options["sci_mode"] is not None:
        kind = "sci" if options["sci_mode"] else None
    else:
        far_apart = largest / smallest > 1000.0 or largest > 1.0e8 or smallest < 1.0e-4
        kind = "sci" if far_apart else None
    if kind is None:
        kind = "whole" if bool(np.all(np.floor(deciding) == deciding)) else "fixed"
    probe = _Style(kind, 1, precision)
    widest = max(len(probe.text(v)) for v in deciding.tolist())
    return _Style(kind, widest, precision)


def _render(host: np.ndarray, options: Dict[str, Any]) -> Tuple[np.ndarray, int]:
    """Return an object array of element strings shaped like ``host``, and the room (in
    characters, separator included) that one element takes on a line."""
    if host.dtype.kind != "c":
        style = _choose_style(host, options)
        cells = [style.cell(v) for v in host.ravel().tolist()]
        room = style.width + len(", ")
    else:
        real, imag = _choose_style(host.real, options), _choose_style(host.imag, options)
        cells = []
        for z in host.ravel().tolist():
            tail = imag.text(z.imag) + "j"
            cells.append(real.cell(z.real) + ("" if tail.startswith("-") else "+") + tail)
        room = real.width + len(", ") + imag.width + len("j")
    out = np.empty(len(cells), dtype=object)
    out[:] = cells
    return out.reshape(host.shape), room


# --------------------------------------------------------------------------------------------
# pass 4: lay out


def _nest(cells: np.ndarray, trimmed: List[bool], column: int, room: int,
          options: Dict[str, Any]) -> str:
    """Bracket ``cells`` with the opening bracket at ``column``, ``...`` where axes were cut."""
    if cells.ndim == 0:
        return cells.item()
    edge = options["edgeitems"]
    if cells.ndim == 1:
        items = list(cells)
        if trimmed[0]:
            items[edge:edge] = [" ..."]
        per_line = max(1, int((options["linewidth"] - column) // room))
        rows = [", ".join(items[i:i + per_line]) for i in range(0, len(items), per_line)]
        return "[" + (",\n" + " " * (column + 1)).join(rows) + "]"
    parts = [_nest(sub, trimmed[1:], column + 1, room, options) for sub in cells]
    if trimmed[0]:
        parts[edge:edge] = ["..."]
    # sub-blocks are parted by one blank line fewer than they have dimensions
    gap = "," + "\n" * (cells.ndim - 1) + " " * (column + 1)
    return "[" + gap.join(parts) + "]"


def _values_text(x: Any, column: int, options: Dict[str, Any]) -> str:
    """The bracketed values of array ``x`` whose opening bracket stands at ``column``."""
    if x.size == 0:
        return "[]"
    summarise = x.size > options["threshold"]
    if summarise and options["edgeitems"] == 0 and x.ndim > 0:
        return "[...]"  # no edges to show: only the shape (in a note) says anything
    if summarise:
        host, trimmed = _keep_edges(x, options["edgeitems"])
    else:
        host, trimmed = _backend.to_numpy(x), [False] * x.ndim
    cells, room = _render(host, options)
    return _nest(cells, trimmed, column, room, options)


def _notes(t: Any, x: Any, options: Dict[str, Any]) -> List[str]:
    """The ``key=value`` notes after the values, in torch's order."""
    notes = []
    if _on_gpu(x):
        notes.append(f"device='{_backend.device_of(x)}'")
    empty = x.size == 0
    # an empty tensor's shape is not visible from "[]"; neither is it when no edges show
    if (empty and x.ndim != 1) or (not empty and options["edgeitems"] == 0):
        notes.append(f"size={tuple(x.shape)}")
    implied = [_dt.get_default_dtype()]
    if not empty:  # values show ints, bools and complex numbers for what they are
        implied += [_dt.default_complex_dtype(), _dt.int64, _dt.bool_]
    if x.dtype not in implied:
        notes.append(f"dtype={_dt.dt_repr(x.dtype)}")
    if t.grad_fn is not None:
        notes.append(f"grad_fn=<{t.grad_fn.name()}>")
    elif t._requires_grad:
        notes.append("requires_grad=True")
    return notes


def _close(text: str, notes: List[str], indent: int, linewidth: int) -> str:
    """Append ``notes`` and the closing parenthesis, starting a new line when one is too long."""
    lines = text.split("\n")
    # torch counts two characters more than the last line holds, until the first wrap
    used = len(lines[-1]) + 2
    for note in notes:
        if used + len(note) + 2 > linewidth:
            lines[-1] += ","
            lines.append(" " * indent + note)
            used = len(lines[-1])
        else:
            lines[-1] += ", " + note
            used += len(note) + 2
    return "\n".join(lines) + ")"


def tensor_repr(t: Any, name: str = "tensor") -> str:
    """Return ``repr(t)`` for a :class:`~mpitensor.Tensor` (what ``print`` shows as well).

    Args:
        t: the tensor.
        name: what the text starts with: ``tensor``, or a subclass's own name (``Parameter``).
            The caller says which, as this module must not import ``mpitensor.tensor`` (which
            imports it).

    Returns:
        ``<name>([...], <notes>)`` laid out under the current print options.
    """
    head = f"{name}("
    options = dict(_options)
    x = t._data
    if isinstance(x, _backend.MetaArray):  # no values to show: the device and the shape
        notes = ["device='meta'", f"size={tuple(x.shape)}"]
        if x.dtype != _dt.get_default_dtype():
            notes.append(f"dtype={_dt.dt_repr(x.dtype)}")
        notes += [n for n in _notes(t, x, options) if n.startswith(("grad_fn", "requires"))]
        return _close(head + "...", notes, len(head), options["linewidth"])
    body = _values_text(x, len(head), options)
    return _close(head + body, _notes(t, x, options), len(head), options["linewidth"])
