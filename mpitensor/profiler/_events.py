"""What a profile hands back: :class:`EventList` (the events of one recording), its
``key_averages()`` (one :class:`FunctionEventAvg` per name), the ``table()`` with torch's
columns, and the Chrome trace (``chrome://tracing``, Perfetto) written by
``export_chrome_trace``."""

from __future__ import annotations

import json
import os
from typing import Any, Iterable, Optional

from ._recorder import CudaNames, FunctionEvent

__all__ = ["EventList", "FunctionEventAvg", "FunctionEvent"]

_MEMORY_NOTE = ("CPU Mem: bytes of the tensors each op returned (children's included); "
                "temporaries inside an op are not counted")
_SUMMED = ("cpu_time_total", "self_cpu_time_total", "device_time_total",
           "self_device_time_total", "cpu_memory_usage", "self_cpu_memory_usage")
_SORT_ALIASES = {"cuda_time_total": "device_time_total",
                 "self_cuda_time_total": "self_device_time_total",
                 "cuda_time": "device_time"}


class FunctionEventAvg(CudaNames):
    """The events of one name (and input shapes, when grouped by them), added up.

    Times in µs: ``cpu_time_total``, ``self_cpu_time_total``, ``cpu_time`` (the mean per call),
    ``device_time_total`` (CuPy events, when CUDA was profiled); ``count`` calls.
    """

    def __init__(self, key: str, input_shapes: Any = None) -> None:
        self.key = key
        self.input_shapes = input_shapes
        self.count = 0
        for field in _SUMMED:
            setattr(self, field, 0)
        self.stack: list = []

    def add(self, ev: Any) -> FunctionEventAvg:
        self.count += ev.count
        for field in _SUMMED:
            setattr(self, field, getattr(self, field) + getattr(ev, field))
        if not self.stack:
            self.stack = list(getattr(ev, "stack", []))
        return self

    @property
    def cpu_time(self) -> float:
        return self.cpu_time_total / self.count if self.count else 0.0

    @property
    def device_time(self) -> float:
        return self.device_time_total / self.count if self.count else 0.0

    cuda_time = device_time

    def __repr__(self) -> str:
        return (f"<FunctionEventAvg key={self.key} self_cpu_time={self.self_cpu_time_total:.3f}"
                f"us cpu_time={self.cpu_time:.3f}us count={self.count}>")


def _fmt_time(us: float) -> str:
    if abs(us) >= 1e6:
        return f"{us / 1e6:.3f}s"
    if abs(us) >= 1e3:
        return f"{us / 1e3:.3f}ms"
    return f"{us:.3f}us"


def _fmt_bytes(n: float) -> str:
    for unit, size in (("Gb", 1 << 30), ("Mb", 1 << 20), ("Kb", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} b"


def _pct(part: float, whole: float) -> str:
    return f"{100.0 * part / whole:.2f}%" if whole else "0.00%"


class EventList(list):
    """The events of a recording (a list of :class:`FunctionEvent`), in start order."""

    def __init__(self, events: Iterable = (), *, use_device: Optional[str] = None,
                 profile_memory: bool = False, notes: Iterable = ()) -> None:
        super().__init__(events)
        self._use_device = use_device
        self._profile_memory = profile_memory
        self._notes = list(notes)

    @property
    def self_cpu_time_total(self) -> float:
        """The profiled time: the sum of every event's self time (µs)."""
        return sum(e.self_cpu_time_total for e in self if isinstance(e, FunctionEvent))

    def key_averages(self, group_by_input_shape: bool = False,
                     group_by_stack_n: int = 0) -> EventList:
        """One :class:`FunctionEventAvg` per event name (and input shapes / top stack
        frames, when asked), in order of first appearance."""
        groups: dict = {}
        for ev in self:
            key: tuple = (ev.name,)
            if group_by_input_shape:
                key += (str(ev.input_shapes),)
            if group_by_stack_n:
                key += tuple(ev.stack[-group_by_stack_n:])
            if key not in groups:
                groups[key] = FunctionEventAvg(
                    ev.name, ev.input_shapes if group_by_input_shape else None)
            groups[key].add(ev)
        out = EventList(groups.values(), use_device=self._use_device,
                        profile_memory=self._profile_memory, notes=self._notes)
        out._grouped_by_shape = group_by_input_shape
        return out

    def total_average(self) -> FunctionEventAvg:
        """Every event added into one, keyed ``"Total"``."""
        total = FunctionEventAvg("Total")
        for ev in self:
            total.add(ev)
        return total

    def table(self, sort_by: Optional[str] = None, row_limit: int = 100,
              max_src_column_width: int = 75, max_name_column_width: int = 55,
              max_shapes_column_width: int = 80, header: Optional[str] = None,
              top_level_events_only: bool = False, time_unit: Optional[str] = None) -> str:
        """The events as torch prints them: Name, Self CPU %, Self CPU, CPU total %,
        CPU total, CPU time avg, (device and memory columns when recorded), # of Calls.

        Args:
            sort_by: an attribute to sort on, largest first (``"cpu_time_total"``,
                ``"self_cpu_time_total"``, ``"count"``, ``"cpu_memory_usage"``, ...).
            row_limit: the most rows printed (-1: all).
            top_level_events_only: only events with no parent.
        """
        return _table(self, sort_by, row_limit, max_name_column_width,
                      max_shapes_column_width, header, top_level_events_only)

    def export_chrome_trace(self, path: str, origin_wall_us: float = 0.0,
                            pid: Optional[int] = None) -> None:
        """Write the events as Chrome trace JSON (complete ``"X"`` events, µs)."""
        pid = os.getpid() if pid is None else pid
        events = []
        for ev in self:
            if not isinstance(ev, FunctionEvent):
                continue
            args: dict = {"External id": ev.id}
            if ev.input_shapes:
                args["Input Dims"] = ev.input_shapes
            if ev.stack:
                args["Call stack"] = ";".join(ev.stack)
            events.append({"ph": "X", "cat": ev.kind, "name": ev.name, "pid": pid,
                           "tid": ev.thread, "ts": origin_wall_us + ev.start_ns / 1000.0,
                           "dur": ev.cpu_time_total, "args": args})
            if ev.device_time_total:
                events.append({"ph": "X", "cat": "kernel", "name": ev.name, "pid": pid,
                               "tid": "cuda", "ts": origin_wall_us + ev.start_ns / 1000.0,
                               "dur": ev.device_time_total, "args": {"External id": ev.id}})
        with open(path, "w") as f:
            json.dump({"schemaVersion": 1, "displayTimeUnit": "ms", "traceEvents": events,
                       "traceName": os.path.basename(str(path))}, f)

    def export_stacks(self, path: str, metric: str = "self_cpu_time_total") -> None:
        """Write ``frame;frame;...;op value`` lines (flame-graph input), from events recorded
        with ``with_stack=True``."""
        with open(path, "w") as f:
            for ev in self:
                if ev.stack:
                    frames = ";".join([*ev.stack, ev.name])
                    f.write(f"{frames} {int(getattr(ev, metric))}\n")


def _columns(events: EventList, shapes: bool) -> list:
    """(title, width, cell function) per column; a cell function gets (event, totals)."""
    cols = [("Self CPU %", lambda e, t: _pct(e.self_cpu_time_total, t["cpu"])),
            ("Self CPU", lambda e, t: _fmt_time(e.self_cpu_time_total)),
            ("CPU total %", lambda e, t: _pct(e.cpu_time_total, t["cpu"])),
            ("CPU total", lambda e, t: _fmt_time(e.cpu_time_total)),
            ("CPU time avg", lambda e, t: _fmt_time(e.cpu_time_total / max(e.count, 1)))]
    if events._use_device:
        dev = events._use_device.upper()
        cols += [(f"Self {dev}", lambda e, t: _fmt_time(e.self_device_time_total)),
                 (f"Self {dev} %", lambda e, t: _pct(e.self_device_time_total, t["dev"])),
                 (f"{dev} total", lambda e, t: _fmt_time(e.device_time_total)),
                 (f"{dev} time avg",
                  lambda e, t: _fmt_time(e.device_time_total / max(e.count, 1)))]
    if events._profile_memory:
        cols += [("CPU Mem", lambda e, t: _fmt_bytes(e.cpu_memory_usage)),
                 ("Self CPU Mem", lambda e, t: _fmt_bytes(e.self_cpu_memory_usage))]
    cols.append(("# of Calls", lambda e, t: str(e.count)))
    if shapes:
        cols.append(("Input Shapes", lambda e, t: str(e.input_shapes)))
    return cols


def _table(events: EventList, sort_by: Optional[str], row_limit: int, name_width: int,
           shapes_width: int, header: Optional[str], top_only: bool) -> str:
    rows = list(events)
    if top_only:
        rows = [e for e in rows if getattr(e, "cpu_parent", None) is None]
    totals = {"cpu": sum(e.self_cpu_time_total for e in events),
              "dev": sum(e.self_device_time_total for e in events)}
    if sort_by:
        attr = _SORT_ALIASES.get(sort_by, sort_by)
        rows.sort(key=lambda e: getattr(e, attr), reverse=True)
    if row_limit is not None and row_limit >= 0:
        rows = rows[:row_limit]
    cols = _columns(events, getattr(events, "_grouped_by_shape", False))
    width = max([len("Name")] + [min(len(e.key), name_width) for e in rows]) + 4
    cells = [[fn(e, totals) for _, fn in cols] for e in rows]
    widths = [max([len(title)] + [len(r[i]) for r in cells]) + 2
              for i, (title, _) in enumerate(cols)]
    if cols[-1][0] == "Input Shapes":
        widths[-1] = min(widths[-1], shapes_width)
    rule = "-" * width + "".join("  " + "-" * w for w in widths) + "  "

    def line(name: str, values: list) -> str:
        return name.rjust(width) + "".join("  " + v.rjust(w) for v, w in zip(values, widths)) \
            + "  "

    out = [header] if header else []
    out += [rule, line("Name", [t for t, _ in cols]), rule]
    for e, r in zip(rows, cells):
        name = e.key if len(e.key) <= name_width else e.key[:name_width - 3] + "..."
        out.append(line(name, r))
    out += [rule, f"Self CPU time total: {_fmt_time(totals['cpu'])}"]
    if events._use_device:
        out.append(f"Self {events._use_device.upper()} time total: "
                   f"{_fmt_time(totals['dev'])}")
    notes = list(events._notes) + ([_MEMORY_NOTE] if events._profile_memory else [])
    out += [f"Note: {n}" for n in notes]
    return "\n".join(out) + "\n"
