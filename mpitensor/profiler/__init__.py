"""``torch.profiler`` for mpitensor: the time and call count of each op, ``record_function``
ranges, a step schedule, Chrome traces and torch's summary table.

While a :class:`profile` records, mpitensor's op entry points (Tensor methods and operators,
the functions of ``mpitensor``, ``nn.functional``, ``linalg``, ``fft``, ``special``) and each
op's backward are timed; outside one they are untouched (see ``_recorder``). Op names are
mpitensor's (``linear``, ``add``, ``MulBackward``), not torch's ``aten::`` names.

Example:
    >>> import mpitensor as mt
    >>> from mpitensor.profiler import profile, record_function, ProfilerActivity
    >>> with profile(activities=[ProfilerActivity.CPU]) as prof:
    ...     with record_function("step"):
    ...         y = (mt.ones(4, 4) @ mt.ones(4, 4)).relu()
    >>> sorted(e.key for e in prof.key_averages())
    ['matmul', 'ones', 'relu', 'step']
"""

from __future__ import annotations

from ._events import EventList, FunctionEvent, FunctionEventAvg
from ._profile import (
    ProfilerAction,
    ProfilerActivity,
    profile,
    record_function,
    schedule,
    supported_activities,
    tensorboard_trace_handler,
)

__all__ = ["profile", "record_function", "ProfilerActivity", "ProfilerAction", "schedule",
           "tensorboard_trace_handler", "supported_activities", "EventList", "FunctionEvent",
           "FunctionEventAvg"]
