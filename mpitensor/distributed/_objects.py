"""torch.distributed's object collectives (``broadcast_object_list``, ``all_gather_object``,
``gather_object``, ``scatter_object_list``): the checks every rank makes before any traffic,
agreed in debug mode, then the group's pickled ``*_obj`` operation.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional

from ._world import _pg
from .process_group import ProcessGroup


def _checked(pg: ProcessGroup, where: str, opname: str, root: Optional[int],
             check: Callable[[], None]) -> None:
    """Run an object collective's local checks; in debug mode all ranks agree first.

    Debug mode compares the operation, its sequence number and root across the ranks, and
    every rank raises if any rank's arguments failed (so no rank is left waiting). Then the
    call is counted.
    """
    error: Optional[BaseException] = None
    try:
        check()
    except (TypeError, ValueError) as exc:
        error = exc
    if pg.debug:
        sig = pg.signature(opname) if root is None else pg.signature(opname, root=root)
        pg.agree(where, sig, error)
    if error is not None:
        raise error
    pg.count_call(opname)


def broadcast_object_list(object_list: List[Any], src: Optional[int] = None,
                          group: Optional[ProcessGroup] = None, device: Any = None,
                          group_src: Optional[int] = None) -> None:
    """Broadcast the picklable objects of ``object_list`` from ``src``, in place on every rank.

    Every rank passes a list of the same length; non-source entries are replaced.
    """
    pg = _pg(group)

    def body() -> None:
        where = pg.begin("broadcast_object_list")
        root = pg.root_rank(src, group_src, "src", where)

        def check() -> None:
            if not isinstance(object_list, list):
                raise TypeError(f"{where}: object_list must be a list, got "
                                f"{type(object_list).__name__}")

        _checked(pg, where, "broadcast_object_list", root, check)
        objs = pg.bcast_obj(list(object_list) if pg.rank_ == root else None, root)
        if len(objs) != len(object_list):
            raise ValueError(f"{where}: the source broadcast {len(objs)} objects but this rank's "
                             f"object_list has {len(object_list)} slots")
        object_list[:] = objs

    pg.call_guarded("broadcast_object_list", body)


def all_gather_object(object_list: List[Any], obj: Any,
                      group: Optional[ProcessGroup] = None) -> None:
    """Gather a picklable ``obj`` from every rank into ``object_list`` (len == group size)."""
    pg = _pg(group)

    def body() -> None:
        where = pg.begin("all_gather_object")

        def check() -> None:
            if not isinstance(object_list, list) or len(object_list) != pg.size_:
                raise ValueError(f"{where}: object_list must be a list of {pg.size_} entries (one "
                                 f"per rank), got {_len_desc(object_list)}")

        _checked(pg, where, "all_gather_object", None, check)
        object_list[:] = pg.allgather_obj(obj)

    pg.call_guarded("all_gather_object", body)


def _len_desc(x: Any) -> str:
    return f"a list of {len(x)}" if isinstance(x, list) else type(x).__name__


def _list_on_root(pg: ProcessGroup, where: str, root: int, lst: Any, name: str,
                  role: str) -> None:
    """On the root only: ``lst`` must be a list with one entry per rank of the group."""
    if pg.rank_ == root and (not isinstance(lst, list) or len(lst) != pg.size_):
        raise ValueError(f"{where}: {name} must be a list of {pg.size_} entries on the {role} "
                         f"rank, got {_len_desc(lst)}")


def gather_object(obj: Any, object_gather_list: Optional[List[Any]] = None,
                  dst: Optional[int] = None, group: Optional[ProcessGroup] = None,
                  group_dst: Optional[int] = None) -> None:
    """Gather a picklable ``obj`` from every rank into ``object_gather_list`` on ``dst``."""
    pg = _pg(group)

    def body() -> None:
        where = pg.begin("gather_object")
        root = pg.root_rank(dst, group_dst, "dst", where)

        def check() -> None:
            _list_on_root(pg, where, root, object_gather_list, "object_gather_list", "destination")

        _checked(pg, where, "gather_object", root, check)
        objs = pg.gather_obj(obj, root)
        if pg.rank_ == root:
            object_gather_list[:] = objs

    pg.call_guarded("gather_object", body)


def scatter_object_list(scatter_object_output_list: List[Any],
                        scatter_object_input_list: Optional[List[Any]] = None,
                        src: Optional[int] = None, group: Optional[ProcessGroup] = None,
                        group_src: Optional[int] = None) -> None:
    """Scatter ``scatter_object_input_list[i]`` from ``src`` into
    ``scatter_object_output_list[0]`` on rank i."""
    pg = _pg(group)

    def body() -> None:
        where = pg.begin("scatter_object_list")
        root = pg.root_rank(src, group_src, "src", where)

        def check() -> None:
            if not isinstance(scatter_object_output_list, list) or not scatter_object_output_list:
                raise ValueError(f"{where}: scatter_object_output_list must be a non-empty list")
            _list_on_root(pg, where, root, scatter_object_input_list, "scatter_object_input_list",
                          "source")

        _checked(pg, where, "scatter_object_list", root, check)
        scatter_object_output_list[0] = pg.scatter_obj(
            list(scatter_object_input_list) if pg.rank_ == root else None, root)

    pg.call_guarded("scatter_object_list", body)
