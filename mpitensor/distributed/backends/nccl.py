"""The NCCL process group: CuPy arrays through ``cupy.cuda.nccl``, everything else through MPI.

NCCL is optional. Importing this module never fails; creating an :class:`NCCLGroup` without
CuPy, NCCL or a CUDA device raises a ``RuntimeError`` that says what is missing. The NCCL
unique id is created on group rank 0 and broadcast over the group's MPI communicator.

CPU tensors, object collectives, and operations NCCL lacks (gather, scatter, all_to_all,
bitwise reductions, complex products) go through the wrapped :class:`MPIGroup`, so a program
may mix CPU and GPU tensors on one ``nccl`` group.
"""

from __future__ import annotations

from typing import Any, Optional

from ...backend import get_cupy, is_cupy_array, nccl_unavailable_reason
from ...tensor import Tensor
from ..health import watchdog as _watchdog
from ..process_group import ProcessGroup, ReduceOp, Work
from .mpi import buffers as B

__all__ = ["NCCLGroup", "nccl_unavailable_reason"]


class _EventRequest:
    """Makes a CUDA event look like an MPI request, for :class:`Work`."""

    __slots__ = ("event",)

    def __init__(self, event: Any) -> None:
        self.event = event

    def Wait(self, status: Any = None) -> None:  # noqa: N802 - MPI request protocol
        self.event.synchronize()

    def Test(self, status: Any = None) -> bool:  # noqa: N802
        return bool(self.event.done)


def _on_mpi_group(name: str) -> property:
    """An attribute that lives on the wrapped MPI group, read and written through it."""

    def get(self: "NCCLGroup") -> Any:
        return getattr(self.mpi_group, name)

    def set_(self: "NCCLGroup", value: Any) -> None:
        setattr(self.mpi_group, name, value)

    return property(get, set_, doc=f"The wrapped MPI group's ``{name}``.")


def _by_mpi_group(name: str) -> property:
    """An operation this group hands to the wrapped MPI group as it is (the MPI group's bound
    method; on a group whose ``mpi_group`` is not set yet, a plain AttributeError)."""

    def get(self: "NCCLGroup") -> Any:
        return getattr(self.mpi_group, name)

    return property(get, doc=f"The wrapped MPI group's ``{name}``.")


class NCCLGroup(ProcessGroup):
    """A process group whose CuPy-array collectives run on an NCCL communicator.

    It *holds* the :class:`MPIGroup` of the same ranks (``mpi_group``), which carries the
    group's one set of counters, history, health, timeout and debug flag (the attributes
    below are views of the MPI group's, so ``set_debug`` or ``set_timeout`` on this group
    reach every call, whichever path it takes), and which runs everything NCCL does not:
    CPU tensors, p2p, gather/scatter/all_to_all, object collectives. Both lists are
    explicit: what is not named here is this class's own or :class:`ProcessGroup`'s.
    """

    backend_name = "nccl"
    # the state shared with the MPI group
    health = _on_mpi_group("health")
    debug = _on_mpi_group("debug")
    _debug_on = _on_mpi_group("_debug_on")
    timeout = _on_mpi_group("timeout")
    stall_warn = _on_mpi_group("stall_warn")
    seq = _on_mpi_group("seq")
    p2p_seq = _on_mpi_group("p2p_seq")
    sent = _on_mpi_group("sent")
    history = _on_mpi_group("history")
    notices = _on_mpi_group("notices")
    unsettled = _on_mpi_group("unsettled")
    slow = _on_mpi_group("slow")
    # the operations the MPI group runs for it, whatever the arrays
    begin = _by_mpi_group("begin")
    begin_p2p = _by_mpi_group("begin_p2p")
    peer_rank = _by_mpi_group("peer_rank")
    check_tag = _by_mpi_group("check_tag")
    agree = _by_mpi_group("agree")
    count_call = _by_mpi_group("count_call")
    gather = _by_mpi_group("gather")
    scatter = _by_mpi_group("scatter")
    reduce_scatter = _by_mpi_group("reduce_scatter")
    all_to_all = _by_mpi_group("all_to_all")
    all_to_all_single = _by_mpi_group("all_to_all_single")
    send = _by_mpi_group("send")
    recv = _by_mpi_group("recv")
    bcast_obj = _by_mpi_group("bcast_obj")
    allgather_obj = _by_mpi_group("allgather_obj")
    gather_obj = _by_mpi_group("gather_obj")
    scatter_obj = _by_mpi_group("scatter_obj")
    send_obj = _by_mpi_group("send_obj")
    recv_obj = _by_mpi_group("recv_obj")
    split = _by_mpi_group("split")
    set_timeout = _by_mpi_group("set_timeout")

    def __init__(self, mpi_group: Any, device_id: Any = None) -> None:
        reason = nccl_unavailable_reason()
        if reason:
            raise RuntimeError(f"backend 'nccl' is unavailable: {reason}. Use backend='mpi' "
                               "(CUDA-aware MPI or host staging) instead.")
        self.mpi_group = mpi_group  # first: the shared attributes above read through it
        self._set_identity(mpi_group.ranks, mpi_group.global_rank, mpi_group.name)
        self.world_size = mpi_group.world_size
        cp = get_cupy()
        from cupy.cuda import nccl

        self._nccl = nccl
        self._dev = self._select_device(cp, device_id)
        uid = nccl.get_unique_id() if self.rank_ == 0 else None
        uid = mpi_group.bcast_obj(uid, 0, "nccl unique id broadcast")
        with cp.cuda.Device(self._dev):
            self.nccl_comm = nccl.NcclCommunicator(self.size_, uid, self.rank_)
        self._types = {
            "int8": nccl.NCCL_INT8, "uint8": nccl.NCCL_UINT8, "int32": nccl.NCCL_INT32,
            "uint32": nccl.NCCL_UINT32, "int64": nccl.NCCL_INT64, "uint64": nccl.NCCL_UINT64,
            "float16": nccl.NCCL_FLOAT16, "float32": nccl.NCCL_FLOAT32,
            "float64": nccl.NCCL_FLOAT64,
        }
        self._ops = {ReduceOp.SUM: nccl.NCCL_SUM, ReduceOp.PRODUCT: nccl.NCCL_PROD,
                     ReduceOp.MAX: nccl.NCCL_MAX, ReduceOp.MIN: nccl.NCCL_MIN}
        if hasattr(nccl, "NCCL_AVG"):
            self._ops[ReduceOp.AVG] = nccl.NCCL_AVG

    def _select_device(self, cp: Any, device_id: Any) -> int:
        if device_id is not None:
            return int(getattr(device_id, "index", device_id) or 0)
        from mpi4py import MPI

        # one GPU per rank on a node: the node-local rank picks the device
        node = self.mpi_group.comm.Split_type(MPI.COMM_TYPE_SHARED)
        local = node.Get_rank()
        node.Free()
        return local % cp.cuda.runtime.getDeviceCount()

    # -- helpers --------------------------------------------------------------------
    def _gpu(self, *xs: Any) -> bool:
        for x in xs:
            arr = x._data if isinstance(x, Tensor) else x
            if not is_cupy_array(arr):
                return False
        return True

    def _plan(self, arr: Any, op: Any, where: str) -> Optional[tuple]:
        """(flat view, nccl dtype, nccl op) or None when NCCL cannot do this reduction."""
        op = B.coerce_op(op, where)
        B.reduce_plan(arr.dtype, op, where)  # same dtype/op rules as the MPI path
        flat = arr
        name = str(arr.dtype)
        if name == "bool":
            flat, name = arr.view("uint8"), "uint8"
            op = {ReduceOp.SUM: ReduceOp.MAX, ReduceOp.PRODUCT: ReduceOp.MIN}.get(op, op)
        elif arr.dtype.kind == "c":
            if op not in (ReduceOp.SUM, ReduceOp.AVG):
                return None
            flat = arr.view(arr.real.dtype)
            name = str(flat.dtype)
        nt, no = self._types.get(name), self._ops.get(op)
        if nt is None or no is None:
            return None
        return flat, nt, no

    def _launch(self, op: str, arr: Any, fn: Any, result: Any, async_op: bool,
                finish: Any = None, keep: Any = None) -> Optional[Work]:
        """Count collective ``op`` (on ``arr``) and run ``fn(nccl communicator, stream)`` on the
        current stream; wait (bounded) unless async."""
        cp = get_cupy()
        g = self.mpi_group
        s = g.count_call(op, arr)
        stream = cp.cuda.get_current_stream()
        with cp.cuda.Device(self._dev):
            fn(self.nccl_comm, stream.ptr)
        event = cp.cuda.Event(block=False, disable_timing=True)
        event.record(stream)
        req = _EventRequest(event)
        if not async_op:
            _watchdog.wait(g.health, req, op, s)
            if finish is not None:
                finish()
            return None
        return Work(req, finish, result, keep=keep, group=g, info=(op, s, "coll", None, None),
                    describe=lambda: f"nccl {op} #{s} on {self.name}")

    def _contiguous(self, arr: Any, what: str, where: str) -> tuple:
        B.check_dtype(arr, what, where)
        if arr.flags.c_contiguous:
            return arr, None
        cp = get_cupy()
        buf = cp.ascontiguousarray(arr)

        def write_back() -> None:
            arr[...] = buf

        return buf, write_back

    def _pair(self, output: Any, input: Any, out_name: str, in_name: str, where: str,
              gathers: bool) -> tuple:
        """The arrays of all_gather_into_tensor (``gathers``: the output holds one input per
        member) or reduce_scatter_tensor (the input holds one output per member), checked."""
        out = B.unwrap(output, out_name, where)
        inp = B.unwrap(input, in_name, where)
        B.check_same_dtype(inp, out, in_name, out_name, where)
        big, small, name = (out, inp, out_name) if gathers else (inp, out, in_name)
        if big.size != small.size * self.size_:
            raise ValueError(f"{where}: {name} has {big.size} elements but needs "
                             f"{self.size_} × {small.size}")
        return out, inp

    # -- collectives on CuPy arrays ---------------------------------------------------
    def all_reduce(self, tensor: Any, op: Any = ReduceOp.SUM,
                   async_op: bool = False) -> Optional[Work]:
        if not self._gpu(tensor):
            return self.mpi_group.all_reduce(tensor, op, async_op)
        where = self.mpi_group.begin("all_reduce")
        arr = B.unwrap(tensor, "tensor", where)
        plan = self._plan(arr, op, where)
        if plan is None or self.debug:
            return self.mpi_group.all_reduce(tensor, op, async_op)
        buf, write_back = self._contiguous(plan[0], "tensor", where)
        return self._launch(
            "all_reduce", arr,
            lambda c, s: c.allReduce(buf.data.ptr, buf.data.ptr, buf.size, plan[1], plan[2], s),
            [tensor], async_op, write_back, buf)

    def broadcast(self, tensor: Any, src: Optional[int] = None, async_op: bool = False,
                  group_src: Optional[int] = None) -> Optional[Work]:
        if not self._gpu(tensor) or self.debug:
            return self.mpi_group.broadcast(tensor, src, async_op, group_src)
        where = self.mpi_group.begin("broadcast")
        root = self.resolve_peer(src, group_src, "src", where)
        arr = B.unwrap(tensor, "tensor", where)
        buf, write_back = self._contiguous(arr.view("uint8") if arr.dtype == bool else arr,
                                           "tensor", where)
        u8 = self._nccl.NCCL_UINT8
        return self._launch("broadcast", arr,
                            lambda c, s: c.bcast(buf.data.ptr, buf.nbytes, u8, root, s),
                            [tensor], async_op, write_back, buf)

    def reduce(self, tensor: Any, dst: Optional[int] = None, op: Any = ReduceOp.SUM,
               async_op: bool = False, group_dst: Optional[int] = None) -> Optional[Work]:
        if not self._gpu(tensor) or self.debug:
            return self.mpi_group.reduce(tensor, dst, op, async_op, group_dst)
        where = self.mpi_group.begin("reduce")
        root = self.root_rank(dst, group_dst, "dst", where)
        arr = B.unwrap(tensor, "tensor", where)
        plan = self._plan(arr, op, where)
        if plan is None:
            return self.mpi_group.reduce(tensor, dst, op, async_op, group_dst)
        buf, write_back = self._contiguous(plan[0], "tensor", where)
        return self._launch(
            "reduce", arr,
            lambda c, s: c.reduce(buf.data.ptr, buf.data.ptr, buf.size, plan[1], plan[2], root, s),
            [tensor], async_op, write_back if self.rank_ == root else None, buf)

    def all_gather_into_tensor(self, output: Any, input: Any,
                               async_op: bool = False) -> Optional[Work]:
        if not self._gpu(output, input) or self.debug:
            return self.mpi_group.all_gather_into_tensor(output, input, async_op)
        where = self.mpi_group.begin("all_gather_into_tensor")
        out, inp = self._pair(output, input, "output_tensor", "input_tensor", where, True)
        sbuf, _ = self._contiguous(inp, "input_tensor", where)
        rbuf, write_back = self._contiguous(out, "output_tensor", where)
        u8 = self._nccl.NCCL_UINT8
        return self._launch(
            "all_gather_into_tensor", inp,
            lambda c, s: c.allGather(sbuf.data.ptr, rbuf.data.ptr, sbuf.nbytes, u8, s),
            [output], async_op, write_back, (sbuf, rbuf))

    def reduce_scatter_tensor(self, output: Any, input: Any, op: Any = ReduceOp.SUM,
                              async_op: bool = False) -> Optional[Work]:
        if not self._gpu(output, input) or self.debug:
            return self.mpi_group.reduce_scatter_tensor(output, input, op, async_op)
        where = self.mpi_group.begin("reduce_scatter_tensor")
        out, inp = self._pair(output, input, "output", "input", where, False)
        plan_in, plan_out = self._plan(inp, op, where), self._plan(out, op, where)
        if plan_in is None:
            return self.mpi_group.reduce_scatter_tensor(output, input, op, async_op)
        sbuf, _ = self._contiguous(plan_in[0], "input", where)
        rbuf, write_back = self._contiguous(plan_out[0], "output", where)
        return self._launch(
            "reduce_scatter_tensor", inp,
            lambda c, s: c.reduceScatter(sbuf.data.ptr, rbuf.data.ptr, rbuf.size, plan_in[1],
                                         plan_in[2], s),
            [output], async_op, write_back, (sbuf, rbuf))

    def all_gather(self, tensor_list: Any, tensor: Any, async_op: bool = False) -> Optional[Work]:
        if (not self._gpu(tensor, *tensor_list) or self.debug
                or len({B.unwrap(t, "", "").size for t in tensor_list}) != 1):
            return self.mpi_group.all_gather(tensor_list, tensor, async_op)
        cp = get_cupy()
        arr = B.unwrap(tensor, "tensor", "all_gather")
        flat = cp.empty(arr.size * self.size_, dtype=arr.dtype)
        outs = [B.unwrap(t, "", "") for t in tensor_list]
        if len(outs) != self.size_:
            return self.mpi_group.all_gather(tensor_list, tensor, async_op)

        def copy_out() -> None:
            for i, o in enumerate(outs):
                o[...] = flat[i * arr.size:(i + 1) * arr.size].reshape(o.shape)

        work = self.all_gather_into_tensor(flat, arr, async_op=async_op)
        if work is None:
            copy_out()
            return None
        return Work(work._request, copy_out, list(tensor_list), group=work._group,
                    info=work._info, describe=work._describe)

    def barrier(self, async_op: bool = False) -> Optional[Work]:
        get_cupy().cuda.get_current_stream().synchronize()
        return self.mpi_group.barrier(async_op)

    def free(self) -> None:
        comm, self.__dict__["nccl_comm"] = self.__dict__.get("nccl_comm"), None
        if comm is not None:
            comm.destroy()
        self.mpi_group.free()
        self._mark_destroyed()
