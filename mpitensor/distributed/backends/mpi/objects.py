"""The MPI group's object collectives: pickled bytes over non-blocking buffer collectives.

A mixin of :class:`~mpitensor.distributed.backends.mpi.group.MPIGroup`, after ChainerMN's
``*_obj`` methods: every object operation pickles, moves the sizes, then the bytes, so that
these too are bounded by the group's timeout (mpi4py's lower-case methods block inside MPI).
The caller (``distributed/_objects.py``) checks the arguments and counts the call.
"""

from __future__ import annotations

import pickle
from typing import Any, Optional

import numpy as np
from mpi4py import MPI

from ...health import watchdog as W
from . import buffers as B

_ANY_SOURCE = MPI.ANY_SOURCE
_wait = W.wait
_I64 = MPI.INT64_T
_BYTE = MPI.BYTE


class ObjectCollectives:
    """The object operations of :class:`MPIGroup` (a mixin: ``self`` is the group)."""

    def _obj_wait(self, req: Any, op: str, status: Any = None) -> None:
        if not req.Test(status):
            _wait(self.health, req, op, self.seq, "coll", status)

    def bcast_obj(self, obj: Any, root: int, op: str = "broadcast_object_list") -> Any:
        n = np.zeros(1, np.int64)
        data = None
        if self.rank_ == root:
            data = _pickled(obj)
            n[0] = data.size
        self.sent += 1
        self._obj_wait(self.comm.Ibcast([n, _I64], root), op)
        if data is None:
            data = np.empty(int(n[0]), np.uint8)
        self._obj_wait(self.comm.Ibcast([data, _BYTE], root), op)
        return obj if self.rank_ == root else pickle.loads(data)

    def allgather_obj(self, obj: Any, op: str = "all_gather_object") -> list:
        data = _pickled(obj)
        n = np.array([data.size], np.int64)
        sizes = np.empty(self.size_, np.int64)
        self.sent += 1
        self._obj_wait(self.comm.Iallgather([n, _I64], [sizes, _I64]), op)
        counts, displs = B.counts_displs(sizes.tolist())
        out = np.empty(sum(counts), np.uint8)
        self._obj_wait(self.comm.Iallgatherv([data, _BYTE], [out, (counts, displs), _BYTE]), op)
        return [pickle.loads(out[d:d + c]) for c, d in zip(counts, displs)]

    def gather_obj(self, obj: Any, root: int, op: str = "gather_object") -> Optional[list]:
        data = _pickled(obj)
        n = np.array([data.size], np.int64)
        is_root = self.rank_ == root
        sizes = np.empty(self.size_, np.int64) if is_root else None
        self.sent += 1
        self._obj_wait(self.comm.Igather([n, _I64], [sizes, _I64] if is_root else None, root),
                       op)
        if not is_root:
            self._obj_wait(self.comm.Igatherv([data, _BYTE], None, root), op)
            return None
        counts, displs = B.counts_displs(sizes.tolist())
        out = np.empty(sum(counts), np.uint8)
        self._obj_wait(self.comm.Igatherv([data, _BYTE], [out, (counts, displs), _BYTE], root),
                       op)
        return [pickle.loads(out[d:d + c]) for c, d in zip(counts, displs)]

    def scatter_obj(self, objs: Optional[list], root: int,
                    op: str = "scatter_object_list") -> Any:
        is_root = self.rank_ == root
        n = np.zeros(1, np.int64)
        flat = sizes = None
        if is_root:
            parts = [pickle.dumps(o, protocol=pickle.HIGHEST_PROTOCOL) for o in objs]
            sizes = np.array([len(p) for p in parts], np.int64)
            flat = np.frombuffer(bytearray(b"".join(parts)), np.uint8)
        self.sent += 1
        self._obj_wait(self.comm.Iscatter([sizes, _I64] if is_root else None, [n, _I64], root),
                       op)
        out = np.empty(int(n[0]), np.uint8)
        send = [flat, B.counts_displs(sizes.tolist()), _BYTE] if is_root else None
        self._obj_wait(self.comm.Iscatterv(send, [out, _BYTE], root), op)
        return pickle.loads(out)

    def send_obj(self, obj: Any, peer: int, tag: int, op: str = "send_object") -> None:
        s = self.p2p_seq = self.p2p_seq + 1
        data = _pickled(obj)
        req = self.comm.Isend([data, _BYTE], peer, tag)
        if not req.Test():
            _wait(self.health, req, op, s, "p2p", None, None, peer, tag)

    def recv_obj(self, peer: int, tag: int, op: str = "recv_object") -> "tuple[Any, int]":
        h = self.health
        s = self.p2p_seq = self.p2p_seq + 1
        status = MPI.Status()
        probe = _ProbeRequest(self.comm, peer, tag)
        _wait(h, probe, op, s, "p2p", status, None, None if peer == _ANY_SOURCE else peer, tag)
        buf = np.empty(status.Get_count(_BYTE), np.uint8)
        req = probe.message.Irecv([buf, _BYTE])
        if not req.Test():
            _wait(h, req, op, s, "p2p", None, None, status.Get_source(), tag)
        return pickle.loads(buf), self.ranks[status.Get_source()]


def _pickled(obj: Any) -> np.ndarray:
    return np.frombuffer(bytearray(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)),
                         np.uint8)


class _ProbeRequest:
    """Looks like an MPI request: completes when a matching message has arrived."""

    __slots__ = ("comm", "source", "tag", "message")

    def __init__(self, comm: MPI.Comm, source: int, tag: int) -> None:
        self.comm, self.source, self.tag, self.message = comm, source, tag, None

    def Test(self, status: Any = None) -> bool:  # noqa: N802 - MPI request protocol
        m = self.comm.Improbe(self.source, self.tag, status)
        if m is None:
            return False
        self.message = m
        return True
