"""``torch.profiler``'s interface on mpitensor's recorder: :class:`profile` (with a step
:func:`schedule` and ``on_trace_ready``), :class:`record_function`, :class:`ProfilerActivity`,
:func:`tensorboard_trace_handler`."""

from __future__ import annotations

import enum
import functools
import gzip
import os
import shutil
import socket
import tempfile
import time
import warnings
from typing import Any, Callable, Iterable, Optional

from . import _recorder
from ._events import EventList


class ProfilerActivity(enum.Enum):
    """What to profile: ``CPU`` (op and range times), ``CUDA`` (device times of the same
    ops, from CuPy events, where CuPy sees a GPU)."""

    CPU = 0
    CUDA = 1
    XPU = 2
    MTIA = 3
    HPU = 4
    PrivateUse1 = 5


def supported_activities() -> set:
    """The activities recordable here: CPU, and CUDA where CuPy sees a GPU."""
    return {ProfilerActivity.CPU} | ({ProfilerActivity.CUDA} if _recorder._cupy() else set())


class ProfilerAction(enum.Enum):
    """What the profiler does during a step, as a schedule answers."""

    NONE = 0
    WARMUP = 1
    RECORD = 2
    RECORD_AND_SAVE = 3


def schedule(*, wait: int, warmup: int, active: int, repeat: int = 0, skip_first: int = 0,
             skip_first_wait: int = 0) -> Callable[[int], ProfilerAction]:
    """Steps in cycles: ``wait`` idle, ``warmup`` recording to be discarded, ``active``
    recorded, the last one of which hands the trace to ``on_trace_ready``; ``repeat`` cycles
    (0: no end) after ``skip_first`` idle steps (``skip_first_wait=1``: the first cycle has no
    wait).

    Raises:
        ValueError: a negative count, or ``active`` below 1.

    Example:
        >>> s = schedule(wait=1, warmup=1, active=2)
        >>> [s(i).name for i in range(4)]
        ['NONE', 'WARMUP', 'RECORD', 'RECORD_AND_SAVE']
    """
    if min(wait, warmup, repeat, skip_first, skip_first_wait) < 0 or active < 1:
        raise ValueError(f"schedule: wait, warmup, repeat and skip_first must be >= 0 and "
                         f"active >= 1, got wait={wait} warmup={warmup} active={active} "
                         f"repeat={repeat} skip_first={skip_first}")
    period = wait + warmup + active

    def action(step: int) -> ProfilerAction:
        if step < skip_first:
            return ProfilerAction.NONE
        step -= skip_first
        if skip_first_wait:
            step += wait
        if repeat and step // period >= repeat:
            return ProfilerAction.NONE
        pos = step % period
        if pos < wait:
            return ProfilerAction.NONE
        if pos < wait + warmup:
            return ProfilerAction.WARMUP
        return ProfilerAction.RECORD if pos < period - 1 else ProfilerAction.RECORD_AND_SAVE

    return action


def _always_record(step: int) -> ProfilerAction:
    return ProfilerAction.RECORD


def tensorboard_trace_handler(dir_name: str, worker_name: Optional[str] = None,
                              use_gzip: bool = False,
                              use_python_export: bool = False) -> Callable[[Any], None]:
    """An ``on_trace_ready`` that writes each trace to
    ``dir_name/<worker>.<ms>.pt.trace.json`` (``.gz`` with ``use_gzip``), as TensorBoard's
    profiler plugin reads them."""
    worker = worker_name or f"{socket.gethostname()}_{os.getpid()}"

    def handler(prof: Any) -> None:
        os.makedirs(dir_name, exist_ok=True)
        name = os.path.join(dir_name, f"{worker}.{time.time_ns() // 1_000_000}.pt.trace.json")
        if not use_gzip:
            prof.export_chrome_trace(name)
            return
        fd, tmp = tempfile.mkstemp(suffix=".json")
        os.close(fd)
        try:
            prof.export_chrome_trace(tmp)
            with open(tmp, "rb") as src, gzip.open(name + ".gz", "wb") as dst:
                shutil.copyfileobj(src, dst)
        finally:
            os.remove(tmp)

    return handler


class record_function:  # noqa: N801 - torch's name
    """A named range in the profile: a context manager or a decorator. Outside a profile it
    costs one check and records nothing.

    Example:
        >>> with record_function("data loading"):
        ...     pass
    """

    def __init__(self, name: str, args: Optional[str] = None) -> None:
        self.name = name
        self.args = args
        self._event: Any = None

    def __enter__(self) -> record_function:
        session = _recorder.active()
        if session is not None:
            self._event = session.begin(self.name, "user_annotation", (), _recorder._stack())
            self._session = session
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._event is not None:
            self._session.end(self._event, _recorder._stack())
            self._event = None

    def __call__(self, fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            with record_function(self.name, self.args):
                return fn(*args, **kwargs)

        return wrapped


class profile:  # noqa: N801 - torch's name
    """Record the time of mpitensor's ops and of ``record_function`` ranges.

    Args:
        activities: ``ProfilerActivity`` values (default: CPU, plus CUDA where available).
        schedule: step -> :class:`ProfilerAction` (see :func:`schedule`); default: record
            from start to stop.
        on_trace_ready: called with this profiler at the end of each recorded cycle.
        record_shapes: keep each op's input shapes.
        profile_memory: count the bytes of the tensors each op returns.
        with_stack: keep the Python frames (outside mpitensor) of each op.
        with_flops, with_modules, experimental_config, ...: accepted and ignored (torch's
            kineto options).

    Example:
        >>> import mpitensor as mt
        >>> with profile() as prof:
        ...     y = mt.ones(3).exp()
        >>> [e.key for e in prof.key_averages()]
        ['ones', 'exp']
    """

    def __init__(self, *, activities: Optional[Iterable] = None,
                 schedule: Optional[Callable[[int], ProfilerAction]] = None,
                 on_trace_ready: Optional[Callable[[Any], Any]] = None,
                 record_shapes: bool = False, profile_memory: bool = False,
                 with_stack: bool = False, with_flops: bool = False,
                 with_modules: bool = False, use_cuda: Optional[bool] = None,
                 **kineto_options: Any) -> None:
        acts = set(activities) if activities is not None else supported_activities()
        if use_cuda:
            acts.add(ProfilerActivity.CUDA)
        self.activities = acts
        self.schedule = schedule or _always_record
        self.record_steps = schedule is not None
        self.on_trace_ready = on_trace_ready
        self.record_shapes = record_shapes
        self.profile_memory = profile_memory
        self.with_stack = with_stack
        self.step_num = 0
        self.current_action = ProfilerAction.NONE
        self._session: Any = None
        self._step_range: Optional[record_function] = None
        self._events = EventList()
        cuda = ProfilerActivity.CUDA in acts
        self._notes = []
        if cuda and not _recorder._cupy():
            self._notes.append("CUDA activity asked for, but CuPy sees no GPU: no device times")
        self._cuda = cuda

    # ---- the recording's life ---------------------------------------------------------------

    def __enter__(self) -> profile:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def start(self) -> None:
        """Begin (step 0 of the schedule)."""
        self.step_num = 0
        self.current_action = self.schedule(0)
        self._enter_action(ProfilerAction.NONE, self.current_action)

    def stop(self) -> None:
        """End: a cycle being recorded is finished and handed to ``on_trace_ready``."""
        self._close_step_range()
        if self.current_action in (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE):
            self._save()
        elif self.current_action == ProfilerAction.WARMUP:
            warnings.warn("the profiler stopped during warm-up: nothing was recorded",
                          RuntimeWarning, stacklevel=2)
            _recorder.stop()
        self.current_action = ProfilerAction.NONE

    def step(self) -> None:
        """Mark the end of a training step: the schedule says what the next one does."""
        self._close_step_range()
        previous = self.current_action
        self.step_num += 1
        self.current_action = self.schedule(self.step_num)
        if previous == ProfilerAction.RECORD_AND_SAVE:
            self._save()
            previous = ProfilerAction.NONE
        elif previous == ProfilerAction.WARMUP and self.current_action == ProfilerAction.NONE:
            _recorder.stop()
        elif previous == ProfilerAction.RECORD and self.current_action in (
                ProfilerAction.NONE, ProfilerAction.WARMUP):
            self._save()  # a schedule that ends a cycle without RECORD_AND_SAVE
            previous = ProfilerAction.NONE
        self._enter_action(previous, self.current_action)

    def _enter_action(self, previous: ProfilerAction, action: ProfilerAction) -> None:
        recording = (ProfilerAction.WARMUP, ProfilerAction.RECORD,
                     ProfilerAction.RECORD_AND_SAVE)
        if action in recording and previous not in recording:
            self._session = _recorder.start(self.record_shapes, self.profile_memory,
                                            self.with_stack, self._cuda)
        if previous == ProfilerAction.WARMUP and action != ProfilerAction.WARMUP and \
                self._session is not None:
            self._session.events.clear()  # warm-up steps are not part of the trace
        if action in recording and self.record_steps:
            self._step_range = record_function(f"ProfilerStep#{self.step_num}")
            self._step_range.__enter__()

    def _close_step_range(self) -> None:
        if self._step_range is not None:
            self._step_range.__exit__(None, None, None)
            self._step_range = None

    def _save(self) -> None:
        session = self._session
        events = _recorder.stop()
        self._session = None
        self._events = EventList(events, use_device="cuda" if self._cuda else None,
                                 profile_memory=self.profile_memory, notes=self._notes)
        self._origin = (session.origin_wall_us, session.pid) if session else (0.0, None)
        if self.on_trace_ready is not None:
            self.on_trace_ready(self)

    # ---- results ----------------------------------------------------------------------------

    def events(self) -> EventList:
        """The events of the last recorded cycle."""
        return self._events

    def key_averages(self, group_by_input_shape: bool = False, group_by_stack_n: int = 0,
                     group_by_overload_name: bool = False) -> EventList:
        """The events averaged by name (see :meth:`EventList.key_averages`)."""
        return self._events.key_averages(group_by_input_shape, group_by_stack_n)

    def table(self, *args: Any, **kwargs: Any) -> str:
        """``key_averages().table(...)``."""
        return self.key_averages().table(*args, **kwargs)

    def export_chrome_trace(self, path: str) -> None:
        """Write the last cycle's events as Chrome trace JSON."""
        origin, pid = getattr(self, "_origin", (0.0, None))
        self._events.export_chrome_trace(path, origin, pid)

    def export_stacks(self, path: str, metric: str = "self_cpu_time_total") -> None:
        """Write flame-graph stacks (needs ``with_stack=True``).

        Raises:
            RuntimeError: the profile was made without ``with_stack=True``.
        """
        if not self.with_stack:
            raise RuntimeError("export_stacks needs a profile made with with_stack=True")
        self._events.export_stacks(path, metric)

    @property
    def self_cpu_time_total(self) -> float:
        return self._events.self_cpu_time_total
