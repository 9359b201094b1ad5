"""torch.distributed's point-to-point functions: ``send``/``recv``, ``isend``/``irecv``,
``batch_isend_irecv`` and the object variants, on the group's public operations.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence

from ._world import _pg
from .process_group import ProcessGroup, Work


def send(tensor: Any, dst: Optional[int] = None, group: Optional[ProcessGroup] = None,
         tag: int = 0, group_dst: Optional[int] = None) -> None:
    """Send ``tensor`` to global rank ``dst``; blocks until the buffer may be reused.

    Raises:
        ValueError: ``dst`` is out of range, not in ``group``, or this rank itself.
    """
    _pg(group).send(tensor, dst, tag, group_dst, False)


def recv(tensor: Any, src: Optional[int] = None, group: Optional[ProcessGroup] = None,
         tag: int = 0, group_src: Optional[int] = None) -> int:
    """Receive into ``tensor`` from ``src`` (any rank when None); return the sender's global rank.

    Raises:
        MessageTruncatedError: the message is larger than ``tensor``.
    """
    return _pg(group).recv(tensor, src, tag, group_src, False)


def isend(tensor: Any, dst: Optional[int] = None, group: Optional[ProcessGroup] = None,
          tag: int = 0, group_dst: Optional[int] = None) -> Work:
    """Start sending ``tensor`` to ``dst``; return a :class:`Work` to ``wait()`` on.

    Do not modify ``tensor`` before the work completes.
    """
    return _pg(group).send(tensor, dst, tag, group_dst, True)


def irecv(tensor: Any, src: Optional[int] = None, group: Optional[ProcessGroup] = None,
          tag: int = 0, group_src: Optional[int] = None) -> Work:
    """Start receiving into ``tensor``; ``work.wait()`` completes it, ``work.source_rank()``
    names the sender (useful with ``src=None``)."""
    return _pg(group).recv(tensor, src, tag, group_src, True)


class P2POp:
    """One point-to-point operation for :func:`batch_isend_irecv`.

    Args:
        op: :func:`isend` or :func:`irecv` (the functions themselves, as in torch).
        tensor: the buffer to send or receive into.
        peer: the global rank of the other side (or ``group_peer`` inside ``group``).
    """

    __slots__ = ("op", "tensor", "peer", "group", "tag", "group_peer")

    def __init__(self, op: Callable, tensor: Any, peer: Optional[int] = None,
                 group: Optional[ProcessGroup] = None, tag: int = 0,
                 group_peer: Optional[int] = None) -> None:
        if op not in (isend, irecv):
            raise ValueError("P2POp: op must be mpitensor.distributed.isend or .irecv, got "
                             f"{getattr(op, '__name__', op)!r}")
        if peer is None and group_peer is None:
            raise ValueError("P2POp: peer (or group_peer) is required")
        self.op, self.tensor, self.peer, self.group = op, tensor, peer, group
        self.tag, self.group_peer = tag, group_peer

    def __repr__(self) -> str:
        return f"P2POp({self.op.__name__}, peer={self.peer}, tag={self.tag})"


def batch_isend_irecv(p2p_op_list: Sequence[P2POp]) -> List[Work]:
    """Start every operation in the list and return their work handles.

    All receives are posted before any send, so exchanges such as a ring shift cannot deadlock.
    """
    if not isinstance(p2p_op_list, (list, tuple)) or not all(
            isinstance(p, P2POp) for p in p2p_op_list):
        raise TypeError("batch_isend_irecv: expects a list of P2POp")
    if not p2p_op_list:
        raise ValueError("batch_isend_irecv: the list of P2POp is empty")
    order = sorted(range(len(p2p_op_list)), key=lambda i: p2p_op_list[i].op is isend)
    works: List[Any] = [None] * len(p2p_op_list)
    for i in order:
        p = p2p_op_list[i]
        if p.op is isend:
            works[i] = isend(p.tensor, p.peer, p.group, p.tag, p.group_peer)
        else:
            works[i] = irecv(p.tensor, p.peer, p.group, p.tag, p.group_peer)
    return works


def send_object(obj: Any, dst: int, group: Optional[ProcessGroup] = None, tag: int = 0) -> None:
    """Send any picklable object to global rank ``dst`` (uses pickle: not for hot paths)."""
    pg = _pg(group)
    where = pg.begin_p2p("send_object")
    pg.send_obj(obj, pg.peer_rank(dst, None, "dst", where), pg.check_tag(tag, where), "send_object")


def recv_object(src: Optional[int] = None, group: Optional[ProcessGroup] = None,
                tag: int = 0) -> Any:
    """Receive an object sent with :func:`send_object` (from any rank when ``src`` is None)."""
    pg = _pg(group)
    where = pg.begin_p2p("recv_object")
    peer = pg.peer_rank(src, None, "src", where, allow_any=True)
    return pg.recv_obj(peer, pg.check_tag(tag, where), "recv_object")[0]


def _begin_list(object_list: Any, group: Optional[ProcessGroup],
                opname: str) -> "tuple[ProcessGroup, str]":
    """Begin a p2p object-list call: its group and error prefix (``object_list`` must be a
    list, as in torch)."""
    pg = _pg(group)
    where = pg.begin_p2p(opname)
    if not isinstance(object_list, list):
        raise TypeError(f"{where}: object_list must be a list, got {type(object_list).__name__}")
    return pg, where


def send_object_list(object_list: List[Any], dst: Optional[int] = None,
                     group: Optional[ProcessGroup] = None, device: Any = None,
                     group_dst: Optional[int] = None) -> None:
    """Send a list of picklable objects to ``dst`` (torch's ``send_object_list``)."""
    pg, where = _begin_list(object_list, group, "send_object_list")
    pg.send_obj(list(object_list), pg.peer_rank(dst, group_dst, "dst", where), 0,
                "send_object_list")


def recv_object_list(object_list: List[Any], src: Optional[int] = None,
                     group: Optional[ProcessGroup] = None, device: Any = None,
                     group_src: Optional[int] = None) -> int:
    """Receive into ``object_list`` (same length as the sender's) in place; return the sender."""
    pg, where = _begin_list(object_list, group, "recv_object_list")
    objs, sender = pg.recv_obj(pg.peer_rank(src, group_src, "src", where, allow_any=True), 0,
                               "recv_object_list")
    if len(objs) != len(object_list):
        raise ValueError(f"{where}: received {len(objs)} objects from rank {sender} but "
                         f"object_list has {len(object_list)} slots; make them the same length")
    object_list[:] = objs
    return sender
