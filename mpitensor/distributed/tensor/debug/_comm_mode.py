"""``CommDebugMode``: count the collectives a block of code issues, by kind and by module.

mpitensor has no dispatch modes, so the mode counts by swapping functions while it is active
(and only then: outside every mode nothing is swapped and nothing is paid):

* the public collectives of ``mpitensor.distributed`` (``dist.all_reduce``, ...), keyed as
  torch keys the c10d ops (``c10d.allreduce_``), or as functional collectives
  (``c10d_functional.all_reduce``) when DTensor's own code calls them (a replicated
  operand's gradient sum, ``loss_parallel``);
* the steps of a DTensor redistribution (``_redistribute``'s gather, reduce-scatter,
  all-reduce and all-to-all of one mesh dimension), each one functional collective, as
  torch's: what runs underneath (a direct move's small handshakes, a group's internal
  call) is not counted again;
* ``nn.Module.__call__``, to attribute forward collectives to the modules running them and
  to collect their DTensor parameters' placements;
* the DTensor dispatcher, to list the operations run on DTensors (the tracing table's
  noise levels 1-3).

Code that bound a collective before the mode was entered (``from mpitensor.distributed
import all_reduce``) is not seen; ``dist.all_reduce`` is. Object collectives
(``all_gather_object``) and ``barrier`` are not counted (torch counts no barrier).
"""

from __future__ import annotations

import re
import sys
import threading
from collections import defaultdict
from typing import Any, Callable, Dict, List, Tuple

import mpitensor.distributed as dist
from mpitensor.autograd import _engine
from mpitensor.nn.modules.module import Module

from .. import _dispatch, _redistribute
from .._api import DTensor
from ._op_names import C10D, CommOp
from ._patches import Patches

__all__ = ["CommDebugMode"]

_DTENSOR_PKG = "mpitensor.distributed.tensor"
_FUNCOL_FROM_DTENSOR = ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor",
                        "all_to_all_single")
#: a redistribution step -> the functional collective it is
_STEPS = {"all_gather_dim": "all_gather_into_tensor", "reduce_scatter_dim": "reduce_scatter_tensor",
          "all_reduce_dim": "all_reduce", "all_to_all_dim": "all_to_all_single"}
_FWD, _BWD = "FORWARD PASS", "BACKWARD PASS"
_YELLOW, _RED, _RESET = "\033[1;33m", "\033[1;31m", "\033[0m"

_local = threading.local()


def _inner() -> int:
    return getattr(_local, "inner", 0)


def _record(key: CommOp) -> None:
    backward = _engine._mode.callbacks is not None
    for mode in _PATCHES.holders:
        mode._add(key, backward)


def _counted_public(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    c10d = CommOp(f"c10d.{C10D[name]}")
    funcol = CommOp(f"c10d_functional.{name}") if name in _FUNCOL_FROM_DTENSOR else None

    def counted(*args: Any, **kwargs: Any) -> Any:
        if not _inner():
            caller = sys._getframe(1).f_globals.get("__name__", "")
            _record(funcol if funcol is not None and caller.startswith(_DTENSOR_PKG) else c10d)
        return original(*args, **kwargs)

    return counted


def _counted_step(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    key = CommOp(f"c10d_functional.{name}")

    def counted(*args: Any, **kwargs: Any) -> Any:
        if not _inner():
            _record(key)
        _local.inner = _inner() + 1
        try:
            return original(*args, **kwargs)
        finally:
            _local.inner -= 1

    return counted


def _tracked_call(original: Callable[..., Any]) -> Callable[..., Any]:
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        for mode in _PATCHES.holders:
            mode._enter_module(self)
        try:
            return original(self, *args, **kwargs)
        finally:
            for mode in _PATCHES.holders:
                mode._leave_module()

    return call


def _recorded_dispatch(original: Callable[..., Any]) -> Callable[..., Any]:
    def dispatch(op: str, fn: Callable[..., Any], args: Tuple[Any, ...],
                 kwargs: Dict[str, Any]) -> Any:
        found = [x for a in list(args) + list(kwargs.values())
                 for x in (a if isinstance(a, (list, tuple)) else (a,)) if isinstance(x, DTensor)]
        if found:
            record = (op, [tuple(d.shape) for d in found], [d.placements for d in found],
                      found[0].device_mesh)
            backward = _engine._mode.callbacks is not None
            for mode in _PATCHES.holders:
                mode._add_op(record, backward)
        return original(op, fn, args, kwargs)

    return dispatch


def _install(p: Patches) -> None:
    p.swap(_dispatch, "dispatch", _recorded_dispatch(_dispatch.dispatch))
    for name in C10D:
        p.swap(dist, name, _counted_public(name, getattr(dist, name)))
    for step, name in _STEPS.items():
        p.swap(_redistribute, step, _counted_step(name, getattr(_redistribute, step)))
    p.swap(Module, "__call__", _tracked_call(Module.__call__))


_PATCHES = Patches(_install)


class _ModuleRecord:
    def __init__(self, module: Any) -> None:
        cls = type(module)
        self.module_type = f"class '{cls.__module__}.{cls.__qualname__}'"
        self.counts: Dict[str, Dict[CommOp, int]] = {_FWD: defaultdict(int),
                                                      _BWD: defaultdict(int)}
        self.parameters: Dict[str, Any] = {}
        self.ops: Dict[str, List[Tuple[Any, ...]]] = {_FWD: [], _BWD: []}


def _op_lines(record: Tuple[Any, ...], pad: str) -> List[str]:
    op, shapes, placements, mesh = record
    return [f"{_YELLOW}{pad}**{op}{_RESET}", f"{_RED}{pad}  shape: {shapes}{_RESET}",
            f"{_RED}{pad}  sharding: {placements}{_RESET}",
            f"{_RED}{pad}  device mesh: {mesh!r}{_RESET}"]


class CommDebugMode:
    """Count the collectives issued inside ``with CommDebugMode() as mode:`` (see the module's
    notes for what is seen), as ``torch.distributed.tensor.debug.CommDebugMode``.

    Example (``mpiexec -n 2``)::

        comm_mode = CommDebugMode()
        with comm_mode:
            y = tp_mlp(x)
        comm_mode.get_total_counts()          # 1: the row-wise layer's all_reduce
        comm_mode.get_comm_counts()           # {c10d_functional.all_reduce: 1}
    """

    def __init__(self) -> None:
        self.comm_counts: Dict[CommOp, int] = defaultdict(int)
        self.comm_module_counts: Dict[str, _ModuleRecord] = {}
        self._global = _ModuleRecord(self)
        self._stack: List[Tuple[str, Any]] = []  # (fqn, the root's name table)

    # ---------------------------------------------------------------- counting
    def _add(self, key: CommOp, backward: bool) -> None:
        self.comm_counts[key] += 1
        kind = _BWD if backward else _FWD
        self._global.counts[kind][key] += 1
        if not backward:
            for fqn, _ in self._stack:
                self.comm_module_counts[fqn].counts[_FWD][key] += 1

    def _add_op(self, record: Tuple[Any, ...], backward: bool) -> None:
        """A DTensor operation: to the innermost module running (backward ones: Global)."""
        if backward or not self._stack:
            self._global.ops[_BWD if backward else _FWD].append(record)
        else:
            self.comm_module_counts[self._stack[-1][0]].ops[_FWD].append(record)

    def _enter_module(self, module: Any) -> None:
        if self._stack:
            names = self._stack[-1][1]
            fqn = names.get(id(module)) or f"{self._stack[-1][0]}.{type(module).__name__}"
        else:
            root = type(module).__name__
            names = {id(m): f"{root}.{n}" if n else root for n, m in module.named_modules()}
            fqn = root
        self._stack.append((fqn, names))
        if fqn not in self.comm_module_counts:
            rec = self.comm_module_counts[fqn] = _ModuleRecord(module)
            for pname, p in module.named_parameters(recurse=False):
                if isinstance(p, DTensor):
                    rec.parameters[pname] = p.placements

    def _leave_module(self) -> None:
        self._stack.pop()

    def __enter__(self) -> "CommDebugMode":
        self.comm_counts.clear()
        self.comm_module_counts.clear()
        self._global = _ModuleRecord(self)
        self._stack = []
        _PATCHES.enter(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        _PATCHES.leave(self)

    # ---------------------------------------------------------------- results
    def get_total_counts(self) -> int:
        """The number of collectives counted."""
        return sum(self.comm_counts.values())

    def get_comm_counts(self) -> Dict[CommOp, int]:
        """Collectives by kind: keys are ``ops.c10d_functional.all_reduce``-style names (also
        equal to the string ``"c10d_functional.all_reduce"``)."""
        return self.comm_counts

    def get_parameter_info(self) -> Dict[str, Dict[str, Any]]:
        """Per module run inside the mode: its DTensor parameters' placements."""
        return {fqn: dict(rec.parameters) for fqn, rec in self.comm_module_counts.items()
                if rec.parameters}

    def get_sharding_info(self) -> Dict[str, Any]:
        """``"Module.sub.param" -> placements`` for every DTensor parameter of the modules run
        inside the mode."""
        return {f"{fqn}.{n}": p for fqn, rec in self.comm_module_counts.items()
                for n, p in rec.parameters.items()}

    def get_comm_module_counts(self) -> Dict[str, Dict[str, Dict[CommOp, int]]]:
        """Per module (``"Global"`` first): ``{"forward": {...}, "backward": {...}}``
        (backward collectives are attributed to ``"Global"`` only)."""
        recs = {"Global": self._global, **self.comm_module_counts}
        return {fqn: {"forward": dict(rec.counts[_FWD]), "backward": dict(rec.counts[_BWD])}
                for fqn, rec in recs.items()}

    def generate_comm_debug_tracing_table(self, noise_level: int = 3) -> str:
        """The counts by module as an indented text: ``noise_level`` 0 shows the collectives,
        1 and above also each module's type, its DTensor parameters and the DTensor
        operations it ran (by mpitensor's op names; backward ones under Global)."""
        lines: List[str] = []
        recs = [("Global", self._global)] + list(self.comm_module_counts.items())
        for fqn, rec in recs:
            pad = "" if fqn == "Global" else " " * (4 * (fqn.count(".") + 1))
            lines.append(f"{pad}{fqn}")
            if noise_level > 0 and fqn != "Global":
                lines.append(f"{pad}*module type: {rec.module_type}")
                if rec.parameters:
                    lines.append(f"{pad}*Parameter List")
                    lines += [f"{pad} *{n}: {p}" for n, p in rec.parameters.items()]
            for kind in (_FWD, _BWD):
                ops = rec.ops[kind] if noise_level > 0 else []
                if rec.counts[kind] or ops:
                    lines.append(f"{pad}  {kind}")
                    lines += [f"{_YELLOW}{pad}    *{k}: {v}{_RESET}"
                              for k, v in rec.counts[kind].items()]
                    lines += [line for op in ops for line in _op_lines(op, pad + "    ")]
        return "\n".join(lines) + "\n"

    def log_comm_debug_tracing_table_to_file(self, file_name: str = "comm_mode_log.txt",
                                             noise_level: int = 3) -> None:
        """Write :meth:`generate_comm_debug_tracing_table`'s text, without colours, to a file."""
        text = re.sub(r"\033\[[0-9;]*m", "", self.generate_comm_debug_tracing_table(noise_level))
        with open(file_name, "w") as f:
            f.write(text)

    def __repr__(self) -> str:
        return f"CommDebugMode(get_total_counts={self.get_total_counts()})"
