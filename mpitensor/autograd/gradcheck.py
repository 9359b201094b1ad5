"""``torch.autograd.gradcheck``: a function's analytic Jacobian (autograd, one output element
at a time through :func:`grad`) against central finite differences.

Each input that requires grad is perturbed element by element by ``±eps`` in place (under
``no_grad``); each column of the numerical Jacobian is ``(f(x + eps) - f(x - eps)) / (2 eps)``.
An entry fails when ``|analytic - numerical| > atol + rtol * |numerical|``. Inputs should be
float64: in float32 the finite differences alone are off by more than the default tolerances.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, List, Sequence

import numpy as np

from . import _engine
from .functional import jacobian_arrays
from .grad_api import grad
from .grad_mode import no_grad, set_grad_enabled

__all__ = ["gradcheck", "gradgradcheck", "GradcheckError"]


class GradcheckError(RuntimeError):
    """Raised by :func:`gradcheck` when an analytic gradient differs from the numerical one."""


def _outputs(func: Callable, inputs: Sequence, record: bool = True) -> List[Any]:
    Tensor = _engine._Tensor  # noqa: N806 - the class
    with set_grad_enabled(record):
        out = func(*inputs)
    outs = [out] if isinstance(out, Tensor) else list(out)
    return [o for o in outs if isinstance(o, Tensor)]


def _numerical(func: Callable, inputs: Sequence, x: Any, eps: float) -> List[np.ndarray]:
    """Per output, the numerical Jacobian w.r.t. ``x``: (output elements, x elements)."""
    data = x._data
    flat = data.reshape(-1)  # a view: the inputs are contiguous (checked by the caller)
    cols: List[List[np.ndarray]] = []
    with no_grad():
        for k in range(flat.size):
            orig = flat[k].item()
            flat[k] = orig + eps
            plus = [_to_numpy(o._data).reshape(-1) for o in _outputs(func, inputs, False)]
            flat[k] = orig - eps
            minus = [_to_numpy(o._data).reshape(-1) for o in _outputs(func, inputs, False)]
            flat[k] = orig
            cols.append([(p - m) / (2 * eps) for p, m in zip(plus, minus)])
    n_out = len(cols[0]) if cols else len(_outputs(func, inputs))
    return [np.stack([c[j] for c in cols], axis=1) if cols else np.zeros((0, 0))
            for j in range(n_out)]


def _analytic(outs: List[Any], xs: List[Any]) -> List[List[np.ndarray]]:
    """Per output, per input: the analytic Jacobian in float64 NumPy."""
    return [[_to_numpy(a) for a in row] for row in jacobian_arrays(outs, xs)]


def _to_numpy(a: Any) -> np.ndarray:
    return np.array(a.get() if hasattr(a, "get") and not isinstance(a, np.ndarray) else a,
                    dtype=np.float64)  # a copy: the array may be an input perturbed later


def _fail(msg: str, raise_exception: bool) -> bool:
    if raise_exception:
        raise GradcheckError(msg)
    return False


def gradcheck(
    func: Callable,
    inputs: Any,
    *,
    eps: float = 1e-6,
    atol: float = 1e-5,
    rtol: float = 1e-3,
    raise_exception: bool = True,
    nondet_tol: float = 0.0,
    check_undefined_grad: bool = True,
    check_grad_dtypes: bool = False,
    check_batched_grad: bool = False,
    check_batched_forward_grad: bool = False,
    check_forward_ad: bool = False,
    check_backward_ad: bool = True,
    fast_mode: bool = False,
    masked: Any = None,
) -> bool:
    """Check ``func``'s gradients w.r.t. the ``inputs`` that require grad by finite differences.

    Args:
        func: takes the inputs, returns a tensor or a tuple of tensors.
        inputs: a tensor or a tuple of arguments (those requiring grad are checked; float64).
        eps: the finite-difference step.
        atol, rtol: an entry passes when ``|analytic - numerical| <= atol + rtol * |numerical|``.
        raise_exception: raise :class:`GradcheckError` on a failure (else return False).
        nondet_tol: how far two analytic Jacobians of the same point may differ.
        check_undefined_grad: also check that zero output gradients give zero input gradients.
        check_grad_dtypes: also check each gradient's dtype against its input's.
        check_batched_grad: also check ``grad(..., is_grads_batched=True)`` against the rows.
        check_backward_ad: check the reverse-mode gradients (False: check nothing, True).
        fast_mode: accepted; the full Jacobian is always compared (stricter than torch's
            random projections).
        check_forward_ad, check_batched_forward_grad, masked: forward-mode AD and masked
            semantics do not exist in mpitensor: True raises ``NotImplementedError``.

    Returns:
        True when every check passes.

    Raises:
        GradcheckError: a mismatch (with ``raise_exception=True``), naming the output, the
            input and the first entries that differ.

    Example:
        >>> import mpitensor as mt
        >>> x = mt.randn(3, dtype=mt.float64, requires_grad=True)
        >>> gradcheck(lambda t: (t * t).sin(), (x,))
        True
    """
    if check_forward_ad or check_batched_forward_grad or masked:
        raise NotImplementedError("gradcheck: mpitensor has no forward-mode AD or masked "
                                  "tensors; leave check_forward_ad, check_batched_forward_grad "
                                  "and masked unset")
    args, xs = _check_inputs(inputs)
    if not check_backward_ad:
        return True
    outs = _outputs(func, args)
    analytic = _analytic(outs, xs)
    if nondet_tol >= 0:
        ok = _check_reentrant(func, args, xs, analytic, nondet_tol, raise_exception)
        if not ok:
            return False
    for i, x in enumerate(xs):
        numerical = _numerical(func, args, x, eps)
        for j, (a_rows, n) in enumerate(zip(analytic, numerical)):
            a = a_rows[i]
            bad = np.abs(a - n) > atol + rtol * np.abs(n)
            if bad.any():
                idx = [tuple(int(v) for v in p) for p in np.argwhere(bad)[:5]]
                pairs = ", ".join(f"[{r},{c}] analytic {a[r, c]:.6g} numerical {n[r, c]:.6g}"
                                  for r, c in idx)
                return _fail(
                    f"Jacobian mismatch for output {j} with respect to input {i}: "
                    f"{int(bad.sum())} of {bad.size} entries differ by more than atol={atol} + "
                    f"rtol={rtol}*|numerical| (entries are [output element, input element]): "
                    f"{pairs}; check the backward of the ops between them",
                    raise_exception)
    extra = [(check_undefined_grad, _check_zero_grads), (check_grad_dtypes, _check_dtypes),
             (check_batched_grad, _check_batched)]
    return all(f(outs, xs, analytic, raise_exception) for on, f in extra if on)


def _check_inputs(inputs: Any) -> tuple:
    """(the arguments as a tuple, those of them that require grad), validated."""
    Tensor = _engine._Tensor  # noqa: N806 - the class
    args = (inputs,) if isinstance(inputs, Tensor) else tuple(inputs)
    xs = [a for a in args if isinstance(a, Tensor) and a._requires_grad]
    if not xs:
        raise ValueError("gradcheck expects at least one input tensor with requires_grad=True")
    for x in xs:
        if x._data.dtype.kind == "c":
            raise NotImplementedError("gradcheck: complex inputs are not supported")
        if x._data.dtype != np.float64:
            warnings.warn(f"gradcheck: an input is {x._data.dtype}, not float64; finite "
                          "differences in low precision fail the default tolerances", stacklevel=3)
        if not x._data.flags.c_contiguous:
            raise ValueError("gradcheck perturbs inputs in place: pass contiguous tensors "
                             "(t.contiguous())")
    return args, xs


def _check_reentrant(func: Callable, args: tuple, xs: list, first: list, tol: float,
                     raise_exception: bool) -> bool:
    again = _analytic(_outputs(func, args), xs)
    for j, (r1, r2) in enumerate(zip(first, again)):
        for i, (a, b) in enumerate(zip(r1, r2)):
            if np.abs(a - b).max(initial=0) > tol:
                return _fail(f"backward is not reentrant: two analytic Jacobians of output {j} "
                             f"w.r.t. input {i} at the same point differ by "
                             f"{np.abs(a - b).max():.3g} > nondet_tol={tol}", raise_exception)
    return True


def _check_zero_grads(outs: list, xs: list, analytic: list, raise_exception: bool) -> bool:
    diff = [o for o in outs if o._requires_grad]
    if not diff:
        return True
    zeros = [_engine._new(_engine._xp(o._data).zeros_like(o._data)) for o in diff]
    for i, g in enumerate(grad(diff, xs, zeros, retain_graph=True, allow_unused=True)):
        if g is not None and bool((g._data != 0).any()):
            return _fail(f"zero output gradients gave a non-zero gradient for input {i}",
                         raise_exception)
    return True


def _check_dtypes(outs: list, xs: list, analytic: list, raise_exception: bool) -> bool:
    diff = [o for o in outs if o._requires_grad]
    ones = [_engine._new(_engine._xp(o._data).ones_like(o._data)) for o in diff]
    for i, (x, g) in enumerate(zip(xs, grad(diff, xs, ones, retain_graph=True,
                                            allow_unused=True))):
        if g is not None and g._data.dtype != x._data.dtype:
            return _fail(f"the gradient of input {i} is {g._data.dtype}, the input is "
                         f"{x._data.dtype}", raise_exception)
    return True


def _check_batched(outs: list, xs: list, analytic: list, raise_exception: bool) -> bool:
    for j, o in enumerate(outs):
        if not o._requires_grad:
            continue
        xp = _engine._xp(o._data)
        eye = xp.eye(o._data.size, dtype=o._data.dtype).reshape((o._data.size,) + o._data.shape)
        gs = grad(o, xs, _engine._new(eye), retain_graph=True, allow_unused=True,
                  is_grads_batched=True)
        for i, g in enumerate(gs):
            got = np.zeros_like(analytic[j][i]) if g is None else _to_numpy(g._data).reshape(
                o._data.size, -1)
            if not np.array_equal(got, analytic[j][i]):
                return _fail(f"batched gradients of output {j} w.r.t. input {i} differ from "
                             f"the gradients computed row by row", raise_exception)
    return True


def gradgradcheck(func: Callable, inputs: Any, grad_outputs: Any = None, **kwargs: Any) -> bool:
    """torch's second-order check: not available, mpitensor has no double backward.

    Raises:
        NotImplementedError: always.
    """
    raise NotImplementedError(
        "gradgradcheck needs gradients of gradients (double backward), which mpitensor's "
        "autograd does not have: its backward formulas work on arrays; use gradcheck for "
        "first-order gradients"
    )
