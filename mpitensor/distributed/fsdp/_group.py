"""One ``fully_shard`` unit's parameters: their shards, the gathered copy, the gradient reduction.

Layout. Each parameter of global shape ``(d0, *rest)`` is split on dim 0 as ``torch.chunk``
splits it: chunks of ``c = ceil(d0 / N)`` rows, so trailing ranks may hold fewer rows or none.
Every rank's *padded* shard of the unit is one flat vector of ``S = sum(c_i * prod(rest_i))``
elements, parameter after parameter, with zeros past a short chunk. One
``all_gather_into_tensor`` of these vectors (rank-major, ``N * S`` elements) gathers the whole
unit; one copy per parameter (two where the chunks are uneven) moves each into its own
contiguous block of the *unsharded region*. Gradients travel the other way: one copy per
parameter into a rank-major ``N * S`` buffer, one ``reduce_scatter_tensor``, and each rank's
gradient shards are views of its ``S``-element result, divided by ``N`` (the mean, as DDP).
With HSDP (a 2-D mesh) ``N`` is the shard dim's size, and the reduce-scattered result is then
all-reduced over the replicate dim before the division by every rank of the mesh.

Freeing. The autograd graph keeps the arrays a forward used until backward reads them, so
dropping references would free nothing. On the CPU the unsharded region is therefore one
anonymous memory map: resharding returns its pages to the system (``madvise(MADV_DONTNEED)``)
while every array over it stays valid, and the gather before backward writes the values back
into the same addresses, so the graph reads the right numbers (torch resizes the storage to
zero and back for the same reason). On CuPy the region is device memory held by the graph
until backward; resharding there drops the module's own reference only.
"""

from __future__ import annotations

import math
import mmap
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from mpitensor.nn import Parameter
from mpitensor.tensor import Tensor


def _dist() -> Any:
    import mpitensor.distributed as dist

    return dist


def local(t: Any) -> Any:
    """A DTensor's local piece (a plain tensor as it is)."""
    return getattr(t, "_local_tensor", t)


def raw(t: Any) -> Any:
    """The array under a tensor, or under a DTensor's local piece (no copy): NumPy on the CPU,
    CuPy on a GPU."""
    d = local(t).detach()
    if d.is_cuda:
        import cupy

        return cupy.asarray(d)
    return d._data  # NumPy's array (a meta tensor's too, which numpy() refuses to give out)


def array_module(a: Any) -> Any:
    """NumPy for a NumPy array, CuPy for a CuPy one."""
    if isinstance(a, np.ndarray):
        return np
    import cupy

    return cupy


class ParamInfo:
    """One parameter of a unit: where it is registered, the shape it is chunked from and its
    chunking.

    ``layout`` (a tensor-parallel parameter's, see ``_tensor_parallel``): what is chunked is
    the parameter's local piece, ``shape`` is that piece's, and the parameters made from it are
    DTensors of ``layout``; None for a plain parameter.
    """

    def __init__(self, owners: List[Tuple[Any, str]], param: Any, world: int, rank: int,
                 offset: int, layout: Any = None) -> None:
        self.owners = owners
        self.layout = layout
        self.shape = tuple(local(param).shape)
        self.dtype = param.dtype
        self.requires_grad = param.requires_grad
        self.d0 = self.shape[0]
        self.rest = math.prod(self.shape[1:])
        self.chunk = -(-self.d0 // world)
        self.full = self.d0 // self.chunk if self.chunk else 0
        self.rem = self.d0 - self.full * self.chunk
        self.start = min(rank * self.chunk, self.d0)
        self.stop = min((rank + 1) * self.chunk, self.d0)
        self.offset = offset
        self.padded = self.chunk * self.rest
        self.sharded: Any = None
        self.unsharded: Any = None

    def make_unsharded(self, whole: Tensor) -> Any:
        """The gathered parameter over ``whole`` (the gathered region's block)."""
        if self.layout is None:
            return Parameter(whole, requires_grad=self.requires_grad)
        return self.layout.unsharded(whole, self.requires_grad)

    def make_sharded(self, rows: Tensor, mesh: Any) -> Any:
        """This rank's ``rows`` as the sharded DTensor parameter (``Shard(0)`` over ``mesh``;
        ``(Replicate(), Shard(0))`` over an HSDP mesh; or the tensor-parallel 2-D layout)."""
        if self.layout is not None:
            return self.layout.sharded(rows, self.requires_grad)
        from ..tensor import DTensor, Replicate, Shard

        placements = [Replicate()] * (mesh.ndim - 1) + [Shard(0)]
        piece = DTensor.from_local(rows, mesh, placements, run_check=False, shape=self.shape)
        return Parameter(piece, requires_grad=self.requires_grad)

    @property
    def local_numel(self) -> int:
        return (self.stop - self.start) * self.rest

    def gather_out(self, out2: Any, dst: Any) -> None:
        """Copy this parameter's chunks from the rank-major gathered ``(N, S)`` into ``dst``."""
        if not self.d0:
            return
        blk = out2[:, self.offset:self.offset + self.padded]
        rows = dst.reshape(self.d0, self.rest)
        if self.full:
            rows[:self.full * self.chunk].reshape(self.full, self.padded)[...] = blk[:self.full]
        if self.rem:
            rows[self.full * self.chunk:] = blk[self.full, :self.rem * self.rest].reshape(
                self.rem, self.rest)

    def scatter_in(self, in2: Any, grad: Optional[Any]) -> None:
        """Lay this parameter's full gradient out rank-major in ``(N, S)`` (zeros past it)."""
        blk = in2[:, self.offset:self.offset + self.padded]
        if grad is None or not self.d0:
            blk[...] = 0
            return
        rows = grad.reshape(self.d0, self.rest)
        if self.full:
            blk[:self.full] = rows[:self.full * self.chunk].reshape(self.full, self.padded)
        used = self.full
        if self.rem:
            blk[used, :self.rem * self.rest] = rows[self.full * self.chunk:].reshape(-1)
            blk[used, self.rem * self.rest:] = 0
            used += 1
        blk[used:] = 0


class BufferPool:
    """Flat buffers reused across steps and units (a unit's gather and reduction buffers are
    alive only while its collective is): allocating them afresh every time costs a page fault
    per 4 KiB on the CPU, more than the copies themselves. A pool lives with a root unit."""

    def __init__(self) -> None:
        self._free: Dict[Tuple[Any, int, str], List[Any]] = {}

    def take(self, xp: Any, n: int, dtype: Any, zero: bool = False) -> Any:
        key = (xp, n, str(np.dtype(dtype)))
        got = self._free.get(key)
        buf = got.pop() if got else xp.empty(n, dtype=dtype)
        if zero:
            buf[...] = 0
        return buf

    def give(self, *bufs: Any) -> None:
        for buf in bufs:
            self._free.setdefault((array_module(buf), buf.size, str(buf.dtype)), []).append(buf)


#: ``MADV_POPULATE_WRITE`` (Linux 5.14): fault a range in with one call, not one per page
_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)


def _host_region(nbytes: int) -> Tuple[Any, np.ndarray]:
    mm = mmap.mmap(-1, max(nbytes, 1))
    return mm, np.frombuffer(mm, dtype=np.uint8, count=nbytes)


class ShardedGroup:
    """The parameters one ``fully_shard`` call manages, and their collectives."""

    def __init__(self, infos: List[ParamInfo], group: Any, world: int, rank: int,
                 param_dtype: Any, reduce_dtype: Any, offload: bool, xp: Any,
                 replicate: Any = None) -> None:
        self.infos = infos
        self.xp = xp  # the array module of the device that computes (NumPy or CuPy)
        self.group = group
        # HSDP: the group of this rank's replicas (None: no replica dim) and how many there are
        self.replicate = replicate
        self.replicas = 1 if replicate is None else _dist().get_world_size(replicate)
        self.world = world
        self.rank = rank
        self.S = sum(i.padded for i in infos)
        self.param_dtype = param_dtype
        self.reduce_dtype = reduce_dtype
        self.offload = offload
        self.even = all(i.rem == 0 and i.full == world for i in infos)
        self._region: Any = None
        self._mmap: Any = None
        self._freed = False
        self.pool = BufferPool()  # replaced by the root's at its first forward
        self.is_unsharded = False
        self._gather: Any = None  # (work, out) of a gather in flight
        self._reduce: Any = None  # (work, out) of a reduce-scatter in flight
        self.freed_bytes = 0

    # ---- the unsharded region ------------------------------------------------------------

    def _make_region(self) -> None:
        total = sum(i.d0 * i.rest for i in self.infos)
        dt = np.dtype(self.param_dtype)
        if self.xp is np:
            self._mmap, bytes_ = _host_region(total * dt.itemsize)
            self._region = bytes_.view(dt)
        else:
            self._region = self.xp.empty(total, dtype=dt)
        off = 0
        for info in self.infos:
            n = info.d0 * info.rest
            arr = self._region[off:off + n].reshape(info.shape)
            info.unsharded = info.make_unsharded(Tensor(arr))
            off += n

    def region_bytes(self) -> int:
        return 0 if self._region is None else self._region.nbytes

    # ---- all-gather ----------------------------------------------------------------------

    def start_gather(self, async_op: bool) -> None:
        """Send this rank's padded shard (cast to ``param_dtype``) to every rank."""
        if self._gather is not None or self.is_unsharded:
            return
        xp = self.xp
        dt = np.dtype(self.param_dtype)
        send = self.pool.take(xp, self.S, dt, zero=not self.even)
        for info in self.infos:
            if info.local_numel:
                # offloaded shards are host arrays: asarray copies them to the device
                local = xp.asarray(raw(info.sharded).reshape(-1))
                send[info.offset:info.offset + info.local_numel] = local
        out = self.pool.take(xp, self.world * self.S, dt)
        work = _dist().all_gather_into_tensor(out, send, group=self.group, async_op=True)
        self._gather = (work, out, send)
        if not async_op:
            self.finish_gather()

    def finish_gather(self) -> None:
        """Wait for the gather and copy every parameter into the unsharded region."""
        if self.is_unsharded:
            return
        if self._gather is None:
            self.start_gather(async_op=False)
            return
        work, out, send = self._gather
        self._gather = None
        work.wait()
        if self._region is None:
            self._make_region()
        elif self._mmap is not None and self._freed:
            self._populate()
        out2 = out.reshape(self.world, self.S)
        for info in self.infos:
            info.gather_out(out2, raw(info.unsharded))
        self.pool.give(out, send)
        self.is_unsharded = True
        self._freed = False

    def _populate(self) -> None:
        try:
            self._mmap.madvise(_POPULATE_WRITE)
        except OSError:  # an older kernel: the copy faults the pages in one by one
            pass

    def free(self) -> None:
        """Give the unsharded region's memory back (its arrays stay valid; see the module doc)."""
        if not self.is_unsharded:
            return
        self.is_unsharded = False
        if self._mmap is not None:
            self._mmap.madvise(mmap.MADV_DONTNEED)
            self._freed = True
            self.freed_bytes += self._region.nbytes

    # ---- reduce-scatter ------------------------------------------------------------------

    def start_reduce(self) -> None:
        """Reduce-scatter the unsharded gradients (async); the unsharded ``.grad`` is dropped."""
        grads = [None if i.unsharded is None or i.unsharded.grad is None
                 else raw(i.unsharded.grad) for i in self.infos]
        xp = self.xp
        dt = np.dtype(self.reduce_dtype)
        inp = self.pool.take(xp, self.world * self.S, dt)
        in2 = inp.reshape(self.world, self.S)
        for info, g in zip(self.infos, grads):
            info.scatter_in(in2, g)
            if info.unsharded is not None:
                info.unsharded.grad = None
        out = xp.empty(self.S, dtype=dt)  # the gradient shards are views of it: not pooled
        work = _dist().reduce_scatter_tensor(out, inp, group=self.group, async_op=True)
        self._reduce = (work, out, inp)

    def start_replicate_reduce(self) -> None:
        """HSDP: wait for the reduce-scatter, then start the all-reduce of its shard over the
        replicas (asynchronous; a no-op without a replica dim or with nothing in flight)."""
        if self._reduce is None or self.replicate is None or self._reduce[2] is None:
            return
        work, out, inp = self._reduce
        work.wait()
        self.pool.give(inp)
        work = _dist().all_reduce(out, group=self.replicate, async_op=True)
        self._reduce = (work, out, None)

    def finish_reduce(self) -> None:
        """Wait for the reduction; each sharded parameter's ``.grad`` gets (or adds) its mean
        (over the shard dim's ranks and, with HSDP, over the replicas)."""
        self.start_replicate_reduce()
        if self._reduce is None:
            return
        work, out, inp = self._reduce
        self._reduce = None
        work.wait()
        if inp is not None:
            self.pool.give(inp)
        out /= self.world * self.replicas
        for info in self.infos:
            if not info.requires_grad:
                continue
            local_shape = (info.stop - info.start,) + info.shape[1:]
            g = out[info.offset:info.offset + info.local_numel].reshape(local_shape)
            g = g.astype(np.dtype(info.dtype), copy=False)
            if self.offload and self.xp is not np:
                g = g.get()  # the gradient shard lives beside its host parameter shard
            p = local(info.sharded)  # a DTensor's gradient is its local piece's
            if p.grad is None:
                p.grad = Tensor(g)
            else:
                graw = raw(p.grad)
                graw += g.reshape(graw.shape)
