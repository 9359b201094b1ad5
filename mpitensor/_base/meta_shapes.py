"""Shapes and dtypes of NumPy's operations, worked out without values: the meta device's rules.

A meta array (``backend.MetaArray``) has a shape and a dtype and no storage. Every NumPy
operation on one is answered here with the *spec* of its result, ``(shape, dtype)`` (a list of
them for several results), and ``backend`` makes a meta array of that spec; nothing is
computed and no result storage is allocated, whatever the shapes.

How a spec is found, by kind of operation:

- a ufunc, any method (``__call__``, ``reduce``, ``accumulate``, ``reduceat``, ``outer``): the
  shape from broadcasting, the reduction rule or the generalized ufunc's signature (``matmul``
  is one); the dtype by running the same call on stand-ins, arrays of the same dtypes and
  numbers of dimensions whose every dimension is 1 (NumPy's dtype rules look at dtypes and at
  Python scalars, never at an array's values or sizes, so the stand-ins get its dtype);
- a NumPy function: a rule of its own (:data:`FUNCTION_RULES`), or, for the functions NumPy
  writes in Python over methods, ufuncs and other functions that keep a subclass
  (:data:`THROUGH`), NumPy's own code, whose every step lands back here;
- a view (``reshape``, ``transpose``, basic indexing): NumPy's view itself, which keeps the
  zero strides of a meta array and allocates nothing.

Results that depend on values (``nonzero``, ``unique``, a boolean mask held by a meta array)
raise ``NotImplementedError``, as torch's meta device does for them.
"""

from __future__ import annotations

import re
import warnings
from typing import Any, Callable, Dict, List, Tuple

import numpy as np
from numpy.lib.array_utils import normalize_axis_index, normalize_axis_tuple

Spec = Tuple[tuple, np.dtype]

__all__ = ["Spec", "NoValues", "ufunc_specs", "index_shape", "FUNCTION_RULES", "THROUGH",
           "VIEWS", "DATA_DEPENDENT", "data_dependent", "function_rule"]


class NoValues(np.ndarray):
    """The arrays this module answers for: a shape and a dtype, no values (``backend``'s
    ``MetaArray`` is one)."""


def _is_array(a: Any) -> bool:
    return isinstance(a, np.ndarray)


def _arr(a: Any) -> Any:
    """``a`` as something with ``shape`` and ``dtype`` (lists become arrays; scalars stay)."""
    if isinstance(a, (list, tuple)):
        return np.asarray(a)
    return a


def standin(a: Any) -> Any:
    """An array of ``a``'s dtype and number of dimensions, each of size 1; scalars as they
    are (their dtype rules, weak or not, are kept)."""
    if _is_array(a):
        return np.ones((1,) * a.ndim, dtype=a.dtype)
    return a


def _shape(a: Any) -> tuple:
    return tuple(a.shape) if _is_array(a) else tuple(np.shape(a))


def _broadcast(*shapes: tuple) -> tuple:
    return tuple(np.broadcast_shapes(*shapes))


# --------------------------------------------------------------------------------------------
# ufuncs


def _parse_signature(sig: str) -> Tuple[List[tuple], List[tuple]]:
    ins, outs = sig.replace(" ", "").split("->")

    def groups(s: str) -> List[tuple]:
        return [tuple(d for d in g.split(",") if d) for g in re.findall(r"\(([^)]*)\)", s)]

    return groups(ins), groups(outs)


def _gufunc_shapes(uf: Any, arrays: list, kw: dict) -> List[tuple]:
    """Output shapes of generalized ufunc ``uf`` (``matmul``, ``vecdot``...) on ``arrays``."""
    if kw.get("axes") is not None or kw.get("axis") is not None:
        raise NotImplementedError(
            f"{uf.__name__}(axes=...) on a meta tensor: move the axes first (moveaxis)")
    ins, outs = _parse_signature(uf.signature)
    sizes: Dict[str, int] = {}
    missing: set = set()
    loops = []
    for i, (a, core) in enumerate(zip(arrays, ins)):
        shp = _shape(a)
        present = list(core)
        short = len(core) - len(shp)
        if short > 0:
            optional = [d for d in core if d.endswith("?")]
            if short > len(optional):
                raise ValueError(
                    f"{uf.__name__}: Input operand {i} does not have enough dimensions (has "
                    f"{len(shp)}, gufunc core with signature {uf.signature} requires "
                    f"{len(core)})")
            missing.update(optional[:short])
            present = [d for d in core if d not in optional[:short]]
        core_sizes = shp[len(shp) - len(present):] if present else ()
        loops.append(shp[:len(shp) - len(present)])
        for j, (name, n) in enumerate(zip(present, core_sizes)):
            key = name.rstrip("?")
            if key.isdigit() and int(key) != n or sizes.setdefault(key, n) != n:
                raise ValueError(
                    f"{uf.__name__}: Input operand {i} has a mismatch in its core dimension "
                    f"{j}, with gufunc signature {uf.signature} (size {n} is different from "
                    f"{sizes.get(key, key)})")
    loop = _broadcast(*loops)
    return [loop + tuple(sizes[d.rstrip("?")] for d in core if d not in missing)
            for core in outs]


def _reduce_shape(uf: Any, a: Any, kw: dict, default_axis: Any = 0) -> tuple:
    shp = _shape(a)
    axis = kw.get("axis", default_axis)
    axes = tuple(range(len(shp))) if axis is None else normalize_axis_tuple(axis, len(shp))
    if (uf is not None and uf.identity is None and "initial" not in kw
            and any(shp[i] == 0 for i in axes)):
        raise ValueError(
            f"zero-size array to reduction operation {uf.__name__} which has no identity")
    if kw.get("keepdims", False):
        return tuple(1 if i in axes else n for i, n in enumerate(shp))
    return tuple(n for i, n in enumerate(shp) if i not in axes)


def _dtype_key(v: Any) -> Any:
    """What of an operand NumPy's dtype rules look at: an array's dtype and number of
    dimensions, a Python number's type (an int's value where it may not fit a small
    integer dtype), anything else as it is."""
    if isinstance(v, np.ndarray):
        return ("a", v.dtype, v.ndim)
    if isinstance(v, np.generic):
        return ("g", v.dtype)
    if isinstance(v, (bool, float, complex)):
        return ("s", type(v))
    if isinstance(v, int):
        return ("i", v if v < 0 or v > 127 else None)
    if isinstance(v, tuple):
        return tuple(_dtype_key(x) for x in v)
    return v


_DTYPES_SEEN: Dict[Any, List[np.dtype]] = {}  # call key -> result dtypes (bounded below)


def _ufunc_dtypes(uf: Any, method: str, inputs: list, kw: dict) -> List[np.dtype]:
    """The result dtypes of the call, from the same call on stand-ins (remembered by what
    the dtype rules look at: LSTM steps and the like repeat a few calls many times)."""
    try:
        key = (uf, method, _dtype_key(tuple(inputs)), tuple(sorted(  # axis etc. by value
            (k, _dtype_key(v) if isinstance(v, (np.ndarray, tuple)) else v)
            for k, v in kw.items())))
        hash(key)
    except TypeError:  # an unhashable argument: worked out afresh
        return _ufunc_dtypes_now(uf, method, inputs, kw)
    got = _DTYPES_SEEN.get(key)
    if got is None:
        got = _ufunc_dtypes_now(uf, method, inputs, kw)
        if len(_DTYPES_SEEN) > 4096:
            _DTYPES_SEEN.clear()
        _DTYPES_SEEN[key] = got
    return got


def _ufunc_dtypes_now(uf: Any, method: str, inputs: list, kw: dict) -> List[np.dtype]:
    small = {k: (tuple(standin(o) for o in v) if k == "out" else standin(v))
             for k, v in kw.items()}
    args = [standin(a) for a in inputs]
    if method == "reduceat":  # the same dtype as a reduction
        method, args = "reduce", args[:1]
        small.pop("out", None)
    with np.errstate(all="ignore"):
        r = getattr(uf, method)(*args, **small)
    rs = r if isinstance(r, tuple) else (r,)
    return [np.asarray(x).dtype if not _is_array(x) else x.dtype for x in rs]


def ufunc_specs(uf: Any, method: str, inputs: tuple, kwargs: dict) -> List[Spec]:
    """The spec of each output of ``uf.method(*inputs, **kwargs)`` (``at``: none).

    Raises:
        ValueError: the shapes do not fit together (as NumPy would say for real arrays).
    """
    if method == "at":
        a, idx = inputs[0], inputs[1]
        target = index_shape(_shape(a), idx if isinstance(idx, tuple) else (idx,))
        if len(inputs) > 2:
            _check_fits(_shape(_arr(inputs[2])), target, "at")
        return []
    inputs = [_arr(a) for a in inputs]
    kw = dict(kwargs)
    out = kw.get("out") or ()
    dtypes = _ufunc_dtypes(uf, method, inputs, kw)
    if method == "__call__":
        if uf.signature:
            shapes = _gufunc_shapes(uf, inputs, kw)
        else:
            where = kw.get("where", True)
            shapes = [_broadcast(*[_shape(a) for a in inputs], _shape(where))] * uf.nout
    elif method == "reduce":
        shapes = [_reduce_shape(uf, inputs[0], kw)]
    elif method == "accumulate":
        shapes = [_shape(inputs[0])]
    elif method == "reduceat":
        shp = list(_shape(inputs[0]))
        shp[normalize_axis_index(kw.get("axis", 0), len(shp))] = len(np.atleast_1d(inputs[1]))
        shapes = [tuple(shp)]
    elif method == "outer":
        shapes = [_shape(inputs[0]) + _shape(inputs[1])] * uf.nout
    else:
        raise NotImplementedError(f"ufunc method {method!r} on a meta tensor")
    for i, o in enumerate(out):
        if o is None:
            continue
        if method == "__call__" and not uf.signature:
            _check_fits(shapes[i], _shape(o), uf.__name__)
        elif _shape(o) != shapes[i]:
            raise ValueError(f"{uf.__name__}.{method}: output operand has shape "
                             f"{_shape(o)}, the result's is {shapes[i]}")
        shapes[i] = _shape(o)
    return list(zip(shapes, dtypes))


def _check_fits(shape: tuple, target: tuple, what: str) -> None:
    """``shape`` broadcasts to ``target`` (an output operand or an assignment's target)."""
    try:
        ok = _broadcast(shape, target) == tuple(target)
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(f"{what}: could not broadcast shape {tuple(shape)} into shape "
                         f"{tuple(target)}")


# --------------------------------------------------------------------------------------------
# indexing


def index_shape(shape: tuple, index: tuple) -> tuple:
    """The shape of ``a[index]`` for ``a`` of ``shape``, by NumPy's basic and advanced rules.

    Raises:
        NotImplementedError: a boolean mask held by a meta array (its count is a value).
        IndexError: too many indices, or an integer out of range.
    """
    items: list = []
    for it in index:
        it = _arr(it) if isinstance(it, list) else it
        if _is_array(it) and it.dtype == np.bool_:
            if isinstance(it, NoValues):
                data_dependent("indexing with a boolean mask")()
            if it.ndim:
                items.extend(("bool", n) for n in it.nonzero())
            else:
                items.append(("boolscalar", it))
        elif isinstance(it, (bool, np.bool_)):
            raise NotImplementedError("indexing a meta tensor with a Python bool")
        else:
            items.append(("", it))
    used = sum(1 for k, it in items if it is not None and it is not Ellipsis
               and k != "boolscalar")
    if used > len(shape):
        raise IndexError(f"too many indices for array: array is {len(shape)}-dimensional, "
                         f"but {used} were indexed")
    expanded: list = []
    for k, it in items:
        if it is Ellipsis:
            expanded.extend([("", slice(None))] * (len(shape) - used))
            used = len(shape)
        else:
            expanded.append((k, it))
    expanded.extend([("", slice(None))] * (len(shape) - used))
    return _index_walk(shape, expanded)


def _index_walk(shape: tuple, items: list) -> tuple:
    has_array = any(_is_array(it) and it.ndim > 0 or k == "bool" for k, it in items)
    out: list = []
    adv_shapes: list = []
    adv_pos: list = []
    dim = 0
    for _, it in items:
        if it is None:
            out.append(1)
            continue
        if isinstance(it, slice):
            out.append(len(range(*it.indices(shape[dim]))))
            dim += 1
            continue
        if not _is_array(it) and not isinstance(it, (int, np.integer)):
            it = np.asarray(it)
            if it.dtype.kind not in "iu":
                raise IndexError("only integers, slices (`:`), ellipsis (`...`), numpy.newaxis "
                                 "(`None`) and integer or boolean arrays are valid indices")
        if not _is_array(it) or it.ndim == 0:
            if not _is_array(it) and not -shape[dim] <= int(it) < shape[dim]:
                raise IndexError(f"index {int(it)} is out of bounds for axis {dim} with size "
                                 f"{shape[dim]}")
            if not has_array:
                dim += 1
                continue
        elif it.dtype.kind not in "iub":
            raise IndexError("arrays used as indices must be of integer (or boolean) type")
        adv_shapes.append(_shape(it))
        adv_pos.append(len(out))
        out.append(None)
        dim += 1
    if not adv_shapes:
        return tuple(out)
    adv = _broadcast(*adv_shapes)
    first = adv_pos[0]
    together = adv_pos == list(range(first, first + len(adv_pos)))
    rest = [n for n in out if n is not None]
    if together:
        return tuple(rest[:first]) + adv + tuple(rest[first:])
    return adv + tuple(rest)


# --------------------------------------------------------------------------------------------
# functions

Rule = Callable[..., Any]


def _dtype_of(a: Any) -> np.dtype:
    return a.dtype if _is_array(a) else np.asarray(a).dtype


def _like(a: Any, dtype: Any = None, order: Any = "K", subok: bool = True, shape: Any = None,
          **_: Any) -> Spec:
    shp = _shape(a) if shape is None else (
        (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(shape))
    return shp, np.dtype(dtype) if dtype is not None else _dtype_of(a)


def _full_like(a: Any, fill_value: Any, dtype: Any = None, **kw: Any) -> Spec:
    return _like(a, dtype, **kw)


def _same(a: Any, *args: Any, **kw: Any) -> Spec:
    return _shape(a), _dtype_of(a)


def _concatenate(arrays: Any, axis: Any = 0, out: Any = None, dtype: Any = None,
                 casting: str = "same_kind") -> Spec:
    arrays = [_arr(a) for a in arrays]
    if not arrays:
        raise ValueError("need at least one array to concatenate")
    if axis is None:
        shapes = [(int(np.prod(_shape(a))),) for a in arrays]
        axis = 0
    else:
        shapes = [_shape(a) for a in arrays]
    nd = len(shapes[0])
    if nd == 0:
        raise ValueError("zero-dimensional arrays cannot be concatenated")
    ax = normalize_axis_index(axis, nd)
    for i, s in enumerate(shapes):
        if len(s) != nd:
            raise ValueError(
                f"all the input array dimensions except for the concatenation axis must match "
                f"exactly, but along dimension 0, the array at index 0 has {nd} dimension(s) "
                f"and the array at index {i} has {len(s)} dimension(s)")
        for d in range(nd):
            if d != ax and s[d] != shapes[0][d]:
                raise ValueError(
                    f"all the input array dimensions except for the concatenation axis must "
                    f"match exactly, but along dimension {d}, the array at index 0 has size "
                    f"{shapes[0][d]} and the array at index {i} has size {s[d]}")
    shape = list(shapes[0])
    shape[ax] = sum(s[ax] for s in shapes)
    dt = np.concatenate([np.ones((1,) * nd, _dtype_of(a)) for a in arrays], axis=ax,
                        dtype=dtype, casting=casting).dtype
    return tuple(shape), (out.dtype if out is not None else dt)


def _where(cond: Any, *xy: Any) -> Spec:
    if not xy:
        raise NotImplementedError(
            "where(condition) on a meta tensor: the result's size depends on values")
    x, y = xy
    shape = _broadcast(_shape(cond), _shape(x), _shape(y))
    return shape, np.where(True, standin(_arr(x)), standin(_arr(y))).dtype


def _dot(a: Any, b: Any, out: Any = None) -> Spec:
    a, b = _arr(a), _arr(b)
    sa, sb = _shape(a), _shape(b)
    dt = np.dot(standin(a), standin(b)).dtype if sa and sb else np.result_type(a, b)
    if not sa or not sb:
        shape = sa or sb
    elif len(sb) == 1:
        _match(sa[-1], sb[0], sa, sb)
        shape = sa[:-1]
    else:
        _match(sa[-1], sb[-2], sa, sb)
        shape = sa[:-1] + sb[:-2] + sb[-1:]
    return shape, dt


def _match(n: int, m: int, sa: tuple, sb: tuple) -> None:
    if n != m:
        raise ValueError(f"shapes {sa} and {sb} not aligned: {n} (dim {len(sa) - 1}) != {m}")


def _vdot(a: Any, b: Any) -> Spec:
    if np.prod(_shape(a)) != np.prod(_shape(b)):
        raise ValueError("cannot reshape array: vdot's operands differ in size")
    return (), np.vdot(standin(_arr(a)).ravel(), standin(_arr(b)).ravel()).dtype


def _outer(a: Any, b: Any, out: Any = None) -> Spec:
    a, b = _arr(a), _arr(b)
    return ((int(np.prod(_shape(a))), int(np.prod(_shape(b)))),
            np.multiply(standin(a), standin(b)).dtype)


def _inner(a: Any, b: Any) -> Spec:
    sa, sb = _shape(_arr(a)), _shape(_arr(b))
    if sa and sb:
        _match(sa[-1], sb[-1], sa, sb)
    return sa[:-1] + sb[:-1], np.inner(standin(_arr(a)), standin(_arr(b))).dtype


def _einsum(*operands: Any, out: Any = None, dtype: Any = None, optimize: Any = False,
            **kw: Any) -> Spec:
    if not isinstance(operands[0], str):
        raise NotImplementedError("einsum's sublist form on a meta tensor: use subscripts")
    subs, arrays = operands[0].replace(" ", ""), [_arr(a) for a in operands[1:]]
    lhs, _, rhs = subs.partition("->")
    terms = lhs.split(",")
    sizes: Dict[str, int] = {}
    ell: list = []
    for t, a in zip(terms, arrays):
        shp = _shape(a)
        if "..." in t:
            head, tail = t.split("...")
            n_ell = len(shp) - len(head) - len(tail)
            ell.append(shp[len(head):len(head) + n_ell])
            named = list(zip(head, shp[:len(head)])) + list(zip(tail, shp[len(shp) - len(tail):]))
        else:
            if len(t) != len(shp):
                raise ValueError(f"einsum(): operand has {len(shp)} dimensions, subscripts "
                                 f"{t!r} name {len(t)}")
            named = list(zip(t, shp))
        for c, n in named:
            if sizes.setdefault(c, n) != n and 1 not in (n, sizes[c]):
                raise ValueError(f"einsum(): operands do not broadcast: {c!r} is {sizes[c]} "
                                 f"and {n}")
            sizes[c] = max(sizes[c], n) if 1 in (n, sizes[c]) else n
    eshape = _broadcast(*ell) if ell else ()
    if not _:
        letters = "".join(t.replace("...", "") for t in terms)
        rhs = ("..." if ell else "") + "".join(sorted(c for c in set(letters)
                                                      if letters.count(c) == 1))
    head, dots, tail = rhs.partition("...")
    shape = tuple(sizes[c] for c in head) + (eshape if dots else ()) + tuple(
        sizes[c] for c in tail)
    dt = np.result_type(*[_dtype_of(a) for a in arrays]) if dtype is None else np.dtype(dtype)
    return shape, dt


def _pad(array: Any, pad_width: Any, mode: str = "constant", **kw: Any) -> Spec:
    shp = _shape(array)
    pw = np.broadcast_to(np.asarray(pad_width, dtype=np.int64).reshape(-1, 2)
                         if np.ndim(pad_width) else np.asarray(pad_width), (len(shp), 2))
    return tuple(n + int(p[0]) + int(p[1]) for n, p in zip(shp, pw)), _dtype_of(array)


def _take(a: Any, indices: Any, axis: Any = None, out: Any = None, mode: str = "raise") -> Spec:
    shp, ish = _shape(a), _shape(_arr(indices))
    if axis is None:
        return ish, _dtype_of(a)
    ax = normalize_axis_index(axis, len(shp))
    return shp[:ax] + ish + shp[ax + 1:], _dtype_of(a)


def _repeat(a: Any, repeats: Any, axis: Any = None) -> Spec:
    shp = _shape(a)
    if isinstance(repeats, NoValues):
        data_dependent("repeat with repeats held by a meta tensor")()
    r = np.asarray(repeats)
    if axis is None:
        n = int(np.prod(shp))
        return ((int(r.sum()) if r.ndim and r.size > 1 else n * int(r)),), _dtype_of(a)
    ax = normalize_axis_index(axis, len(shp))
    k = int(r.sum()) if r.ndim and r.size > 1 else shp[ax] * int(r)
    return shp[:ax] + (k,) + shp[ax + 1:], _dtype_of(a)


def _arg_reduce(a: Any, axis: Any = None, out: Any = None, *, keepdims: bool = False) -> Spec:
    shp = _shape(a)
    if axis is None:
        if not int(np.prod(shp)):
            raise ValueError("attempt to get argmax of an empty sequence")
        return ((1,) * len(shp) if keepdims else ()), np.dtype(np.intp)
    return _reduce_shape(None, a, {"axis": axis, "keepdims": keepdims}), np.dtype(np.intp)


def _argsort(a: Any, axis: Any = -1, **kw: Any) -> Spec:
    shp = _shape(a)
    return ((int(np.prod(shp)),) if axis is None else shp), np.dtype(np.intp)


def _sort(a: Any, axis: Any = -1, **kw: Any) -> Spec:
    shp = _shape(a)
    return ((int(np.prod(shp)),) if axis is None else shp), _dtype_of(a)


def _searchsorted(a: Any, v: Any, side: str = "left", sorter: Any = None) -> Spec:
    return _shape(_arr(v)), np.dtype(np.intp)


def _isin(element: Any, test_elements: Any, *args: Any, **kw: Any) -> Spec:
    return _shape(_arr(element)), np.dtype(np.bool_)


def _unravel_index(indices: Any, shape: Any, order: str = "C") -> list:
    shp = _shape(_arr(indices))
    n = 1 if isinstance(shape, (int, np.integer)) else len(shape)
    return [(shp, np.dtype(np.intp))] * n


def _ravel_multi_index(multi_index: Any, dims: Any, mode: str = "raise", order: str = "C"
                       ) -> Spec:
    return _broadcast(*[_shape(_arr(m)) for m in multi_index]), np.dtype(np.intp)


def _sliding_window_view(x: Any, window_shape: Any, axis: Any = None, *,
                         subok: bool = False, writeable: bool = False) -> Spec:
    shp = list(_shape(x))
    ws = (window_shape,) if np.ndim(window_shape) == 0 else tuple(window_shape)
    axes = range(len(shp)) if axis is None else (
        (axis,) if np.ndim(axis) == 0 else tuple(axis))
    for ax, w in zip(axes, ws):
        ax = normalize_axis_index(ax, len(shp))
        if shp[ax] < w:
            raise ValueError("window shape cannot be larger than input array shape")
        shp[ax] = shp[ax] - w + 1
    return tuple(shp) + tuple(ws), _dtype_of(x)


def _copyto(dst: Any, src: Any, casting: str = "same_kind", where: Any = True) -> list:
    _check_fits(_shape(_arr(src)), _shape(dst), "copyto")
    if not np.can_cast(_dtype_of(src), dst.dtype, casting) and not np.isscalar(src):
        raise TypeError(f"Cannot cast array data from {_dtype_of(src)!r} to {dst.dtype!r} "
                        f"according to the rule {casting!r}")
    return []


def _put_along_axis(arr: Any, indices: Any, values: Any, axis: Any) -> list:
    return []


def _reduction(name: str) -> Rule:
    uf = {"median": None, "quantile": None, "percentile": None}[name]

    def rule(a: Any, *args: Any, axis: Any = None, keepdims: bool = False, **kw: Any) -> Spec:
        q = args[0] if args else kw.get("q")
        shp = _reduce_shape(uf, a, {"axis": axis, "keepdims": keepdims}, None)
        if q is not None:
            shp = _shape(np.asarray(q)) + shp
        dt = _dtype_of(a)
        return shp, (dt if dt.kind in "fc" else np.dtype(np.float64))

    return rule


def _tri(which: str) -> Rule:
    def rule(m: Any, k: int = 0) -> Spec:
        if len(_shape(m)) < 2:
            raise ValueError(f"{which}: input must be at least 2-d")
        return _shape(m), _dtype_of(m)

    return rule


def _diff(a: Any, n: int = 1, axis: int = -1, **kw: Any) -> Spec:
    shp = list(_shape(a))
    ax = normalize_axis_index(axis, len(shp))
    shp[ax] = max(shp[ax] - n, 0)
    return tuple(shp), (np.dtype(np.bool_) if _dtype_of(a) == np.bool_ else _dtype_of(a))


def _trace(a: Any, offset: int = 0, axis1: int = 0, axis2: int = 1, dtype: Any = None,
           out: Any = None) -> Spec:
    shp = _shape(a)
    a1, a2 = normalize_axis_index(axis1, len(shp)), normalize_axis_index(axis2, len(shp))
    rest = tuple(n for i, n in enumerate(shp) if i not in (a1, a2))
    return rest, np.trace(standin(a), dtype=dtype).dtype if dtype else np.add.reduce(
        standin(a).ravel()).dtype


def _scan(name: str) -> Rule:
    """``cumsum``/``cumprod``: the input's shape (flat without an axis); the dtype NumPy's
    scan gives (int32 sums widen to int64)."""

    def rule(a: Any, axis: Any = None, dtype: Any = None, out: Any = None) -> Spec:
        shp = _shape(a)
        if axis is not None:
            normalize_axis_index(axis, len(shp))
        small = standin(_arr(a))
        dt = getattr(np, name)(small.reshape(-1), dtype=dtype).dtype
        return ((int(np.prod(shp)),) if axis is None else shp), dt

    return rule


def _nan_reduction(name: str) -> Rule:
    """``nansum``, ``nanmean``, ``nanmax``...: a reduction's shape, NumPy's dtype for it."""

    def rule(a: Any, axis: Any = None, *args: Any, keepdims: Any = False, **kw: Any) -> Spec:
        shp = _reduce_shape(None, a, {"axis": axis, "keepdims": keepdims is True}, None)
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dt = np.asarray(getattr(np, name)(standin(_arr(a)), axis, *args, **kw)).dtype
        return shp, dt

    return rule


def _tensordot(a: Any, b: Any, axes: Any = 2) -> Spec:
    sa, sb = _shape(_arr(a)), _shape(_arr(b))
    if isinstance(axes, (int, np.integer)):
        ia, ib = list(range(len(sa) - axes, len(sa))), list(range(axes))
    else:
        ia, ib = ([x] if np.ndim(x) == 0 else list(x) for x in axes)
    ia = [normalize_axis_index(i, len(sa)) for i in ia]
    ib = [normalize_axis_index(i, len(sb)) for i in ib]
    if [sa[i] for i in ia] != [sb[i] for i in ib]:
        raise ValueError("shape-mismatch for sum")
    shape = tuple(n for i, n in enumerate(sa) if i not in ia) + tuple(
        n for i, n in enumerate(sb) if i not in ib)
    return shape, np.dot(standin(_arr(a)).reshape(1, -1), standin(_arr(b)).reshape(-1, 1)).dtype


def _cross(a: Any, b: Any, axisa: int = -1, axisb: int = -1, axisc: int = -1,
           axis: Any = None) -> Spec:
    sa, sb = _shape(_arr(a)), _shape(_arr(b))
    if axis is not None or (axisa, axisb, axisc) != (-1, -1, -1):
        raise NotImplementedError("cross with axes on a meta tensor: move the axis last first")
    if sa[-1] not in (2, 3) or sb[-1] not in (2, 3):
        raise ValueError("incompatible dimensions for cross product (dimension must be 2 or 3)")
    rest = _broadcast(sa[:-1], sb[:-1])
    dt = np.multiply(standin(_arr(a)), standin(_arr(b))).dtype
    return (rest if sa[-1] == sb[-1] == 2 else rest + (3,)), dt


def _diag(v: Any, k: int = 0) -> Spec:
    shp = _shape(v)
    if len(shp) == 1:
        n = shp[0] + abs(k)
        return (n, n), _dtype_of(v)
    if len(shp) != 2:
        raise ValueError("Input must be 1- or 2-d.")
    rows, cols = shp
    n = max(0, min(rows, cols - k) if k >= 0 else min(rows + k, cols))
    return (n,), _dtype_of(v)


def _block(arrays: Any) -> Spec:
    def depth(x: Any) -> int:
        return 1 + depth(x[0]) if isinstance(x, list) else 0

    def leaves(x: Any) -> list:
        return [y for z in x for y in leaves(z)] if isinstance(x, list) else [_arr(x)]

    d = depth(arrays)
    nd = max([d] + [len(_shape(a)) for a in leaves(arrays)])

    def join(x: Any, level: int) -> Spec:
        if not isinstance(x, list):
            shp = _shape(_arr(x))
            return (1,) * (nd - len(shp)) + shp, _dtype_of(x)
        parts = [join(y, level + 1) for y in x]  # stand-ins of those shapes, no memory
        return _concatenate([np.broadcast_to(np.zeros((), dt), s) for s, dt in parts],
                            axis=-(d - level))

    return join(arrays, 0)


def _bincount(x: Any, weights: Any = None, minlength: int = 0) -> Spec:
    """``bincount`` with ``minlength``: ``(minlength,)``, taking the indices below it (as the
    ops' own scatters by bincount are, their sizes set by construction); without one the
    length is a value, and it refuses."""
    if not minlength:
        data_dependent("bincount without minlength")()
    return (int(minlength),), np.dtype(np.float64 if weights is not None else np.intp)


def _elementwise_bool(a: Any, *args: Any, **kw: Any) -> Spec:
    return _shape(_arr(a)), np.dtype(np.bool_)


def _convolve(a: Any, v: Any, mode: str = "full") -> Spec:
    n, m = int(np.prod(_shape(a))), int(np.prod(_shape(v)))
    size = {"full": n + m - 1, "same": max(n, m), "valid": max(n, m) - min(n, m) + 1}[mode]
    return (size,), np.result_type(_dtype_of(a), _dtype_of(v))


def _float_of(a: Any) -> np.dtype:
    """The dtype NumPy's linear algebra computes ``a`` in."""
    dt = _dtype_of(a)
    return dt if dt.kind in "fc" and dt.itemsize >= 4 else np.dtype(np.float64)


def _real_of(dt: np.dtype) -> np.dtype:
    return np.empty(0, dt).real.dtype


def _square(a: Any) -> tuple:
    shp = _shape(a)
    if len(shp) < 2 or shp[-1] != shp[-2]:
        raise np.linalg.LinAlgError("Last 2 dimensions of the array must be square")
    return shp


def _la_inv(a: Any) -> Spec:
    return _square(a), _float_of(a)


def _la_det(a: Any) -> Spec:
    return _square(a)[:-2], _float_of(a)


def _la_slogdet(a: Any) -> list:
    s = _square(a)[:-2]
    return [(s, _float_of(a)), (s, _real_of(_float_of(a)))]


def _la_solve(a: Any, b: Any) -> Spec:
    sa, sb = _square(a), _shape(b)
    dt = np.result_type(_float_of(a), _float_of(b))
    if len(sb) == 1:
        return sa[:-1], dt
    return _broadcast(sa[:-2], sb[:-2]) + sb[-2:], dt


def _la_eigh(a: Any, UPLO: str = "L") -> list:  # noqa: N803 - NumPy's name
    s = _square(a)
    return [(s[:-1], _real_of(_float_of(a))), (s, _float_of(a))]


def _la_eigvalsh(a: Any, UPLO: str = "L") -> Spec:  # noqa: N803 - NumPy's name
    return _square(a)[:-1], _real_of(_float_of(a))


def _la_cholesky(a: Any, upper: bool = False) -> Spec:
    return _square(a), _float_of(a)


def _la_qr(a: Any, mode: str = "reduced") -> list:
    s = _shape(a)
    m, n = s[-2:]
    k = min(m, n)
    dt = _float_of(a)
    if mode == "r":
        return [(s[:-2] + (k, n), dt)]
    rows = m if mode == "complete" else k
    return [(s[:-2] + (m, rows), dt), (s[:-2] + (rows, n), dt)]


def _la_svd(a: Any, full_matrices: bool = True, compute_uv: bool = True,
            hermitian: bool = False) -> Any:
    s = _shape(a)
    m, n = s[-2:]
    k = min(m, n)
    dt = _float_of(a)
    sv = (s[:-2] + (k,), _real_of(dt))
    if not compute_uv:
        return sv
    um, vn = (m, n) if full_matrices else (k, k)
    return [(s[:-2] + (m, um), dt), sv, (s[:-2] + (vn, n), dt)]


def _la_norm(x: Any, ord: Any = None, axis: Any = None, keepdims: bool = False) -> Spec:  # noqa: A002
    shp = _shape(x)
    dt = _real_of(_float_of(x))
    if axis is None and ord is None:
        return ((1,) * len(shp) if keepdims else ()), dt
    if axis is None:
        axis = tuple(range(len(shp)))
    return _reduce_shape(None, x, {"axis": axis, "keepdims": keepdims}), dt


def _la_pinv(a: Any, *args: Any, **kw: Any) -> Spec:
    s = _shape(a)
    return s[:-2] + (s[-1], s[-2]), _float_of(a)


def _la_matrix_power(a: Any, n: int) -> Spec:
    return _square(a), _dtype_of(a) if n >= 0 else _float_of(a)


def _la_eig(a: Any) -> list:
    s = _square(a)
    dt = np.result_type(_float_of(a), np.complex64)
    return [(s[:-1], dt), (s, dt)]


def _la_eigvals(a: Any) -> Spec:
    return _square(a)[:-1], np.result_type(_float_of(a), np.complex64)


_LINALG = {np.linalg.inv: _la_inv, np.linalg.det: _la_det, np.linalg.slogdet: _la_slogdet,
           np.linalg.solve: _la_solve, np.linalg.eigh: _la_eigh,
           np.linalg.eigvalsh: _la_eigvalsh, np.linalg.cholesky: _la_cholesky,
           np.linalg.qr: _la_qr, np.linalg.svd: _la_svd, np.linalg.norm: _la_norm,
           np.linalg.pinv: _la_pinv, np.linalg.matrix_power: _la_matrix_power,
           np.linalg.eig: _la_eig, np.linalg.eigvals: _la_eigvals}


def _fft_axes(shp: tuple, s: Any, axes: Any) -> Tuple[tuple, list]:
    """NumPy's ``(s, axes)`` defaults of an n-D transform: the lengths (None: the input's)."""
    if axes is None:
        axes = range(len(shp)) if s is None else range(len(shp) - len(s), len(shp))
    axes = tuple(normalize_axis_index(a, len(shp)) for a in axes)
    lengths = [None] * len(axes) if s is None else [None if n == -1 else int(n) for n in s]
    return axes, lengths


def _fft_rule(kind: str, ndims: Any) -> Rule:
    """The spec of a NumPy FFT: ``kind`` "c2c" (fft, ifft...), "r2c" (rfft, ihfft: the last
    axis halved, plus one) or "c2r" (irfft, hfft: the last axis 2 (m - 1) by default);
    ``ndims`` 1 (``n``, ``axis``), 2 (``s``, ``axes=(-2, -1)``) or None (n-D)."""

    def rule(a: Any, *args: Any, **kw: Any) -> Spec:
        names = ("n", "axis", "norm", "out") if ndims == 1 else ("s", "axes", "norm", "out")
        kw.update(zip(names, args))
        shp = _shape(_arr(a))
        if ndims == 1:
            n = kw.get("n")
            axes, lengths = _fft_axes(shp, None if n is None else (n,), (kw.get("axis", -1),))
        else:
            axes, lengths = _fft_axes(shp, kw.get("s"), kw.get("axes", (-2, -1) if ndims == 2
                                                             else None))
        out = list(shp)
        for i, (ax, n) in enumerate(zip(axes, lengths)):
            last = i == len(axes) - 1
            if kind == "c2r" and last:
                out[ax] = 2 * (shp[ax] - 1) if n is None else n
            else:
                n = shp[ax] if n is None else n
                out[ax] = n // 2 + 1 if kind == "r2c" and last else n
        probe = (np.fft.irfft if kind == "c2r" else np.fft.fft)(np.ones(2, _dtype_of(a)))
        return tuple(out), probe.dtype

    return rule


def _fft_rules() -> Dict[Any, Rule]:
    f = np.fft
    kinds = {"c2c": ("fft", "ifft"), "r2c": ("rfft", "ihfft"), "c2r": ("irfft", "hfft")}
    rules: Dict[Any, Rule] = {}
    for kind, names in kinds.items():
        for name in names:
            rules[getattr(f, name)] = _fft_rule(kind, 1)
    for kind, names in {"c2c": ("fft2", "ifft2", "fftn", "ifftn"), "r2c": ("rfft2", "rfftn"),
                        "c2r": ("irfft2", "irfftn")}.items():
        for name in names:
            rules[getattr(f, name)] = _fft_rule(kind, 2 if name.endswith("2") else None)
    return rules


def data_dependent(name: str) -> Rule:
    """A rule (or method) that refuses: ``name``'s result shape depends on values."""

    def rule(*args: Any, **kw: Any) -> Any:
        raise NotImplementedError(
            f"{name} on a meta tensor: the result's shape depends on values, which a meta "
            f"tensor has none of")

    return rule


DATA_DEPENDENT = ("nonzero", "flatnonzero", "argwhere", "unique", "unique_values",
                  "unique_counts", "unique_inverse", "unique_all", "histogram",
                  "extract", "compress", "trim_zeros", "allclose", "array_equal",
                  "array_equiv", "isclose", "array2string", "array_repr", "array_str",
                  "save", "savez", "savetxt", "tofile")

#: NumPy functions given a rule here, by the function object.
FUNCTION_RULES: Dict[Any, Rule] = {
    np.empty_like: _like, np.zeros_like: _like, np.ones_like: _like, np.full_like: _full_like,
    np.copy: _same, np.nan_to_num: _same, np.concatenate: _concatenate, np.where: _where,
    np.dot: _dot, np.vdot: _vdot, np.outer: _outer, np.inner: _inner, np.einsum: _einsum,
    np.pad: _pad, np.take: _take, np.repeat: _repeat, np.argmax: _arg_reduce,
    np.argmin: _arg_reduce, np.argsort: _argsort, np.sort: _sort, np.searchsorted: _searchsorted,
    np.isin: _isin, np.unravel_index: _unravel_index, np.ravel_multi_index: _ravel_multi_index,
    np.lib.stride_tricks.sliding_window_view: _sliding_window_view, np.copyto: _copyto,
    np.put_along_axis: _put_along_axis, np.median: _reduction("median"),
    np.quantile: _reduction("quantile"), np.percentile: _reduction("percentile"),
    np.tril: _tri("tril"), np.triu: _tri("triu"), np.diff: _diff, np.trace: _trace,
    np.convolve: _convolve, np.real_if_close: _same, np.fix: _same, np.roll: _same,
    np.cumsum: _scan("cumsum"), np.cumprod: _scan("cumprod"), np.tensordot: _tensordot,
    np.cross: _cross, np.diag: _diag, np.block: _block, np.iscomplex: _elementwise_bool,
    np.isreal: _elementwise_bool, np.fft.fftshift: _same, np.fft.ifftshift: _same,
    np.bincount: _bincount,
    **{getattr(np, n): _nan_reduction(n) for n in ("nansum", "nanprod", "nanmean", "nanmax",
                                                   "nanmin", "nanstd", "nanvar")},
    **_LINALG,
    **_fft_rules(),
    **{getattr(np, n): data_dependent(n) for n in DATA_DEPENDENT if hasattr(np, n)},
}

#: NumPy's functions written over methods, ufuncs and functions that all keep a meta array
#: meta (each step comes back here): NumPy's own code runs on the meta arrays.
THROUGH = frozenset(getattr(np, n) for n in (
    "sum", "prod", "mean", "std", "var", "max", "min", "amax", "amin", "all", "any", "clip",
    "round", "around", "stack", "hstack", "vstack", "dstack", "column_stack",
    "take_along_axis", "meshgrid", "tile", "kron", "average", "squeeze", "cumulative_sum",
    "cumulative_prod", "unstack", "matrix_transpose", "permute_dims", "angle")
    if hasattr(np, n))

#: NumPy's functions that give a view (or only read the shape or dtype): NumPy's own code,
#: which keeps a meta array's zero strides, runs on it.
VIEWS = frozenset(getattr(np, n) for n in (
    "reshape", "transpose", "swapaxes", "moveaxis", "rollaxis", "expand_dims", "squeeze",
    "broadcast_to", "broadcast_arrays", "atleast_1d", "atleast_2d", "atleast_3d", "shape",
    "ndim", "size", "result_type", "flip", "fliplr", "flipud", "rot90", "diagonal", "split",
    "array_split", "hsplit", "vsplit", "dsplit", "real", "imag", "may_share_memory",
    "shares_memory", "iscomplexobj", "isrealobj", "can_cast", "min_scalar_type", "ravel",
    "common_type") if hasattr(np, n))


def function_rule(func: Any) -> Any:
    """The rule for NumPy function ``func``, or None where there is none."""
    return FUNCTION_RULES.get(func)
