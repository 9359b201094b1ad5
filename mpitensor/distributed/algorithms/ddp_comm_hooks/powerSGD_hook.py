"""PowerSGD gradient compression (Vogels, Karimireddy and Jaggi, NeurIPS 2019) as DDP
communication hooks: :func:`powerSGD_hook` (per-tensor low-rank approximation) and
:func:`batched_powerSGD_hook` (the whole bucket as one square matrix).

One PowerSGD step on a gradient matrix ``M`` (``n x m``) with rank ``r``: ``P = M Q`` is summed
over the ranks and orthonormalized, ``Q = M^T P`` is summed and divided by the world size, and
the gradient becomes ``P Q^T``: only ``(n + m) r`` numbers travel instead of ``n m``. With
*error feedback*, what the approximation left out on this rank is added to the next step's
gradient; with *warm start*, ``Q`` carries over between steps (one power iteration per step).
Before ``start_powerSGD_iter`` iterations, the hooks average the bucket uncompressed.

Differences from torch: the random initial ``Q`` comes from mpitensor's generator (seeded from
``random_seed`` as torch's is), so runs are reproducible but do not repeat torch's numbers;
``batched_powerSGD_hook`` caps the rank at the padded matrix's side (torch fails there).
"""

from __future__ import annotations

import logging
import math
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from ...._ops import random as _random
from ....backend import array_module
from ....tensor import Tensor, _new
from ..._grad_bucket import GradBucket
from ..._work_future import WorkFuture
from .default_hooks import _allreduce_fut, _group

__all__ = ["PowerSGDState", "batched_powerSGD_hook", "powerSGD_hook"]

logger = logging.getLogger("mpitensor.distributed.algorithms")

_HALF = ("float16", "bfloat16")


def _orthogonalize(mats: Any, epsilon: float = 0.0) -> None:
    """Orthonormalize the columns of each matrix of the batch ``mats`` (``b x n x r``,
    ``r <= n``) in place: Gram-Schmidt for ``r <= 2`` and half precision, else QR."""
    rank = mats.shape[2]
    if rank <= 2 or mats.dtype.name in _HALF:
        _gram_schmidt(mats, epsilon)
        return
    xp = array_module(mats)
    q, _ = xp.linalg.qr(mats)
    mats[...] = q


def _gram_schmidt(mats: Any, epsilon: float) -> None:
    xp = array_module(mats)
    rank = mats.shape[2]
    for i in range(rank):
        col = mats[:, :, i:i + 1]
        norm = xp.sqrt(xp.sum(col * col, axis=1, keepdims=True))
        if epsilon == 0 and not bool((norm > 0).all()):
            logger.error("PowerSGD: a matrix to orthogonalize has a column of zeros; set "
                         "orthogonalization_epsilon (e.g. 1e-8) in PowerSGDState")
            col[...] = xp.where(norm > 0, col / xp.where(norm > 0, norm, 1), 0)
        else:
            col /= norm + epsilon
        if i + 1 < rank:
            rest = mats[:, :, i + 1:]
            rest -= xp.sum(col * rest, axis=1, keepdims=True) * col


def _should_compress(rows: int, cols: int, rank: int,
                     min_compression_rate: float) -> Tuple[bool, int, int]:
    """(worth compressing, elements uncompressed, elements compressed) of a ``rows x cols``
    matrix at ``rank``: worth it when the saving exceeds ``min_compression_rate``."""
    full = rows * cols
    low = (rows + cols) * rank
    return low * min_compression_rate < full, full, low


def _random_normal(shape: tuple, dtype: Any, gen: Any, like: Any) -> Any:
    """Standard normal numbers drawn on the CPU from ``gen``, as an array of ``dtype`` on
    ``like``'s device (half precision is drawn in float32 and rounded)."""
    draw_dt = np.float64 if dtype == np.float64 else np.float32
    arr = _random.randn(*shape, generator=gen, dtype=draw_dt)._data
    return array_module(like).asarray(arr).astype(dtype, copy=False)


def _generator(state: "PowerSGDState") -> Any:
    """A generator seeded from the state's seed stream (one draw of ``state.rng``)."""
    return _random.Generator().manual_seed(int(state.rng.randint(1_000_000_000)))


class PowerSGDState:
    """Hyperparameters and memory of PowerSGD, the ``state`` of :func:`powerSGD_hook` and
    :func:`batched_powerSGD_hook` (torch's arguments and attributes).

    Args:
        process_group: the group to average over (``None``: the default group).
        matrix_approximation_rank: the rank ``r`` of the approximation (1-4 is typical).
        start_powerSGD_iter: iterations of plain averaging before compression starts
            (must be > 1 with error feedback or warm start).
        min_compression_rate: a matrix is compressed only when ``n m`` exceeds
            ``(n + m) r`` times this; the others are averaged uncompressed.
        use_error_feedback: add each step's local approximation error to the next gradient.
        warm_start: reuse ``Q`` from the previous step instead of a fresh random one.
        orthogonalization_epsilon: added to the column norms (guards all-zero columns).
        random_seed: seeds the random initial ``Q``.
        compression_stats_logging_frequency: iterations between INFO logs of the statistics.
        batch_tensors_with_same_shape: compress equal-shaped gradients of a bucket together.

    Raises:
        ValueError: ``start_powerSGD_iter <= 1`` with error feedback or warm start, or a
            rank below 1.
    """

    __slots__ = ("process_group", "matrix_approximation_rank", "start_powerSGD_iter",
                 "min_compression_rate", "orthogonalization_epsilon", "use_error_feedback",
                 "warm_start", "batch_tensors_with_same_shape", "rng", "error_dict",
                 "p_memory_dict", "q_memory_dict", "iter", "total_numel_before_compression",
                 "total_numel_after_compression", "compression_stats_logging_frequency",
                 "next_stats_report")

    def __init__(self, process_group: Any, matrix_approximation_rank: int = 1,
                 start_powerSGD_iter: int = 1_000, min_compression_rate: float = 2,
                 use_error_feedback: bool = True, warm_start: bool = True,
                 orthogonalization_epsilon: float = 0, random_seed: int = 0,
                 compression_stats_logging_frequency: int = 10_000,
                 batch_tensors_with_same_shape: bool = False) -> None:
        if (use_error_feedback or warm_start) and start_powerSGD_iter <= 1:
            raise ValueError(
                f"PowerSGDState: start_powerSGD_iter must be > 1 when use_error_feedback or "
                f"warm_start is on (got {start_powerSGD_iter}): DDP rebuilds nothing here, but "
                f"the first iterations must run uncompressed for the memories to be allocated "
                f"consistently")
        if int(matrix_approximation_rank) < 1:
            raise ValueError(f"PowerSGDState: matrix_approximation_rank must be >= 1, got "
                             f"{matrix_approximation_rank}")
        self.process_group = process_group
        self.matrix_approximation_rank = int(matrix_approximation_rank)
        self.start_powerSGD_iter = start_powerSGD_iter
        self.min_compression_rate = min_compression_rate
        self.use_error_feedback = bool(use_error_feedback)
        self.warm_start = bool(warm_start)
        self.orthogonalization_epsilon = orthogonalization_epsilon
        self.rng = np.random.RandomState(random_seed)
        self.error_dict: Dict[int, Tensor] = {}
        self.p_memory_dict: Dict[int, Tensor] = {}
        self.q_memory_dict: Dict[int, Tensor] = {}
        self.iter = 0
        self.total_numel_before_compression = 0
        self.total_numel_after_compression = 0
        self.compression_stats_logging_frequency = max(1, compression_stats_logging_frequency)
        self.next_stats_report = 0
        self.batch_tensors_with_same_shape = bool(batch_tensors_with_same_shape)
        logger.info("PowerSGD: rank %s, start_powerSGD_iter %s, min_compression_rate %s, "
                    "error feedback %s, warm start %s", matrix_approximation_rank,
                    start_powerSGD_iter, min_compression_rate, use_error_feedback, warm_start)

    def __getstate__(self) -> dict:
        # a process group cannot be pickled: a loaded state uses the default group
        return {k: getattr(self, k) for k in self.__slots__ if k != "process_group"}

    def __setstate__(self, state: dict) -> None:
        self.process_group = None  # the default group, looked up when the hook runs
        for k, v in state.items():
            setattr(self, k, v)

    def maybe_increase_iter(self, bucket: GradBucket) -> None:
        """Count an iteration when ``bucket`` is the last of the backward pass."""
        if bucket.is_last():
            self.iter += 1
        if self.iter == self.start_powerSGD_iter:
            logger.info("PowerSGD: compression starts after %s iterations", self.iter)

    def compression_stats(self) -> Tuple[float, int, int]:
        """``(rate, elements before, elements after)`` over the compressed steps so far
        (rate 0 before any)."""
        after = self.total_numel_after_compression
        rate = self.total_numel_before_compression / after if after > 0 else 0
        return rate, self.total_numel_before_compression, after


def _report(bucket: GradBucket, state: PowerSGDState) -> None:
    if bucket.is_last() and state.iter >= state.next_stats_report:
        rate, before, after = state.compression_stats()
        logger.info("PowerSGD compression: iter %s, %s elements before, %s after, rate %s",
                    state.iter, before, after, rate)
        state.next_stats_report = state.iter + state.compression_stats_logging_frequency


def _add_error_feedback(state: PowerSGDState, index: int, flat: Any) -> Optional[Any]:
    """Add the stored error of bucket ``index`` to ``flat``; return a copy of the result
    (``None`` without error feedback)."""
    if not state.use_error_feedback:
        return None
    err = state.error_dict.get(index)
    if err is not None:
        flat += err._data
    else:
        state.error_dict[index] = _new(array_module(flat).zeros_like(flat))
    return flat.copy()


def _finish_step(state: PowerSGDState, index: int, before: Optional[Any], after: Any,
                 bucket: GradBucket) -> None:
    if before is not None:
        state.error_dict[index] = _new(before - after)
    if not state.warm_start:
        state.p_memory_dict.clear()
        state.q_memory_dict.clear()
    state.maybe_increase_iter(bucket)


def _plain_phase(state: PowerSGDState, bucket: GradBucket) -> Tuple[Optional[WorkFuture],
                                                                     tuple]:
    """``(future, (group, its size, bucket tensor, its array, array module))``: the future of
    plain averaging while fewer than ``start_powerSGD_iter`` iterations have run, else
    ``None`` (compress).

    Raises:
        TypeError: compressing a complex bucket.
    """
    group = _group(state.process_group)
    buf_t = bucket.buffer()
    parts = (group, group.size(), buf_t, buf_t._data, array_module(buf_t._data))
    if state.iter < state.start_powerSGD_iter:
        state.maybe_increase_iter(bucket)
        return _allreduce_fut(group, buf_t), parts
    if buf_t._data.dtype.kind == "c":
        raise TypeError("PowerSGD: complex gradients cannot be compressed (its "
                        "orthogonalization is real); average them with allreduce_hook")
    return None, parts


def _sum(arr: Any, group: Any) -> WorkFuture:
    from .... import distributed as dist

    return dist.all_reduce(arr, group=group, async_op=True).get_future()


def _classify(state: PowerSGDState, bucket: GradBucket) -> Tuple[List[Any], List[Any], int, int]:
    """The bucket's gradients as matrices to compress and arrays to sum exactly, with the sizes
    of the P and Q factors the former need; the compression statistics are counted."""
    compress: List[Any] = []
    plain: List[Any] = []
    p_total = q_total = 0
    for g in (t._data for t in bucket.gradients()):
        mat = g.reshape(g.shape[0] if g.ndim else 1, -1)
        n, m = mat.shape
        r = min(n, m, state.matrix_approximation_rank)
        worth, full, low = _should_compress(n, m, r, state.min_compression_rate)
        state.total_numel_before_compression += full
        if worth:
            compress.append(mat)
            p_total += n * r
            q_total += m * r
            state.total_numel_after_compression += low
        else:
            plain.append(g)
            state.total_numel_after_compression += full
    _report(bucket, state)
    return compress, plain, p_total, q_total


def _factor_views(state: PowerSGDState, batches: List[Any], p_mem: Any,
                  q_mem: Any) -> Tuple[List[Any], List[Any]]:
    """Each batch's P (b, n, r) and Q (b, m, r) factors, as views of the flat memories."""
    ps, qs = [], []
    p_at = q_at = 0
    for t in batches:
        b, n, m = t.shape
        r = min(n, m, state.matrix_approximation_rank)
        ps.append(p_mem[p_at:p_at + b * n * r].reshape(b, n, r))
        qs.append(q_mem[q_at:q_at + b * m * r].reshape(b, m, r))
        p_at += b * n * r
        q_at += b * m * r
    return ps, qs


def powerSGD_hook(state: PowerSGDState, bucket: GradBucket) -> WorkFuture:  # noqa: N802
    """Average the bucket with PowerSGD: each gradient of 2 or more dimensions is viewed as a
    matrix (its first dimension by the rest) and, where that saves enough
    (``min_compression_rate``), replaced by a rank-``r`` approximation built from two sums over
    the group; 1-D gradients and small matrices are averaged exactly, in one more sum.

    Example:
        >>> state = PowerSGDState(process_group=None, matrix_approximation_rank=1,
        ...                       start_powerSGD_iter=10)
        >>> ddp.register_comm_hook(state, powerSGD_hook)
    """
    plain, (group, world, buf_t, flat, xp) = _plain_phase(state, bucket)
    if plain is not None:
        return plain
    index = bucket.index()
    before = _add_error_feedback(state, index, flat)
    compress, plain, p_total, q_total = _classify(state, bucket)
    plain_mem = (xp.concatenate([g.reshape(-1) for g in plain]) if plain
                 else xp.zeros(0, dtype=flat.dtype))
    fresh = not state.warm_start or index not in state.p_memory_dict
    if fresh:
        state.p_memory_dict[index] = _new(xp.empty(p_total, dtype=flat.dtype))
        state.q_memory_dict[index] = _new(xp.empty(q_total, dtype=flat.dtype))
    by_shape: Dict[tuple, List[Any]] = {}
    for mat in compress:
        by_shape.setdefault(mat.shape, []).append(mat)
    batches: List[Any] = []  # (b, n, m): views of the gradients, or stacked copies
    for mats in by_shape.values():
        if state.batch_tensors_with_same_shape and len(mats) > 1:
            batches.append(xp.stack(mats))
        else:
            batches.extend(mat[None] for mat in mats)
    p_mem, q_mem = state.p_memory_dict[index]._data, state.q_memory_dict[index]._data
    ps, qs = _factor_views(state, batches, p_mem, q_mem)
    gen = _generator(state) if fresh else None
    for q in qs:
        if gen is not None:  # a fresh allocation: the q's draw one seeded stream in turn
            q[...] = _random_normal(q.shape, q.dtype, gen, q)
        _orthogonalize(q, state.orthogonalization_epsilon)
    for t, q, p in zip(batches, qs, ps):
        xp.matmul(t, q, out=p)

    def sum_ps(fut: Any) -> Any:
        summed = fut.value()[0]
        summed /= world
        at = 0
        for g in plain:
            g[...] = summed[at:at + g.size].reshape(g.shape)
            at += g.size
        return _sum(p_mem, group).wait()[0]

    def sum_qs(fut: Any) -> Any:
        for p in ps:
            _orthogonalize(p, state.orthogonalization_epsilon)
        for t, p, q in zip(batches, ps, qs):
            xp.matmul(t.transpose(0, 2, 1), p, out=q)
        return _sum(q_mem, group).wait()[0]

    def decompress(fut: Any) -> Tensor:
        xp.divide(q_mem, world, out=q_mem)
        for p, q, t in zip(ps, qs, batches):
            xp.matmul(p, q.transpose(0, 2, 1), out=t)
        if state.batch_tensors_with_same_shape:
            for t in batches:
                if t.shape[0] > 1:
                    for dst, src in zip(by_shape[t.shape[1:]], t):
                        dst[...] = src
        _finish_step(state, index, before, flat, bucket)
        return buf_t

    return _sum(plain_mem, group).then(sum_ps).then(sum_qs).then(decompress)


def batched_powerSGD_hook(state: PowerSGDState, bucket: GradBucket) -> WorkFuture:  # noqa: N802
    """PowerSGD on the whole bucket at once: the flat bucket, zero-padded to a square
    ``s x s`` matrix (``s = ceil(sqrt(numel))``), gets one rank-``r`` approximation. Cheaper
    than :func:`powerSGD_hook` but usually less accurate (it ignores the gradients' shapes)."""
    plain, (group, world, buf_t, flat, xp) = _plain_phase(state, bucket)
    if plain is not None:
        return plain
    length = flat.size
    side = math.ceil(math.sqrt(length))
    rank = min(side, state.matrix_approximation_rank)
    state.total_numel_before_compression += length
    state.total_numel_after_compression += side * state.matrix_approximation_rank * 2
    _report(bucket, state)
    padded = xp.zeros(side * side, dtype=flat.dtype)
    padded[:length] = flat
    index = bucket.index()
    before = _add_error_feedback(state, index, padded)
    matrix = padded.reshape(side, side)
    if not state.warm_start or index not in state.p_memory_dict:
        state.p_memory_dict[index] = _new(xp.empty((side, rank), dtype=flat.dtype))
        state.q_memory_dict[index] = _new(_random_normal((side, rank), flat.dtype,
                                                         _generator(state), flat))
    p = state.p_memory_dict[index]._data
    q = state.q_memory_dict[index]._data
    _orthogonalize(q[None], state.orthogonalization_epsilon)
    xp.matmul(matrix, q, out=p)

    def sum_q(fut: Any) -> Any:
        _orthogonalize(p[None], state.orthogonalization_epsilon)
        xp.matmul(matrix.T, p, out=q)
        return _sum(q, group).wait()[0]

    def decompress(fut: Any) -> Tensor:
        xp.divide(q, world, out=q)
        xp.matmul(p, q.T, out=matrix)
        _finish_step(state, index, before, padded, bucket)
        flat[...] = padded[:length]
        return buf_t

    return _sum(p, group).then(sum_q).then(decompress)
