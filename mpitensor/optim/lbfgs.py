"""``LBFGS``: limited-memory BFGS with an optional strong-Wolfe line search.

``torch.optim.LBFGS``'s behaviour, written from the algorithm (Nocedal & Wright, *Numerical
Optimization*, algorithms 7.4 and 3.5/3.6; the cubic interpolation of minFunc): every
:meth:`LBFGS.step` runs up to ``max_iter`` iterations, each one

1. a direction ``d = -H g`` from the two-loop recursion over the last ``history_size`` pairs
   ``(s, y)`` (steps and gradient changes; a pair is kept only when ``y.s > 1e-10``), with the
   initial Hessian guess ``H0 = (y.s / y.y) I`` from the newest pair;
2. a step length ``t``: ``min(1, 1 / |g|_1) * lr`` on the very first iteration, ``lr`` after;
   with ``line_search_fn="strong_wolfe"`` a bracketing and zoom search for a point meeting the
   strong Wolfe conditions (``c1 = 1e-4``, ``c2 = 0.9``, at most 25 evaluations);
3. stops on: ``max_iter`` iterations, ``max_eval`` closure calls, ``max |g| <= tolerance_grad``,
   a directional derivative ``g.d > -tolerance_change``, a step ``max |t d| <= tolerance_change``,
   or a loss change below ``tolerance_change``.

All parameters are handled as one flat vector (one parameter group only, as in torch). The
state, kept under the first parameter in torch's layout, carries the history across calls.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from mpitensor import autograd as _autograd
from mpitensor import backend as _backend
from mpitensor.tensor import Tensor

from . import _adaptive as _a
from .optimizer import Optimizer

__all__ = ["LBFGS"]

_FLAT_KEYS = ("d", "prev_flat_grad", "H_diag", "t")
_LIST_KEYS = ("old_dirs", "old_stps", "ro", "al")


def _cubic_min(x1: Any, f1: Any, g1: Any, x2: Any, f2: Any, g2: Any,
               bounds: Optional[Tuple[Any, Any]] = None) -> Any:
    """The minimiser of the cubic through (x1, f1, g1) and (x2, f2, g2), clipped to ``bounds``.

    Without bounds the interval between ``x1`` and ``x2`` is used; when the cubic has no
    minimum there, the middle of the bounds is returned.
    """
    lo, hi = bounds if bounds is not None else ((x1, x2) if x1 <= x2 else (x2, x1))
    d1 = g1 + g2 - 3 * (f1 - f2) / (x1 - x2)
    disc = d1 ** 2 - g1 * g2
    if disc >= 0:
        d2 = disc ** 0.5
        if x1 <= x2:
            x = x2 - (x2 - x1) * ((g2 + d2 - d1) / (g2 - g1 + 2 * d2))
        else:
            x = x1 - (x1 - x2) * ((g1 + d2 - d1) / (g1 - g2 + 2 * d2))
        return min(max(x, lo), hi)
    return (lo + hi) / 2.0


def _away_from_ends(t: Any, bracket: List[Any], stalled: bool) -> Tuple[Any, bool]:
    """Keep a zoom step out of the outer tenth of the bracket: a step that lands there twice
    in a row (or outside the bracket) moves in by that margin. Returns the step and whether
    this one was left close to an end."""
    top, bottom = max(bracket), min(bracket)
    margin = 0.1 * (top - bottom)
    if not min(top - t, t - bottom) < margin:  # (NaN included: left as it is)
        return t, False
    if stalled or t >= top or t <= bottom:
        return (top - margin if abs(t - top) < abs(t - bottom) else bottom + margin), False
    return t, True


def _strong_wolfe(evaluate: Callable[[Any], Tuple[float, Any]], t: Any, d: Any, f: float,
                  g: Any, gtd: Any, c1: float = 1e-4, c2: float = 0.9,
                  tolerance_change: float = 1e-9, max_ls: int = 25) -> Tuple[float, Any, Any, int]:
    """Search along ``d`` for a step meeting the strong Wolfe conditions (N&W alg. 3.5 + 3.6).

    Args:
        evaluate: ``t -> (loss, flat gradient)`` at ``x + t d`` (leaving ``x`` in place).
        t: the first trial step; ``f``, ``g``, ``gtd``: loss, gradient and ``g.d`` at ``x``.

    Returns:
        ``(loss, gradient, t, evaluations)`` at the accepted step.
    """
    xp = _backend.array_module(d)
    d_norm = xp.abs(d).max()
    g = g.copy()
    f_new, g_new = evaluate(t)
    evals = 1
    gtd_new = xp.dot(g_new, d)
    # phase 1: widen the step until an interval is known to hold an acceptable point
    t_prev, f_prev, g_prev, gtd_prev = 0, f, g, gtd
    found = False
    ls_iter = 0
    bracket: List[Any] = []
    while ls_iter < max_ls:
        if f_new > f + c1 * t * gtd or (ls_iter > 1 and f_new >= f_prev):
            bracket = [t_prev, t]
            b_f, b_g, b_gtd = [f_prev, f_new], [g_prev, g_new.copy()], [gtd_prev, gtd_new]
            break
        if abs(gtd_new) <= -c2 * gtd:
            bracket, b_f, b_g = [t], [f_new], [g_new]
            found = True
            break
        if gtd_new >= 0:
            bracket = [t_prev, t]
            b_f, b_g, b_gtd = [f_prev, f_new], [g_prev, g_new.copy()], [gtd_prev, gtd_new]
            break
        lo_step = t + 0.01 * (t - t_prev)
        hi_step = t * 10
        before = t
        t = _cubic_min(t_prev, f_prev, gtd_prev, t, f_new, gtd_new, bounds=(lo_step, hi_step))
        t_prev, f_prev, g_prev, gtd_prev = before, f_new, g_new.copy(), gtd_new
        f_new, g_new = evaluate(t)
        evals += 1
        gtd_new = xp.dot(g_new, d)
        ls_iter += 1
    if ls_iter == max_ls:
        bracket, b_f, b_g = [0, t], [f, f_new], [g, g_new]

    # phase 2: shrink the interval (zoom) until a point satisfies both conditions
    stalled = False
    low, high = (0, 1) if b_f[0] <= b_f[-1] else (1, 0)
    while not found and ls_iter < max_ls:
        if abs(bracket[1] - bracket[0]) * d_norm < tolerance_change:
            break
        t = _cubic_min(bracket[0], b_f[0], b_gtd[0], bracket[1], b_f[1], b_gtd[1])
        t, stalled = _away_from_ends(t, bracket, stalled)
        f_new, g_new = evaluate(t)
        evals += 1
        gtd_new = xp.dot(g_new, d)
        ls_iter += 1
        if f_new > f + c1 * t * gtd or f_new >= b_f[low]:
            bracket[high], b_f[high], b_g[high], b_gtd[high] = t, f_new, g_new.copy(), gtd_new
            low, high = (0, 1) if b_f[0] <= b_f[1] else (1, 0)
        else:
            if abs(gtd_new) <= -c2 * gtd:
                found = True
            elif gtd_new * (bracket[high] - bracket[low]) >= 0:
                bracket[high], b_f[high] = bracket[low], b_f[low]
                b_g[high], b_gtd[high] = b_g[low], b_gtd[low]
            bracket[low], b_f[low], b_g[low], b_gtd[low] = t, f_new, g_new.copy(), gtd_new
    return b_f[low], b_g[low], bracket[low], evals


class LBFGS(Optimizer):
    """L-BFGS, as ``torch.optim.LBFGS``: ``step(closure)`` re-evaluates the model many times.

    Needs a closure that clears the gradients, computes the loss, calls ``backward()`` and
    returns the loss. Works best on full-batch, smooth problems; keeps ``history_size`` pairs
    of flat vectors (memory ``2 * history_size`` times the parameter count).

    Per-parameter state, under the first parameter (torch's keys): ``func_evals``, ``n_iter``
    (ints), ``d`` (last direction), ``t`` (last step length), ``old_dirs``, ``old_stps``
    (lists of the kept ``y`` and ``s``), ``ro`` (their ``1 / y.s``), ``H_diag``,
    ``prev_flat_grad``, ``prev_loss``, ``al`` (scratch of the two-loop recursion).

    Args:
        params: Tensors to optimise (a single group).
        lr: learning rate, the step length scale (default 1).
        max_iter: iterations per :meth:`step` (default 20).
        max_eval: closure calls per :meth:`step` (default ``max_iter * 5 // 4``).
        tolerance_grad: stop when the largest gradient entry is at most this (default 1e-7).
        tolerance_change: stop when the loss or the step changes less (default 1e-9).
        history_size: number of correction pairs kept (default 100).
        line_search_fn: None (fixed step ``lr``) or ``"strong_wolfe"``.

    Raises:
        ValueError: ``lr`` is negative, or more than one parameter group is given.
        RuntimeError: ``line_search_fn`` is neither None nor ``"strong_wolfe"`` (torch raises
            this at the first step; here at construction, before any work).

    Example:
        >>> import mpitensor as mt
        >>> w = mt.tensor([3.0, -1.0], requires_grad=True)
        >>> opt = LBFGS([w], line_search_fn="strong_wolfe")
        >>> def closure():
        ...     opt.zero_grad()
        ...     loss = ((w - 1.0) ** 2).sum()
        ...     loss.backward()
        ...     return loss
        >>> _ = opt.step(closure)
        >>> [round(float(v), 6) for v in w.detach()]
        [1.0, 1.0]
    """

    def __init__(self, params: Any, lr: float = 1, max_iter: int = 20,
                 max_eval: Optional[int] = None, tolerance_grad: float = 1e-7,
                 tolerance_change: float = 1e-9, history_size: int = 100,
                 line_search_fn: Optional[str] = None) -> None:
        _a.nonneg("LBFGS", "lr", lr)
        _check_line_search(line_search_fn)
        if max_eval is None:
            max_eval = max_iter * 5 // 4
        defaults = dict(lr=lr, max_iter=max_iter, max_eval=max_eval,
                        tolerance_grad=tolerance_grad, tolerance_change=tolerance_change,
                        history_size=history_size, line_search_fn=line_search_fn)
        super().__init__(params, defaults)
        if len(self.param_groups) != 1:
            raise ValueError("LBFGS works on one flat vector of all parameters and takes a "
                             "single parameter group; pass the parameters without per-group "
                             "options")
        self._params = self.param_groups[0]["params"]

    # ---- the flat view of the parameters ----------------------------------------------------

    def _flat_grad(self) -> Any:
        parts = []
        for p in self._params:
            g = p.grad
            parts.append(g._data.reshape(-1) if g is not None else
                         _backend.array_module(p._data).zeros(p._data.size, p._data.dtype))
        xp = _backend.array_module(parts[0])
        return xp.concatenate(parts)

    def _move(self, t: Any, d: Any) -> None:
        """``params += t * d``, ``d`` flat."""
        i = 0
        for p in self._params:
            n = p._data.size
            p._data += d[i:i + n].reshape(p._data.shape) * t
            _autograd.bump_version(p)
            i += n

    def _copy_params(self) -> List[Any]:
        return [p._data.copy() for p in self._params]

    def _restore(self, saved: List[Any]) -> None:
        for p, v in zip(self._params, saved):
            p._data[...] = v
            _autograd.bump_version(p)

    # ---- the step ----------------------------------------------------------------------------

    def step(self, closure: Callable[[], Any]) -> Any:  # type: ignore[override]
        """Run up to ``max_iter`` L-BFGS iterations; returns the loss the first closure call gave.

        Args:
            closure: clears the gradients, computes the loss, calls ``backward()`` and returns
                the loss; it is called with gradients enabled, possibly many times.

        Returns:
            The loss before this step's iterations (the first closure call's return value).

        Raises:
            RuntimeError: the group's ``line_search_fn`` was changed to an unknown one.
        """
        group = self.param_groups[0]
        lr = group["lr"]
        max_iter, max_eval = group["max_iter"], group["max_eval"]
        tol_grad, tol_change = group["tolerance_grad"], group["tolerance_change"]
        history = group["history_size"]
        line_search = group["line_search_fn"]
        _check_line_search(line_search)

        def evaluate() -> Any:
            with _autograd.enable_grad():
                return closure()

        state = self.state[self._params[0]]
        state.setdefault("func_evals", 0)
        state.setdefault("n_iter", 0)
        first_loss = evaluate()
        loss = float(first_loss)
        evals = 1
        state["func_evals"] += 1
        g = self._flat_grad()
        xp = _backend.array_module(g)
        if xp.abs(g).max() <= tol_grad:
            return first_loss

        # the memory carried from the last step, as raw arrays (the state holds Tensors)
        d, t, h_diag, prev_g = (_raw(state.get(k)) for k in ("d", "t", "H_diag", "prev_flat_grad"))
        old_dirs, old_stps, ro, al = ([_raw(v) for v in state.get(k, [])]
                                      for k in ("old_dirs", "old_stps", "ro", "al"))
        prev_loss = state.get("prev_loss")

        n_iter = 0
        while n_iter < max_iter:
            n_iter += 1
            state["n_iter"] += 1
            if state["n_iter"] == 1:
                d = -g
                old_dirs, old_stps, ro = [], [], []
                h_diag = 1
            else:
                h_diag = _remember(old_dirs, old_stps, ro, h_diag, g - prev_g, d * t, history)
                if len(al) != history:
                    al = [None] * history
                d = _two_loop(g, old_dirs, old_stps, ro, h_diag, al)
            prev_g = g.copy()
            prev_loss = loss
            t = min(1.0, 1.0 / xp.abs(g).sum()) * lr if state["n_iter"] == 1 else lr
            gtd = xp.dot(g, d)
            if gtd > -tol_change:
                break

            loss, g, t, ls_evals = self._advance(evaluate, line_search, t, d, loss, g, gtd,
                                                 n_iter != max_iter)
            done = ls_evals > 0 and xp.abs(g).max() <= tol_grad
            evals += ls_evals
            state["func_evals"] += ls_evals

            if (n_iter == max_iter or evals >= max_eval or done
                    or xp.abs(d * t).max() <= tol_change or abs(loss - prev_loss) < tol_change):
                break

        memory = dict(d=d, t=t, old_dirs=old_dirs, old_stps=old_stps, ro=ro, H_diag=h_diag,
                      prev_flat_grad=prev_g, prev_loss=prev_loss, al=al)
        state.update({k: [_wrap(x) for x in v] if isinstance(v, list) else _wrap(v)
                      for k, v in memory.items()})
        return first_loss

    def _advance(self, evaluate: Callable[[], Any], line_search: Any, t: Any, d: Any,
                 loss: float, g: Any, gtd: Any,
                 evaluate_after: bool) -> Tuple[float, Any, Any, int]:
        """Move the parameters along ``d``: by the step the strong-Wolfe search finds, or by
        ``t`` (then evaluated, unless ``evaluate_after`` is False on the last iteration).

        Returns:
            ``(loss, flat gradient, step, closure calls made)``.
        """
        if line_search is not None:
            start = self._copy_params()

            def along(step: Any) -> Tuple[float, Any]:
                self._move(step, d)
                value = float(evaluate())
                grad = self._flat_grad()
                self._restore(start)
                return value, grad

            loss, g, t, calls = _strong_wolfe(along, t, d, loss, g, gtd)
            self._move(t, d)
            return loss, g, t, calls
        self._move(t, d)
        if not evaluate_after:
            return loss, g, t, 0
        return float(evaluate()), self._flat_grad(), t, 1

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Restore a state dict; the flat vectors and lists are copied in the parameters' dtype.

        Args:
            state_dict: as returned by :meth:`state_dict` (torch's layout).

        Raises:
            ValueError, TypeError: as :meth:`Optimizer.load_state_dict`.
        """
        if not isinstance(state_dict, dict) or not isinstance(state_dict.get("state"), dict):
            super().load_state_dict(state_dict)  # raises the base class's error
            return
        flat: Dict[Any, Dict[str, Any]] = {}
        plain: Dict[Any, Dict[str, Any]] = {}
        for k, s in state_dict["state"].items():
            if isinstance(s, dict):
                flat[k] = {n: v for n, v in s.items() if n in _FLAT_KEYS + _LIST_KEYS}
                plain[k] = {n: v for n, v in s.items() if n not in flat[k]}
            else:
                plain[k] = s
        super().load_state_dict({**state_dict, "state": plain})
        saved_ids = self.state_dict()["param_groups"][0]["params"]
        loaded_ids = state_dict["param_groups"][0]["params"]
        by_index = {k: self._params[saved_ids.index(i)] for i, k in enumerate(loaded_ids)}
        for k, saved in flat.items():
            p = by_index[k]
            like = p._data
            self.state[p].update({n: (_copy_flat(v, like) if n in _FLAT_KEYS
                                      else [_copy_flat(x, like) for x in v])
                                  for n, v in saved.items()})


def _remember(old_dirs: List[Any], old_stps: List[Any], ro: List[Any], h_diag: Any, y: Any,
              s: Any, history: int) -> Any:
    """Add the curvature pair (gradient change ``y``, step ``s``) to the history, dropping the
    oldest beyond ``history``, when it keeps the inverse Hessian positive definite; return the
    new diagonal scaling (``h_diag`` unchanged when the pair is skipped)."""
    xp = _backend.array_module(y)
    ys = xp.dot(y, s)
    if ys > 1e-10:
        if len(old_dirs) == history:
            old_dirs.pop(0)
            old_stps.pop(0)
            ro.pop(0)
        old_dirs.append(y)
        old_stps.append(s)
        ro.append(1.0 / ys)
        h_diag = ys / xp.dot(y, y)
    return h_diag


def _two_loop(g: Any, old_dirs: List[Any], old_stps: List[Any], ro: List[Any], h_diag: Any,
              al: List[Any]) -> Any:
    """The L-BFGS direction: ``-g`` through the history, newest pair first, then back
    (``al`` holds the first loop's coefficients, as torch's state does)."""
    xp = _backend.array_module(g)
    kept = len(old_dirs)
    q = -g
    for i in range(kept - 1, -1, -1):
        al[i] = xp.dot(old_stps[i], q) * ro[i]
        q += old_dirs[i] * -al[i]
    d = r = q * h_diag
    for i in range(kept):
        be = xp.dot(old_dirs[i], r) * ro[i]
        r += old_stps[i] * (al[i] - be)
    return d


def _check_line_search(fn: Any) -> None:
    if fn is not None and fn != "strong_wolfe":
        raise RuntimeError(f"LBFGS: line_search_fn must be None or 'strong_wolfe', got {fn!r}")


def _raw(v: Any) -> Any:
    return v._data if isinstance(v, Tensor) else v


def _wrap(v: Any) -> Any:
    """A Tensor for arrays and array scalars (what the state dict holds); numbers as they are."""
    if v is None or type(v) in (int, float, bool):
        return v
    if _backend.is_array(v):
        return Tensor._wrap(v)
    return Tensor._wrap(np.asarray(v))  # a NumPy scalar such as a dot product


def _copy_flat(v: Any, like: Any) -> Any:
    """A copy of a saved flat vector or scalar in ``like``'s dtype, on its device."""
    if v is None or type(v) in (int, float, bool):
        return v
    arr = v._data if isinstance(v, Tensor) else v
    if hasattr(arr, "detach"):  # a torch Tensor from a torch state dict
        arr = arr.detach().cpu().numpy()
    xp = _backend.array_module(like)
    with _a.on_device(like):
        src = _backend.to_numpy(arr) if isinstance(like, np.ndarray) else arr
        return Tensor._wrap(xp.array(src, dtype=like.dtype, copy=True))
