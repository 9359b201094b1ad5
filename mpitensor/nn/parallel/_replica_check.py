"""DDP's cross-rank checks: do the replicas hold the same buckets, and the same values?

Two collective checks of :class:`~mpitensor.nn.parallel.DistributedDataParallel`, apart from
the module because they are about *comparing ranks*, not about training:

- :func:`check_layout`: every rank built the same gradient buckets (at construction, and in
  debug mode at every synchronising forward), so that the bucket all-reduces match;
- :func:`verify_replicas`: every rank holds the same parameters and buffers (hashes first,
  then an element-wise comparison with group rank 0's copy of those that differ).

Both raise the same error on every rank, with each rank's side of the story.
"""

from __future__ import annotations

import hashlib
from typing import Any, List, Sequence

import numpy as np

from mpitensor import backend as _backend
from mpitensor import distributed as dist
from mpitensor.distributed import ProcessGroup
from mpitensor.errors import CollectiveMismatchError, ReplicaDivergenceError

__all__ = ["check_layout", "verify_replicas"]

_VERIFY = "DistributedDataParallel.verify_in_sync"


def _describe_layout(buckets: Sequence[tuple], limit: int = 8) -> str:
    total = sum(n for n, _ in buckets)
    shown = ", ".join(f"{n} {dt}" for n, dt in buckets[:limit])
    more = f", ... (+{len(buckets) - limit} more)" if len(buckets) > limit else ""
    return f"{len(buckets)} bucket(s) of [{shown}{more}] elements ({total} in all)"


def _fingerprint(arr: Any) -> bytes:
    """An 8-byte digest of an array's bytes (host copy for device arrays)."""
    host = np.ascontiguousarray(_backend.to_numpy(arr))
    return hashlib.blake2b(host.reshape(-1).view(np.uint8), digest_size=8).digest()


def _compare(x: Any, ref: Any, atol: float, rtol: float) -> tuple:
    """``(count, max |x - ref|, index, x there, ref there)`` over the elements beyond tolerance.

    An element is within tolerance when ``|x - ref| <= atol + rtol * |ref|``, when both are
    equal (infinities included) or when both are NaN. ``count`` is 0 when all are.
    """
    xp = _backend.array_module(x)
    wide = np.complex128 if x.dtype.kind == "c" else np.float64
    a = x.astype(wide).reshape(-1)
    b = ref.astype(wide).reshape(-1)
    d = xp.abs(a - b)
    ok = (d <= atol + rtol * xp.abs(b)) | (a == b)
    if x.dtype.kind in "fc":
        ok |= xp.isnan(a) & xp.isnan(b)
    bad = ~ok
    count = int(bad.sum())
    if count == 0:
        return (0, 0.0, None, None, None)
    score = xp.where(bad, xp.where(xp.isnan(d), xp.inf, d), -1.0)
    k = int(score.argmax())
    index = tuple(int(i) for i in np.unravel_index(k, x.shape)) if x.ndim else ()
    return (count, float(d[k]), index, a[k].item(), b[k].item())


def _fmt(v: Any) -> str:
    return f"{v:.6g}" if isinstance(v, float) else str(v)


def check_foreign(pg: ProcessGroup, everyone: List[Any], op: str) -> None:
    """Raise where some rank entered another collective instead of this DDP check."""
    bad = [(pg.ranks[r], e) for r, e in enumerate(everyone)
           if not (isinstance(e, dict) and e.get("ddp") == op)]
    if not bad:
        return
    lines = []
    for r, e in enumerate(everyone):
        what = e.get("op") if isinstance(e, dict) else type(e).__name__
        seq = e.get("seq") if isinstance(e, dict) else None
        lines.append(f"  rank {pg.ranks[r]}: {what}" + (f" (#{seq})" if seq else ""))
    raise CollectiveMismatchError(
        f"rank {dist.get_rank()}: {op} on {pg.name}: the ranks are in different "
        "collectives:\n" + "\n".join(lines) +
        "\nEvery rank must make the same calls in the same order (the same DDP forwards "
        "and backwards, the same checks).")


# ------------------------------------------------------------------------ bucket layouts
def check_layout(pg: ProcessGroup, when: str, layout: List[tuple],
                 params: Sequence[Any] = (), names: Sequence[str] = ()) -> None:
    """Check that every rank has the same bucket ``layout`` (and, at construction, the same
    ``params``: shapes and dtypes, named by ``names``).

    Raises ``CollectiveMismatchError`` on every rank, listing each rank's layout.
    """
    op = f"DistributedDataParallel {when} check"
    mine: dict = {"op": op, "error": None, "ddp": op, "buckets": layout}
    if when == "construction":
        mine["params"] = [(tuple(p._data.shape), p._data.dtype.name) for p in params]
        mine["names"] = list(names)
    everyone: list = [None] * pg.size_
    dist.all_gather_object(everyone, mine, group=pg)
    check_foreign(pg, everyone, op)
    ref = everyone[0]
    differ = [r for r, e in enumerate(everyone)
              if e["buckets"] != ref["buckets"] or e.get("params") != ref.get("params")]
    if not differ:
        return
    lines = [f"  rank {pg.ranks[r]}: {_describe_layout(e['buckets'])}"
             for r, e in enumerate(everyone)]
    raise CollectiveMismatchError(
        f"rank {dist.get_rank()}: DistributedDataParallel ({when} check) on {pg.name}: the "
        f"replicas' gradient buckets differ across ranks "
        f"({_first_layout_difference(pg, everyone[differ[0]], ref, differ[0])}):\n" +
        "\n".join(lines) +
        "\nBuild the same model (same parameters, shapes and dtypes, in the same order) "
        "with the same bucket_cap_mb on every rank, and run forward/backward through the "
        "same DDP on every rank in the same order.")


def _first_layout_difference(pg: ProcessGroup, e: dict, ref: dict, r: int) -> str:
    """How group rank ``r``'s parameters or buckets (``e``) first differ from rank 0's."""
    g, r0 = pg.ranks[r], pg.ranks[0]
    mp, rp = e.get("params"), ref.get("params")
    if mp is not None and mp != rp:
        if len(mp) != len(rp):
            return f"rank {g} has {len(mp)} parameters that require grad, rank {r0} has {len(rp)}"
        i = next(k for k in range(len(rp)) if mp[k] != rp[k])
        return (f"parameter {i} ({e['names'][i]}) is {mp[i][0]} {mp[i][1]} on "
                f"rank {g} but {rp[i][0]} {rp[i][1]} on rank {r0}")
    mb, rb = e["buckets"], ref["buckets"]
    if len(mb) != len(rb):
        return f"rank {g} has {len(mb)} buckets, rank {r0} has {len(rb)}"
    i = next(k for k in range(len(rb)) if mb[k] != rb[k])
    return (f"bucket {i} holds {mb[i][0]} {mb[i][1]} elements on rank {g} but "
            f"{rb[i][0]} {rb[i][1]} on rank {r0}")


# ------------------------------------------------------------------------ replica values
def verify_replicas(pg: ProcessGroup, src: int, tensors: List[tuple], atol: float,
                    rtol: float) -> None:
    """``DistributedDataParallel.verify_in_sync`` on ``tensors`` (``(kind, name, array)``),
    with group member ``src`` (group rank 0) as the reference; tolerances already checked."""
    meta = [(kind, name, tuple(a.shape), a.dtype.str) for kind, name, a in tensors]
    mine = {"op": _VERIFY, "error": None, "ddp": _VERIFY,
            "meta": hashlib.blake2b(repr(meta).encode(), digest_size=8).digest(),
            "hashes": [_fingerprint(a) for _, _, a in tensors]}
    everyone: list = [None] * pg.size_
    dist.all_gather_object(everyone, mine, group=pg)
    check_foreign(pg, everyone, _VERIFY)
    if any(e["meta"] != everyone[0]["meta"] for e in everyone):
        metas: list = [None] * pg.size_
        dist.all_gather_object(metas, meta, group=pg)
        raise _structure_error(pg, metas)
    differing = [i for i in range(len(tensors))
                 if any(e["hashes"][i] != everyone[0]["hashes"][i] for e in everyone)]
    if not differing:
        return
    diffs = _differences(pg, src, tensors, differing, everyone, float(atol), float(rtol))
    if diffs:  # else: hashes differ, but every difference is within the tolerance
        raise _divergence_error(pg, src, diffs, len(tensors), atol, rtol)


def _differences(pg: ProcessGroup, src: int, tensors: List[tuple], differing: List[int],
                 everyone: list, atol: float, rtol: float) -> List[dict]:
    """Compare the tensors whose hashes differ with group rank 0's copy, element-wise."""
    details = []
    for i in differing:
        arr = tensors[i][2]
        xp = _backend.array_module(arr)
        ref = xp.ascontiguousarray(arr) if pg.rank_ == 0 else xp.empty(arr.shape,
                                                                         dtype=arr.dtype)
        dist.broadcast(ref, src=src, group=pg)
        details.append(_compare(arr, ref, atol, rtol))
    per_rank: list = [None] * pg.size_
    dist.all_gather_object(per_rank, details, group=pg)
    diffs = []
    for k, i in enumerate(differing):
        kind, name, arr = tensors[i]
        rows = [(pg.ranks[r], per_rank[r][k]) for r in range(pg.size_)
                if per_rank[r][k][0]]
        if not rows:
            continue
        classes: dict = {}
        for r, e in enumerate(everyone):
            classes.setdefault(e["hashes"][i], []).append(pg.ranks[r])
        diffs.append({
            "kind": kind, "name": name, "shape": tuple(arr.shape), "dtype": arr.dtype.name,
            "ranks": [g for g, _ in rows],
            "max_abs_diff": max(d[1] for _, d in rows),
            "count": sum(d[0] for _, d in rows),
            "detail": {g: {"count": d[0], "max_abs_diff": d[1], "index": d[2],
                           "value": d[3], "reference": d[4]} for g, d in rows},
            "groups": sorted(classes.values()),
        })
    return diffs


def _divergence_error(pg: ProcessGroup, src: int, diffs: List[dict], n: int, atol: float,
                      rtol: float) -> ReplicaDivergenceError:
    lines = []
    for d in diffs[:20]:
        total = int(np.prod(d["shape"])) if d["shape"] else 1
        head = f"  {d['kind']} '{d['name']}' {d['shape']} {d['dtype']}:"
        parts = []
        for g, e in d["detail"].items():
            parts.append(
                f"rank {g}: {e['count']} of {total} element(s) differ, max |diff| "
                f"{_fmt(e['max_abs_diff'])} at index {e['index']} ({_fmt(e['value'])} on "
                f"rank {g}, {_fmt(e['reference'])} on rank {src})")
        lines.append(head + " " + "; ".join(parts))
        groups = d["groups"]
        if len(groups) == 2 and pg.size_ >= 3 and [src] in groups:
            others = next(gr for gr in groups if gr != [src])
            lines.append(f"    (ranks {others} agree with each other: rank {src} is the "
                         "odd one out)")
    if len(diffs) > 20:
        lines.append(f"  ... and {len(diffs) - 20} more")
    ranks = sorted({g for d in diffs for g in d["ranks"]})
    return ReplicaDivergenceError(
        f"rank {dist.get_rank()}: DistributedDataParallel.verify_in_sync: the replicas on "
        f"{pg.name} have drifted apart: {len(diffs)} of {n} tensor(s) differ from rank "
        f"{src}'s (group rank 0) beyond atol={atol:g}, rtol={rtol:g}; ranks that differ: "
        f"{ranks}\n" + "\n".join(lines) +
        "\nReplicas must stay identical: look for an update made on some ranks only (an "
        "optimizer step outside DDP, a parameter changed by hand, a buffer updated with "
        "broadcast_buffers=False, uneven steps without join()). Re-synchronise with "
        "mpitensor.nn.parallel.broadcast_parameters(ddp.module) or restore a checkpoint.",
        differences=diffs, ranks=ranks, reference_rank=src)


def _structure_error(pg: ProcessGroup, metas: List[list]) -> ReplicaDivergenceError:
    ref = metas[0]
    lines = []
    for r, m in enumerate(metas):
        if m == ref:
            continue
        g = pg.ranks[r]
        if len(m) != len(ref):
            lines.append(f"  rank {g} has {len(m)} parameters and buffers, rank "
                         f"{pg.ranks[0]} has {len(ref)}")
        for a, b in zip(m, ref):
            if a != b:
                lines.append(f"  rank {g}: {a[0]} '{a[1]}' {a[2]} {np.dtype(a[3]).name}; "
                             f"rank {pg.ranks[0]}: {b[0]} '{b[1]}' {b[2]} "
                             f"{np.dtype(b[3]).name}")
                break
    ranks = [pg.ranks[r] for r, m in enumerate(metas) if m != ref]
    return ReplicaDivergenceError(
        f"rank {dist.get_rank()}: DistributedDataParallel.verify_in_sync: the replicas on "
        f"{pg.name} differ in structure (names, shapes or dtypes of their parameters and "
        "buffers):\n" + "\n".join(lines) +
        "\nEvery rank must hold the same model; rebuild it the same way on every rank.",
        differences=[], ranks=ranks, reference_rank=pg.ranks[0])
