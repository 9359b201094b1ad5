"""``torch.autograd.profiler``: the older spelling of the profiler (``profile``,
``record_function``), on :mod:`mpitensor.profiler`'s recorder.

Example:
    >>> import mpitensor as mt
    >>> with profile() as prof:
    ...     _ = mt.ones(2) + 1
    >>> [e.key for e in prof.key_averages()]
    ['ones', 'add']
"""

from __future__ import annotations

from typing import Any

from mpitensor.profiler import EventList, FunctionEvent, FunctionEventAvg, record_function
from mpitensor.profiler import profile as _profile
from mpitensor.profiler._profile import ProfilerActivity

__all__ = ["profile", "record_function", "EventList", "FunctionEvent", "FunctionEventAvg"]


class profile(_profile):  # noqa: N801 - torch's name
    """``torch.autograd.profiler.profile(enabled=True, use_cuda=False, record_shapes=False,
    profile_memory=False, with_stack=False, ...)``: records from ``__enter__`` to
    ``__exit__``; ``enabled=False`` records nothing."""

    def __init__(self, enabled: bool = True, *, use_cuda: bool = False,
                 use_device: Any = None, record_shapes: bool = False,
                 profile_memory: bool = False, with_stack: bool = False,
                 **options: Any) -> None:
        cuda = use_cuda or use_device in ("cuda", "cuda:0")
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        options.pop("use_cpu", None)
        options.pop("use_kineto", None)
        super().__init__(activities=acts, record_shapes=record_shapes,
                         profile_memory=profile_memory, with_stack=with_stack, **options)
        self.enabled = enabled

    def __enter__(self) -> profile:
        if self.enabled:
            self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.enabled:
            self.stop()

    def self_cpu_time_total_us(self) -> float:
        return self.self_cpu_time_total
