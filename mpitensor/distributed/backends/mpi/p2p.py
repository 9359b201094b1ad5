"""The MPI group's point-to-point operations: send, recv, isend, irecv, and their checks.

A mixin of :class:`~mpitensor.distributed.backends.mpi.group.MPIGroup`. Messages move as bytes
(see ``_p2p_fast``); in debug mode each message is preceded by a header on the group's ``hdr``
communicator that the receiver compares with its buffer and answers (its *verdict*), so a
mismatch is named on both sides.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Optional

import numpy as np
from mpi4py import MPI

from ....errors import (
    MessageMismatchError,
    MessageTruncatedError,
)
from ....tensor import Tensor
from ...health import watchdog as W
from ...process_group import Work
from . import buffers as B

_MOVE = B.MOVE_TYPES
_ANY_SOURCE = MPI.ANY_SOURCE
_wait = W.wait
_I64 = MPI.INT64_T
_BYTE = MPI.BYTE
_HDR_LEN = 16  # debug-mode p2p header: magic, sender's p2p seq, dtype code, nbytes, ndim, shape
_HDR_MAGIC = 0x6D7074  # "mpt"
_MAX_DIMS = _HDR_LEN - 5
_DTYPES = list(B.MOVE_TYPES)
_DTYPE_CODE = {dt: i for i, dt in enumerate(_DTYPES)}


class PointToPoint:
    """The point-to-point operations of :class:`MPIGroup` (a mixin: ``self`` is the group)."""

    def check_tag(self, tag: Any, where: str) -> int:
        if isinstance(tag, bool) or not hasattr(tag, "__index__"):
            raise TypeError(f"{where}: tag must be an int, got {tag!r}")
        tag = tag.__index__()
        if not 0 <= tag <= self.tag_ub:
            raise ValueError(f"{where}: tag={tag} is out of range; MPI tags run from 0 to "
                             f"{self.tag_ub}")
        return tag

    def peer_rank(self, peer: Optional[int], group_peer: Optional[int], what: str, where: str,
              allow_any: bool = False) -> int:
        r = self.resolve_peer(peer, group_peer, what, where, allow_none=allow_any)
        if r is None:
            return _ANY_SOURCE
        if r == self.rank_:
            raise ValueError(
                f"{where}: invalid {what} rank {self.ranks[r]}: {what} rank should not be the "
                "same as the rank of the current process (point-to-point operations need two "
                "different ranks; copy the tensor locally instead)")
        return r

    def _p2p_fast(self, arr: Any, peer: Any, tag: Any, group_peer: Any) -> Any:
        """MPI.BYTE when a p2p call needs no checks beyond these, else None.

        True for a contiguous NumPy array of a supported dtype, int peer and tag in range, on a
        group whose ranks are the world's (so the peer needs no translation).

        Messages move as bytes, whatever the dtype: a receive typed with the buffer's element
        type makes MPICH abort the whole job (an assertion in its unpacking) when the message's
        byte count is not a whole number of those elements (float32 x 3 sent, float64
        received); as bytes, the receive completes and the count check below explains it.
        """
        if (type(arr) is np.ndarray and type(peer) is int and type(tag) is int
                and group_peer is None and self.identity and not self.slow
                and 0 <= peer < self.size_ and peer != self.rank_ and 0 <= tag <= self.tag_ub
                and arr.flags.c_contiguous and arr.dtype in _MOVE):
            return _BYTE
        return None

    def send(self, tensor: Any, dst: Optional[int], tag: int = 0,
             group_dst: Optional[int] = None, async_op: bool = False) -> Optional[Work]:
        arr = tensor._data if type(tensor) is Tensor else tensor
        mt = self._p2p_fast(arr, dst, tag, group_dst)
        if mt is not None:
            s = self.p2p_seq = self.p2p_seq + 1
            req = self.comm.Isend([arr, mt], dst, tag)
            if async_op:
                return Work(req, None, [tensor], keep=arr, describe=self._describe_p2p("isend"),
                            group=self, info=("isend", s, "p2p", dst, tag))
            if not req.Test():
                _wait(self.health, req, "send", s, "p2p", None, None, dst, tag,
                      nbytes=arr.nbytes)
            return None
        return self._send(tensor, dst, tag, group_dst, async_op)

    def _describe_p2p(self, opname: str) -> Callable[[], str]:
        seq = self.p2p_seq
        return lambda: f"rank {self.global_rank}: {opname} (p2p #{seq} on {self.name})"

    def _send(self, tensor: Any, dst: Optional[int], tag: int, group_dst: Optional[int],
              async_op: bool) -> Optional[Work]:
        op = "isend" if async_op else "send"
        where = self.begin_p2p(op)
        peer = self.peer_rank(dst, group_dst, "dst", where)
        tag = self.check_tag(tag, where)
        arr = B.unwrap(tensor, "tensor", where)
        B.check_dtype(arr, "tensor", where)
        spec = [B.stage_in(arr), _BYTE]  # as bytes: see _p2p_fast
        s = self.p2p_seq = self.p2p_seq + 1
        header = hreq = None
        if self.debug:
            header = _header(arr, s)
            hreq = self.health.hdr.Isend([header, _I64], peer, tag)
        try:
            req = self.comm.Isend(spec, peer, tag)
        except MPI.Exception as exc:
            raise self._mpi_error(where, exc) from exc
        info = (op, s, "p2p", peer, tag)
        if async_op:
            work = _SendWork(req, None, [tensor], describe=lambda: where, keep=(spec, header),
                             group=self, info=info)
            work._check = (hreq, peer, s, where) if hreq is not None else None
            return work
        try:
            if not req.Test():
                _wait(self.health, req, op, s, "p2p", None, None, peer, tag)
        except MPI.Exception as exc:
            raise self._mpi_error(where, exc) from exc
        if hreq is not None:
            self._await_verdict(hreq, peer, s, where, None)
        return None

    def _await_verdict(self, hreq: Any, peer: int, s: int, where: str,
                       timeout: Optional[float]) -> None:
        """Debug mode: wait until the receiver has checked this message's header."""
        h = self.health
        _wait(h, hreq, "send (debug header)", s, "p2p", None, timeout, peer)
        _wait(h, _VerdictRequest(self, peer, s), "send (waiting for the receiver's check)",
              s, "p2p", None, timeout, peer)
        problem = self.verdicts.pop((peer, s))
        if problem is not None:
            raise MessageMismatchError(f"{where}: rank {self.ranks[peer]} received this message "
                                       f"and reported: {problem}")

    def recv(self, tensor: Any, src: Optional[int] = None, tag: int = 0,
             group_src: Optional[int] = None, async_op: bool = False) -> Any:
        arr = tensor._data if type(tensor) is Tensor else tensor
        mt = self._p2p_fast(arr, src, tag, group_src)
        if mt is not None and arr.flags.writeable:
            if async_op:
                return self._irecv_fast(tensor, arr, mt, src, tag)
            status = MPI.Status()
            s = self.p2p_seq = self.p2p_seq + 1
            try:
                req = self.comm.Irecv([arr, mt], src, tag)
                if not req.Test(status):
                    _wait(self.health, req, "recv", s, "p2p", status, None, src, tag, True,
                          arr.nbytes)
            except MPI.Exception as exc:
                where = f"rank {self.global_rank}: recv (p2p #{s} on {self.name})"
                raise self._recv_error(where, status, arr.nbytes, B.describe(arr),
                                       exc) from exc
            if status.Get_count(MPI.BYTE) != arr.nbytes:
                raise self._short(f"rank {self.global_rank}: recv (p2p #{s} on "
                                  f"{self.name})", status, arr.nbytes, B.describe(arr))
            return status.Get_source()
        return self._recv(tensor, src, tag, group_src, async_op)

    def _irecv_fast(self, tensor: Any, arr: np.ndarray, mt: Any, src: int, tag: int) -> Work:
        """``irecv`` where ``_p2p_fast`` allows: the general path's checks were 10 µs a call
        (against MPI's 1.5), which a window of 1-4 MiB messages paid in full, each receive's
        copy starting only once it is posted (0.85x raw mpi4py's bandwidth). Its failures and
        short messages are explained as the general path's (``_ReceiveCheck``)."""
        where = self.where("irecv", p2p=True)
        s = self.p2p_seq = self.p2p_seq + 1
        status = MPI.Status()
        recv = _ReceiveCheck(self, where, "irecv", s, tag, status, arr, arr.nbytes)
        try:
            req = self.comm.Irecv([arr, mt], src, tag)
        except MPI.Exception as exc:
            raise recv.translate(exc) from exc
        work = _RecvWork(req, None, [tensor], describe=lambda: where, keep=arr, status=status,
                         group=self, info=("irecv", s, "p2p", src, tag))
        work._translate, work._short = recv.translate, recv.short
        work._ranks, work._check = self.ranks, None
        return work

    def _recv(self, tensor: Any, src: Optional[int], tag: int, group_src: Optional[int],
              async_op: bool) -> Any:
        op = "irecv" if async_op else "recv"
        where = self.begin_p2p(op)
        peer = self.peer_rank(src, group_src, "src", where, allow_any=True)
        tag = self.check_tag(tag, where)
        arr = B.unwrap(tensor, "tensor", where)
        B.check_dtype(arr, "tensor", where)
        B.check_writable(arr, "tensor", where)
        s = self.p2p_seq = self.p2p_seq + 1
        buf, write_back = B.stage_out(arr)
        spec = [buf, _BYTE]  # as bytes: see _p2p_fast
        status = MPI.Status()
        comm = self.comm
        recv = _ReceiveCheck(self, where, op, s, tag, status, arr, buf.nbytes)
        check, translate = recv.check, recv.translate
        debug = self.debug
        try:
            req = comm.Irecv(spec, peer, tag)
        except MPI.Exception as exc:
            raise translate(exc) from exc
        info = (op, s, "p2p", None if peer == _ANY_SOURCE else peer, tag)
        if async_op:
            work = _RecvWork(req, write_back, [tensor], describe=lambda: where, keep=spec,
                             status=status, group=self, info=info)
            work._translate = translate
            work._ranks = self.ranks
            work._check = check if debug else None
            work._short = recv.short
            return work
        try:
            if not req.Test(status):
                _wait(self.health, req, op, s, "p2p", status, None, info[3], tag, True)
        except MPI.Exception as exc:
            raise translate(exc) from exc
        if debug:
            found = check(None)
            if found is not None:
                raise found
        short = recv.short()
        if short is not None:
            raise short
        if write_back is not None:
            write_back()
        return self.ranks[status.Get_source()]

    def _short(self, where: str, status: MPI.Status, nbytes: int,
               desc: str) -> MessageMismatchError:
        """A message smaller than the receive buffer: only its bytes were written."""
        got = status.Get_count(MPI.BYTE)
        return MessageMismatchError(
            f"{where}: the message from rank {self.ranks[status.Get_source()]} (tag "
            f"{status.Get_tag()}) has {got} bytes but the receive buffer is {desc} ({nbytes} "
            f"bytes): only the first {got} bytes were written. Send and receive tensors must "
            "have the same dtype and number of elements (as in torch)")

    def _recv_error(self, where: str, status: MPI.Status, nbytes: int, desc: str,
                    exc: BaseException) -> BaseException:
        if isinstance(exc, MPI.Exception) and exc.Get_error_class() == MPI.ERR_TRUNCATE:
            return self._truncated(where, status, nbytes, desc, exc)
        return self._mpi_error(where, exc)

    def _truncated(self, where: str, status: MPI.Status, nbytes: int, desc: str,
                   exc: MPI.Exception) -> MessageTruncatedError:
        text = exc.Get_error_string()
        src = status.Get_source()
        numbers = [int(n) for n in re.findall(r"(\d+) bytes", text) +
                   re.findall(r"buffer size is (\d+)", text)]
        others = [n for n in numbers if n != nbytes]
        sender = f" from rank {self.ranks[src]}" if 0 <= src < self.size_ else ""
        msg_size = f" of {others[0]} bytes" if others else ""
        return MessageTruncatedError(
            f"{where}: the incoming message{sender} (tag {status.Get_tag()}){msg_size} is larger "
            f"than the receive buffer ({desc}, {nbytes} bytes); the message was truncated. "
            "Allocate the receive tensor with the sender's shape and dtype.")


def _header(arr: Any, seq: int) -> np.ndarray:
    """Debug mode: what a sender tells the receiver about a message (dtype, size, shape)."""
    h = np.zeros(_HDR_LEN, np.int64)
    h[0], h[1], h[2], h[3] = _HDR_MAGIC, seq, _DTYPE_CODE.get(arr.dtype, -1), arr.nbytes
    h[4] = arr.ndim if arr.ndim <= _MAX_DIMS else -1
    if 0 < arr.ndim <= _MAX_DIMS:
        h[5:5 + arr.ndim] = arr.shape
    return h


def _describe_header(h: np.ndarray) -> str:
    code, nbytes, ndim = int(h[2]), int(h[3]), int(h[4])
    dt = str(_DTYPES[code]) if 0 <= code < len(_DTYPES) else "?"
    shape = [int(x) for x in h[5:5 + ndim]] if ndim >= 0 else "[...]"
    return f"{dt}{shape} ({nbytes} bytes)"


class _VerdictRequest:
    """Debug mode: completes when the receiver's verdict on message ``seq`` has arrived."""

    __slots__ = ("group", "peer", "key")

    def __init__(self, group: Any, peer: int, seq: int) -> None:
        self.group, self.peer, self.key = group, peer, (peer, seq)

    def Test(self, status: Any = None) -> bool:  # noqa: N802 - MPI request protocol
        g = self.group
        if self.key in g.verdicts:
            return True
        st = MPI.Status()
        diag = g.health.diag
        tag = W.VERDICT_TAG + g.health.tag_base
        while diag.Iprobe(self.peer, tag, st):
            seq, problem = diag.recv(None, self.peer, tag)
            g.verdicts[(self.peer, seq)] = problem
        return self.key in g.verdicts


class _SendWork(Work):
    """An isend handle; in debug mode ``wait()`` also waits for the receiver's check."""

    __slots__ = ("_check",)

    def _await(self, timeout: Optional[float]) -> None:
        super()._await(timeout)
        check, self._check = self._check, None
        if check is not None:
            hreq, peer, s, where = check
            try:
                self._group._await_verdict(hreq, peer, s, where, timeout)
            except MessageMismatchError as exc:
                self._done, self._exception = True, exc
                raise

    def is_completed(self) -> bool:
        if self._check is not None and not self._done:
            hreq, peer, s, _ = self._check
            if not (self._request.Test() and hreq.Test()
                    and _VerdictRequest(self._group, peer, s).Test()):
                return False
            self.wait()
            return True
        return super().is_completed()


class _ReceiveCheck:
    """What a receive needs to explain its failures: the debug-mode header check and the
    translation of MPI errors into this package's (one object per receive, used by the
    blocking path and by the work handle of ``irecv``)."""

    def __init__(self, g: Any, where: str, op: str, seq: int, tag: int, status: Any,
                 arr: Any, nbytes: int) -> None:
        self.g, self.where, self.op, self.seq, self.tag = g, where, op, seq, tag
        self.status, self.arr, self.nbytes = status, arr, nbytes
        self.debug = g.debug  # as when the receive was posted

    @property
    def desc(self) -> str:
        """The buffer as error texts name it (built only for one: 3 µs a receive)."""
        return B.describe(self.arr)

    def check(self, exc: Optional[BaseException]) -> Optional[BaseException]:
        """Debug mode: compare the sender's header with this buffer; answer the sender."""
        g, tag = self.g, self.tag
        source = self.status.Get_source()
        hdr = np.zeros(_HDR_LEN, np.int64)
        h = g.health
        hreq = h.hdr.Irecv([hdr, _I64], source, tag)
        _wait(h, hreq, f"{self.op} (debug header)", self.seq, "p2p", None, None, source, tag)
        problem = self._header_problem(hdr)
        h.notice_reqs.append(h.diag.isend((int(hdr[1]), problem), source,
                                      W.VERDICT_TAG + h.tag_base))
        if problem is None and exc is None:
            return None
        who = f"rank {g.ranks[source]} (tag {tag})"
        if isinstance(exc, MPI.Exception) and exc.Get_error_class() == MPI.ERR_TRUNCATE:
            return MessageTruncatedError(
                f"{self.where}: the incoming message from {who} is larger than the receive "
                f"buffer: the sender sent {_describe_header(hdr)}, this rank receives into "
                f"{self.desc} ({self.nbytes} bytes); the message was truncated. "
                "Allocate the receive tensor with the sender's shape and dtype.")
        if problem:
            return MessageMismatchError(
                f"{self.where}: the message from {who} does not match the receive buffer: "
                f"{problem}. Send and receive tensors must have the same dtype and number of "
                "elements.")
        return None

    def _header_problem(self, hdr: Any) -> Optional[str]:
        if hdr[0] != _HDR_MAGIC:
            return "its debug header is unreadable (is debug mode on for every rank?)"
        if int(hdr[2]) != _DTYPE_CODE.get(self.arr.dtype, -1) or int(hdr[3]) != self.nbytes:
            return (f"the sender sent {_describe_header(hdr)}, but the receive buffer is "
                    f"{self.desc} ({self.nbytes} bytes)")
        return None

    def short(self) -> Optional[BaseException]:
        """After completion: the error for a message smaller than the buffer, else None."""
        if self.status.Get_count(MPI.BYTE) == self.nbytes:
            return None
        return self.g._short(self.where, self.status, self.nbytes, self.desc)

    def translate(self, exc: BaseException) -> BaseException:
        """The error to raise for an MPI failure of this receive."""
        if self.debug and isinstance(exc, MPI.Exception):
            found = self.check(exc)
            if found is not None:
                return found
        return self.g._recv_error(self.where, self.status, self.nbytes, self.desc, exc)


class _RecvWork(Work):
    """An irecv handle: records the sender and turns MPI errors into readable ones."""

    __slots__ = ("_translate", "_ranks", "_check", "_short")

    def _complete(self) -> None:
        self._source = self._ranks[self._status.Get_source()]
        check, self._check = self._check, None
        found = check(None) if check is not None else None
        if found is None:
            found = self._short()
        if found is not None:
            self._done, self._exception, self._finish, self._keep = True, found, None, None
            raise found
        super()._complete()

    def wait(self, timeout: Optional[float] = None) -> bool:
        try:
            return super().wait(timeout)
        except MPI.Exception as exc:
            self._check = None
            self._done, self._exception = True, self._translate(exc)
            raise self._exception from exc

    def is_completed(self) -> bool:
        try:
            return super().is_completed()
        except MPI.Exception as exc:
            self._check = None
            self._done, self._exception = True, self._translate(exc)
            raise self._exception from exc


