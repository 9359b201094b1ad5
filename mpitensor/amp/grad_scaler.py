"""``GradScaler``: loss scaling for low-precision training, with ``torch.amp.GradScaler``'s rules.

The loss is multiplied by a scale before ``backward()``; ``unscale_`` divides the gradients by
it and notes whether any is inf or NaN; ``step`` skips the optimizer step when one was;
``update`` multiplies the scale by ``backoff_factor`` after such a step, and by
``growth_factor`` after ``growth_interval`` steps in a row without one.

Example:
    >>> import mpitensor as torch
    >>> model = torch.nn.Linear(3, 1)
    >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
    >>> scaler = torch.amp.GradScaler("cpu")
    >>> loss = model(torch.ones(2, 3)).sum()
    >>> scaler.scale(loss).backward()
    >>> scaler.step(opt)
    >>> scaler.update()
"""

from __future__ import annotations

import warnings
from collections import defaultdict
from enum import Enum
from typing import Any, Optional

import numpy as np

from mpitensor import backend as _backend
from mpitensor import dtypes as _dt
from mpitensor._core.devices import xp
from mpitensor.autograd import no_grad
from mpitensor.tensor import Tensor, tensor

from .autocast_mode import _device_type

__all__ = ["GradScaler", "OptState"]


class OptState(Enum):
    """Where an optimizer is in the scaler's iteration."""

    READY = 0
    UNSCALED = 1
    STEPPED = 2


def _fresh_state() -> dict:
    return {"stage": OptState.READY, "found_inf_per_device": {}}


def _f32(v: float) -> float:
    """``v`` rounded to float32, as the scale is held."""
    return float(np.float32(v))


class GradScaler:
    """Scale the loss, unscale the gradients, skip steps with inf/NaN gradients, adapt.

    Args:
        device: the device type the gradients live on (``"cuda"``, ``"cpu"``).
        init_scale: the first scale.
        growth_factor: what the scale is multiplied by after ``growth_interval`` clean steps
            (> 1).
        backoff_factor: what it is multiplied by after a step with inf/NaN gradients (< 1).
        growth_interval: clean steps in a row before the scale grows.
        enabled: False makes every method a pass-through (``scale`` returns its input,
            ``step`` is ``optimizer.step()``).

    Raises:
        AssertionError: ``growth_factor <= 1`` or ``backoff_factor >= 1`` (when enabled).
        RuntimeError: an unknown device type.

    Warns:
        UserWarning: ``device="cuda"`` where no GPU can be used: the scaler disables itself,
            as torch's does.
    """

    def __init__(self, device: str = "cuda", init_scale: float = 2.0**16,
                 growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000, enabled: bool = True) -> None:
        self._device = _device_type(device, "GradScaler()")
        self._enabled = bool(enabled)
        if self._enabled and self._device == "cuda" and not _backend.cupy_available():
            warnings.warn("GradScaler('cuda') was asked for, but no GPU can be used here; it "
                          "disables itself (scale() returns its input, step() is a plain "
                          "optimizer step)", UserWarning, stacklevel=2)
            self._enabled = False
        if self._enabled:
            for name, value, ok, bound in (
                    ("growth_factor", growth_factor, growth_factor > 1.0, "> 1.0"),
                    ("backoff_factor", backoff_factor, backoff_factor < 1.0, "< 1.0")):
                if not ok:
                    raise AssertionError(f"GradScaler(): {name} must be {bound}, got {value}")
        self._init_scale = init_scale
        self._growth_factor = growth_factor
        self._backoff_factor = backoff_factor
        self._growth_interval = growth_interval
        self._init_growth_tracker = 0
        self._scale: Optional[Tensor] = None
        self._growth_tracker: Optional[Tensor] = None
        self._per_optimizer_states: defaultdict = defaultdict(_fresh_state)

    def _need_scale(self, what: str) -> None:
        if self._scale is None:
            raise AssertionError(f"GradScaler.{what}() was called before scale(): call "
                                 f"scaler.scale(loss) (or outputs) earlier in the iteration")

    def _state_of(self, optimizer: Any, what: str) -> dict:
        """``optimizer``'s stage and inf checks in this iteration (after scale() was called)."""
        self._need_scale(what)
        return self._per_optimizer_states[id(optimizer)]

    def _lazy_init(self, device: Any) -> None:
        self._scale = tensor(self._init_scale, dtype=_dt.float32, device=device)
        self._growth_tracker = tensor(self._init_growth_tracker, dtype=_dt.int32, device=device)

    def scale(self, outputs: Any) -> Any:
        """Return ``outputs`` (a tensor, or nested lists/tuples of them) times the scale."""
        if not self._enabled:
            return outputs
        if isinstance(outputs, Tensor):
            if self._scale is None:
                self._lazy_init(outputs.device)
            return outputs * self._scale.to(outputs.device)
        if isinstance(outputs, (list, tuple)):
            return type(outputs)(self.scale(o) for o in outputs)
        if hasattr(outputs, "__iter__") and not isinstance(outputs, (str, bytes)):
            return map(self.scale, outputs)
        raise ValueError(f"GradScaler.scale(): outputs must be a Tensor or an iterable of "
                         f"Tensors, got {type(outputs).__name__}")

    def unscale_(self, optimizer: Any) -> None:
        """Divide ``optimizer``'s gradients by the scale in place; note any inf/NaN.

        Raises:
            RuntimeError: called twice for this optimizer since ``update()``, or after
                ``step()``.
            ValueError: a float16 gradient (unscale float32 master gradients instead).
        """
        if not self._enabled:
            return
        state = self._state_of(optimizer, "unscale_")
        if state["stage"] is OptState.UNSCALED:
            raise RuntimeError("GradScaler.unscale_(): already called for this optimizer "
                               "since the last update()")
        if state["stage"] is OptState.STEPPED:
            raise RuntimeError("GradScaler.unscale_(): called after step(); unscale before "
                               "stepping, then call update()")
        inv = _f32(1.0 / self._scale.item())  # the reciprocal in double, held in float32
        state["found_inf_per_device"] = self._unscale_grads_(optimizer, inv, False)
        state["stage"] = OptState.UNSCALED

    def _unscale_grads_(self, optimizer: Any, inv_scale: float, allow_fp16: bool) -> dict:
        """Multiply ``optimizer``'s gradients by ``inv_scale`` in place; return, per device, a
        zero-dim float32 tensor that is 1 where a gradient held an inf or NaN."""
        grads = [p.grad for group in optimizer.param_groups for p in group["params"]
                 if p.grad is not None]
        if not allow_fp16 and any(g.dtype == _dt.float16 for g in grads):
            raise ValueError("GradScaler.unscale_(): a gradient is float16; keep the "
                             "parameters in float32 (autocast casts them) and unscale their "
                             "float32 gradients")
        found: dict = {}
        with no_grad():
            for g in grads:
                dev = g.device
                bad = not bool(xp(g._data).isfinite(g._data).all())
                found[dev] = found.get(dev, False) or bad
                if inv_scale != 1.0:
                    g.mul_(inv_scale)
        return {dev: tensor(1.0 if bad else 0.0, dtype=_dt.float32, device=dev)
                for dev, bad in found.items()}

    def _check_inf_per_device(self, optimizer: Any) -> dict:
        """Look for inf/NaN in ``optimizer``'s gradients without unscaling them (as libraries
        built on torch's GradScaler call it); record and return the per-device flags."""
        state = self._state_of(optimizer, "_check_inf_per_device")
        state["found_inf_per_device"] = self._unscale_grads_(optimizer, 1.0, True)
        return state["found_inf_per_device"]

    def _found_inf_per_device(self, optimizer: Any) -> dict:
        """The per-device inf/NaN flags recorded for ``optimizer`` in this iteration."""
        return self._per_optimizer_states[id(optimizer)]["found_inf_per_device"]

    def _get_scale_async(self) -> Optional[Tensor]:
        """The scale as a tensor (None before the first ``scale()``)."""
        return self._scale

    def step(self, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        """Unscale (if not yet done) and call ``optimizer.step()`` unless a gradient was
        inf/NaN; return what ``step`` returned (None when skipped).

        Raises:
            RuntimeError: a ``closure`` keyword, or a second ``step()`` before ``update()``.
            AssertionError: no gradient was seen for this optimizer.
        """
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs:
            raise RuntimeError("GradScaler.step(): a closure is not supported while the "
                               "scaler is enabled; compute the loss before step()")
        state = self._state_of(optimizer, "step")
        if state["stage"] is OptState.STEPPED:
            raise RuntimeError("GradScaler.step(): already called for this optimizer since "
                               "the last update()")
        if state["stage"] is OptState.READY:
            self.unscale_(optimizer)
        if not state["found_inf_per_device"]:
            raise AssertionError("GradScaler.step(): no gradient was checked for inf/NaN for "
                                 "this optimizer (did backward() reach its parameters?)")
        ret = None
        if not any(v.item() for v in state["found_inf_per_device"].values()):
            ret = optimizer.step(*args, **kwargs)
        state["stage"] = OptState.STEPPED
        return ret

    def update(self, new_scale: Any = None) -> None:
        """Adapt the scale after this iteration's steps, or set it to ``new_scale``.

        Raises:
            AssertionError: no optimizer was unscaled/stepped since the last update, or
                ``new_scale`` is a tensor of more than one element or with requires_grad.
        """
        if not self._enabled:
            return
        self._need_scale("update")
        if new_scale is not None:
            if isinstance(new_scale, Tensor):
                if new_scale.numel() != 1 or new_scale.requires_grad:
                    raise AssertionError("GradScaler.update(): new_scale must be a float or a "
                                         "one-element tensor without requires_grad")
                new_scale = new_scale.item()
            self._scale.fill_(_f32(float(new_scale)))
        else:
            found = [v for st in self._per_optimizer_states.values()
                     for v in st["found_inf_per_device"].values()]
            if not found:
                raise AssertionError("GradScaler.update(): no optimizer was unscaled or "
                                     "stepped since the last update()")
            scale = self._scale.item()
            tracker = int(self._growth_tracker.item())
            if any(v.item() for v in found):
                scale, tracker = _f32(scale * self._backoff_factor), 0
            elif tracker + 1 == self._growth_interval:
                grown = _f32(scale * self._growth_factor)
                scale, tracker = (grown if np.isfinite(grown) else scale), 0
            else:
                tracker += 1
            self._scale.fill_(scale)
            self._growth_tracker.fill_(tracker)
        self._per_optimizer_states = defaultdict(_fresh_state)

    def get_scale(self) -> float:
        """Return the current scale (1.0 when disabled)."""
        if not self._enabled:
            return 1.0
        return self._init_scale if self._scale is None else self._scale.item()

    def get_growth_factor(self) -> float:
        """Return the growth factor."""
        return self._growth_factor

    def set_growth_factor(self, new_factor: float) -> None:
        """Set the growth factor."""
        self._growth_factor = new_factor

    def get_backoff_factor(self) -> float:
        """Return the backoff factor."""
        return self._backoff_factor

    def set_backoff_factor(self, new_factor: float) -> None:
        """Set the backoff factor."""
        self._backoff_factor = new_factor

    def get_growth_interval(self) -> int:
        """Return the growth interval."""
        return self._growth_interval

    def set_growth_interval(self, new_interval: int) -> None:
        """Set the growth interval."""
        self._growth_interval = new_interval

    def _get_growth_tracker(self) -> int:
        if not self._enabled:
            return 0
        if self._growth_tracker is None:
            return self._init_growth_tracker
        return int(self._growth_tracker.item())

    def is_enabled(self) -> bool:
        """Return whether the scaler acts (False after it disabled itself)."""
        return self._enabled

    def state_dict(self) -> dict:
        """Return the scale, factors, interval and growth tracker ({} when disabled)."""
        if not self._enabled:
            return {}
        return {"scale": self.get_scale(), "growth_factor": self._growth_factor,
                "backoff_factor": self._backoff_factor,
                "growth_interval": self._growth_interval,
                "_growth_tracker": self._get_growth_tracker()}

    def load_state_dict(self, state_dict: dict) -> None:
        """Load what :meth:`state_dict` returned.

        Raises:
            RuntimeError: an empty dict (saved by a disabled scaler).
        """
        if not self._enabled:
            return
        if len(state_dict) == 0:
            raise RuntimeError("GradScaler.load_state_dict(): the dict is empty, as a disabled "
                               "scaler saves it; nothing to load")
        self._init_scale = float(state_dict["scale"])
        self._growth_factor = float(state_dict["growth_factor"])
        self._backoff_factor = float(state_dict["backoff_factor"])
        self._growth_interval = int(state_dict["growth_interval"])
        self._init_growth_tracker = int(state_dict["_growth_tracker"])
        if self._scale is not None:
            self._scale.fill_(self._init_scale)
        if self._growth_tracker is not None:
            self._growth_tracker.fill_(self._init_growth_tracker)

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        if self._enabled:
            # the per-optimizer states are keyed by id(), which means nothing elsewhere
            state["_per_optimizer_states"] = None
            for name, attr in (("_init_scale", "_scale"),
                               ("_init_growth_tracker", "_growth_tracker")):
                if state[attr] is not None:
                    state[name] = state[attr].item()
                state[attr] = None
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._per_optimizer_states = defaultdict(_fresh_state)
