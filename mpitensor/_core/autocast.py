"""The autocast state and the cast each listed op applies to its inputs (``torch.autocast``).

The state is per thread, as torch keeps it: for each device type (``"cpu"``, ``"cuda"``)
whether autocast is on and to which dtype it casts, plus whether casts are cached and how deep
the autocast regions nest. The op entry points that autocast acts on start with::

    if _autocast.ON and _autocast.active():
        return _autocast.run("linear", linear, input, weight, bias)

``ON`` is a module global, False unless some thread has turned autocast on, so the cost where
autocast is never used is one global read. :func:`run` casts the floating inputs by the op's
policy on the device of each input and calls the op again; inside that call the thread is
marked busy, so the op's own body (and the ops it is built from) runs without being cast again,
as torch runs an autocast kernel's body below its autocast layer.

Policies, as torch's autocast op reference lists them for each device type:

- ``LOWER``: floating inputs other than float64 are cast to the autocast dtype;
- ``FP32``: floating inputs other than float64 are cast to float32;
- ``FP32_OPT``: as ``FP32`` unless the call gives a ``dtype``, which then rules;
- ``PROMOTE``: floating inputs are cast to the widest floating dtype among them;
- ``BANNED``: the op raises (its result is not safe to compute in the lower dtype).
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from mpitensor import dtypes as _dt

__all__ = ["ON", "active", "run", "op", "lower_dtype", "state", "set_enabled", "set_dtype",
           "POLICIES"]

LOWER, FP32, FP32_OPT, PROMOTE, BANNED = "lower", "fp32", "fp32_opt", "promote", "banned"

#: device type -> the dtype autocast casts to when no dtype is given
DEFAULT_DTYPE = {"cpu": _dt.bfloat16, "cuda": _dt.float16}

_CPU_LOWER = ("conv1d", "conv2d", "conv3d", "bmm", "mm", "baddbmm", "addmm", "addbmm", "linear",
              "matmul", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "prelu",
              "scaled_dot_product_attention", "linalg_vecdot",
              "tensordot", "einsum",  # (these two torch composes of mm/bmm; see einsum)
              "lstm")  # (oneDNN's LSTM; here float32, rounded once: see nn.RNNBase)
_CPU_FP32 = ("binary_cross_entropy", "prod", "cdist", "trace", "inverse", "mse_loss",
             "cosine_embedding_loss", "nll_loss", "hinge_embedding_loss", "poisson_nll_loss",
             "smooth_l1_loss", "cross_entropy", "l1_loss", "huber_loss", "margin_ranking_loss",
             "soft_margin_loss", "triplet_margin_loss", "multi_margin_loss", "kl_div",
             "multilabel_margin_loss", "binary_cross_entropy_with_logits", "linalg_solve",
             "max_pool3d", "avg_pool3d", "adaptive_avg_pool3d", "adaptive_max_pool3d",
             "max_unpool2d", "max_unpool3d", "fractional_max_pool2d", "fractional_max_pool3d",
             "reflection_pad", "replication_pad")
_CUDA_LOWER = ("conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
               "conv_transpose3d", "prelu", "addmm", "addmv", "addr", "matmul", "einsum", "mm",
               "mv", "linear", "addbmm", "baddbmm", "bmm", "scaled_dot_product_attention",
               "einsum_no_contraction", "lstm", "linalg_vecdot")
_CUDA_FP32 = ("layer_norm", "group_norm", "cosine_embedding_loss", "nll_loss",
              "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss",
              "mse_loss", "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss",
              "triplet_margin_loss", "multi_margin_loss", "binary_cross_entropy_with_logits",
              "poisson_nll_loss", "cdist", "cross_entropy", "acos", "asin", "cosh", "erfinv",
              "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt", "sinh",
              "tan", "pow", "logsumexp")
_CUDA_FP32_OPT = ("prod", "softmax", "log_softmax", "sum", "cumsum", "cumprod")
_CUDA_PROMOTE = ("dot", "tensordot", "tensordot_full")

#: device type -> op name -> policy (the ops whose entry points call :func:`run`)
POLICIES: dict = {
    "cpu": {**dict.fromkeys(_CPU_LOWER, LOWER), **dict.fromkeys(_CPU_FP32, FP32)},
    "cuda": {**dict.fromkeys(_CUDA_LOWER, LOWER), **dict.fromkeys(_CUDA_FP32, FP32),
             **dict.fromkeys(_CUDA_FP32_OPT, FP32_OPT), **dict.fromkeys(_CUDA_PROMOTE, PROMOTE),
             "binary_cross_entropy": BANNED},
}

#: True while some thread has autocast on for some device type (the entry points' fast check)
ON = False

_threads_on: set = set()
_guard = threading.Lock()


class _State(threading.local):
    def __init__(self) -> None:
        self.enabled = {"cpu": False, "cuda": False}
        self.dtype = dict(DEFAULT_DTYPE)
        self.cache_enabled = True
        self.nesting = 0
        self.busy = False


_tls = _State()


def state() -> _State:
    """This thread's autocast state (enabled and dtype per device type, cache flag, nesting)."""
    return _tls


def _refresh() -> None:
    global ON
    me = threading.get_ident()
    with _guard:
        if any(_tls.enabled.values()):
            _threads_on.add(me)
        else:
            _threads_on.discard(me)
        ON = bool(_threads_on)


def set_enabled(device_type: str, enabled: bool) -> None:
    """Turn autocast on or off for ``device_type`` in this thread."""
    _tls.enabled[device_type] = bool(enabled)
    _refresh()


def set_dtype(device_type: str, dtype: Any) -> None:
    """Set the dtype autocast casts to on ``device_type`` in this thread."""
    _tls.dtype[device_type] = dtype


def active() -> bool:
    """Whether this thread casts at an op entry now (autocast on, not inside a cast op)."""
    return not _tls.busy and (_tls.enabled["cpu"] or _tls.enabled["cuda"])


def _device_type(t: Any) -> str:
    return "cuda" if t.is_cuda else "cpu"


def _tensors(args: tuple, kwargs: dict) -> list:
    from mpitensor.tensor import Tensor

    found = []
    for v in (*args, *kwargs.values()):
        if isinstance(v, Tensor):
            found.append(v)
        elif isinstance(v, (list, tuple)):
            found.extend(x for x in v if isinstance(x, Tensor))
    return found


def _target(name: str, tensors: list, kwargs: dict) -> dict:
    """device type -> the dtype its eligible inputs are cast to (device types with none absent)."""
    out = {}
    for dev in {_device_type(t) for t in tensors}:
        if not _tls.enabled[dev]:
            continue
        policy = POLICIES[dev].get(name)
        if policy is None:
            continue
        if policy == BANNED:
            raise RuntimeError(
                f"{name}() is not allowed inside an autocast region on {dev}: its result is not "
                f"safe to compute in {_dt.dt_repr(_tls.dtype[dev])}. Use "
                f"binary_cross_entropy_with_logits (or BCEWithLogitsLoss), which is, or leave "
                f"the region before this op")
        if policy == LOWER:
            out[dev] = _tls.dtype[dev]
        elif policy == FP32 or (policy == FP32_OPT and kwargs.get("dtype") is None):
            out[dev] = _dt.float32
        elif policy == PROMOTE:
            floats = {t.dtype for t in tensors if _device_type(t) == dev
                      and _dt.is_floating_dtype(t.dtype)}
            if len(floats) > 1:
                out[dev] = _dt.float64 if _dt.float64 in floats else _dt.float32
    return out


def lower_dtype(name: str, t: Any) -> Any:
    """The autocast dtype where op ``name`` is on the lower-precision list for ``t``'s device
    and autocast is on there (``t`` a floating tensor other than float64), else None."""
    from mpitensor.tensor import Tensor

    if not isinstance(t, Tensor) or t.dtype == _dt.float64 or not _dt.is_floating_dtype(t.dtype):
        return None
    dev = _device_type(t)
    if _tls.enabled[dev] and POLICIES[dev].get(name) == LOWER:
        return _tls.dtype[dev]
    return None


def _cast(v: Any, target: dict, Tensor: type) -> Any:  # noqa: N803
    if isinstance(v, Tensor):
        to = target.get(_device_type(v))
        if to is not None and v.dtype != to and (v.dtype != _dt.float64 or to == _dt.float64) \
                and _dt.is_floating_dtype(v.dtype):
            return v.to(to)
        return v
    if isinstance(v, (list, tuple)) and any(isinstance(x, Tensor) for x in v):
        return type(v)(_cast(x, target, Tensor) for x in v)
    return v


def run(name: str, fn: Callable, *args: Any, **kwargs: Any) -> Any:
    """Call ``fn`` (the op ``name``) with its inputs cast by autocast's policy for ``name``."""
    from mpitensor.tensor import Tensor

    target = _target(name, _tensors(args, kwargs), kwargs)
    if target:
        args = tuple(_cast(a, target, Tensor) for a in args)
        kwargs = {k: _cast(v, target, Tensor) for k, v in kwargs.items()}
    _tls.busy = True
    try:
        return fn(*args, **kwargs)
    finally:
        _tls.busy = False


def op(name: Any) -> Callable:
    """Decorator form of the entry check, for ops called once a step (losses, reductions).

    ``name`` is the op's name, or a function of the call's arguments that returns it (an op
    whose policy depends on its arguments, as padding's on its mode)."""
    import functools

    def wrap(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def entry(*args: Any, **kwargs: Any) -> Any:
            if ON and active():
                label = name(*args, **kwargs) if callable(name) else name
                return run(label, fn, *args, **kwargs)
            return fn(*args, **kwargs)
        return entry
    return wrap
