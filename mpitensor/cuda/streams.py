"""``torch.cuda``'s ``Event`` and ``Stream``, on CuPy's events and streams.

GPU work that mpitensor queues goes to CuPy's current stream, so ``with torch.cuda.stream(s):``
(which makes ``s`` CuPy's current stream) decides where it runs. Without a GPU, making an
``Event`` or a ``Stream`` raises :class:`~mpitensor.cuda.CudaUnavailableError` (a RuntimeError,
as a CPU-only torch raises), as do ``current_stream`` and ``default_stream``;
``stream(None)`` is a context that changes nothing, as in torch.

Example:
    >>> import mpitensor as torch
    >>> if torch.cuda.is_available():
    ...     start = torch.cuda.Event(enable_timing=True)
    ...     end = torch.cuda.Event(enable_timing=True)
    ...     start.record(); y = torch.ones(1000, device="cuda").sum(); end.record()
    ...     end.synchronize(); ms = start.elapsed_time(end)
"""

from __future__ import annotations

from typing import Any, Optional

from mpitensor._core.devices import cuda_index_arg

from ._common import DeviceArg, _cupy, _resolve

__all__ = ["Event", "Stream", "current_stream", "default_stream", "stream", "set_stream",
           "StreamContext"]


class Stream:
    """A CUDA stream: a queue of GPU work that runs in order (CuPy's ``cupy.cuda.Stream``).

    Args:
        device: the GPU the stream belongs to (the current one by default).
        priority: lower numbers run first where the GPU supports priorities (0: default).

    Raises:
        CudaUnavailableError: no GPU can be used.
    """

    def __init__(self, device: DeviceArg = None, priority: int = 0, **kwargs: Any) -> None:
        cp = _cupy("Stream")
        self.device_index = _resolve(cp, cuda_index_arg(device, "Stream"), "Stream")
        self.priority = int(priority)
        handle = kwargs.pop("_cupy_stream", None)
        if kwargs:
            raise TypeError(f"Stream(): unexpected arguments {sorted(kwargs)}")
        if handle is None:
            with cp.cuda.Device(self.device_index):
                handle = cp.cuda.Stream(non_blocking=False, priority=self.priority)
        self._cp = handle

    @property
    def device(self) -> Any:
        """The ``device("cuda", N)`` of the stream."""
        from mpitensor import backend

        return backend.device("cuda", self.device_index)

    @property
    def cuda_stream(self) -> int:
        """The raw ``cudaStream_t`` handle as an int (0: the default stream)."""
        return int(self._cp.ptr)

    def query(self) -> bool:
        """Return whether all work queued on the stream has finished."""
        return bool(self._cp.done)

    def synchronize(self) -> None:
        """Wait until all work queued on the stream has finished."""
        self._cp.synchronize()

    def wait_event(self, event: Event) -> None:
        """Make later work on this stream wait for ``event`` (the host does not wait)."""
        self._cp.wait_event(event._cp)

    def wait_stream(self, stream: Stream) -> None:
        """Make later work on this stream wait for the work queued on ``stream`` so far."""
        self.wait_event(stream.record_event())

    def record_event(self, event: Optional[Event] = None) -> Event:
        """Record ``event`` (a new one by default) on this stream and return it."""
        event = Event() if event is None else event
        event.record(self)
        return event

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Stream) and other.cuda_stream == self.cuda_stream \
            and other.device_index == self.device_index

    def __hash__(self) -> int:
        return hash((self.cuda_stream, self.device_index))

    def __repr__(self) -> str:
        return (f"<mpitensor.cuda.Stream device=cuda:{self.device_index} "
                f"cuda_stream={self.cuda_stream:#x}>")


class Event:
    """A CUDA event: a marker in a stream to wait for or to time (``cupy.cuda.Event``).

    Args:
        enable_timing: allow :meth:`elapsed_time` (costs a little).
        blocking: :meth:`synchronize` sleeps instead of spinning.
        interprocess: may be shared with another process (then no timing).

    Raises:
        CudaUnavailableError: no GPU can be used.
    """

    def __init__(self, enable_timing: bool = False, blocking: bool = False,
                 interprocess: bool = False) -> None:
        cp = _cupy("Event")
        self.enable_timing, self.blocking, self.interprocess = enable_timing, blocking, \
            interprocess
        self._cp = cp.cuda.Event(block=blocking, disable_timing=not enable_timing,
                                  interprocess=interprocess)

    def record(self, stream: Optional[Stream] = None) -> None:
        """Mark the point reached by ``stream`` (the current stream by default)."""
        self._cp.record(current_stream()._cp if stream is None else stream._cp)

    def wait(self, stream: Optional[Stream] = None) -> None:
        """Make later work on ``stream`` (the current one) wait for this event."""
        (current_stream() if stream is None else stream).wait_event(self)

    def query(self) -> bool:
        """Return whether the work before the recorded point has finished."""
        return bool(self._cp.done)

    def synchronize(self) -> None:
        """Wait until the work before the recorded point has finished."""
        self._cp.synchronize()

    def elapsed_time(self, end_event: Event) -> float:
        """Return the milliseconds between this event and ``end_event`` (both recorded and
        made with ``enable_timing=True``)."""
        cp = _cupy("Event.elapsed_time")
        return float(cp.cuda.get_elapsed_time(self._cp, end_event._cp))

    def ipc_handle(self) -> Any:
        """Not supported: sharing events between processes."""
        raise NotImplementedError("mpitensor.cuda.Event.ipc_handle(): sharing CUDA events "
                                  "between processes is not supported")

    def __repr__(self) -> str:
        return f"<mpitensor.cuda.Event enable_timing={self.enable_timing}>"


def _stream_of(cp: Any, device: DeviceArg, what: str, default: bool) -> Stream:
    dev = _resolve(cp, cuda_index_arg(device, what), what)
    with cp.cuda.Device(dev):
        handle = cp.cuda.Stream.null if default else cp.cuda.get_current_stream()
    return Stream(dev, _cupy_stream=handle)


def current_stream(device: DeviceArg = None) -> Stream:
    """Return the stream GPU work now goes to on a GPU (the current one by default).

    Raises:
        CudaUnavailableError: no GPU can be used.
    """
    return _stream_of(_cupy("current_stream"), device, "current_stream", False)


def default_stream(device: DeviceArg = None) -> Stream:
    """Return a GPU's default (legacy null) stream.

    Raises:
        CudaUnavailableError: no GPU can be used.
    """
    return _stream_of(_cupy("default_stream"), device, "default_stream", True)


def set_stream(stream: Stream) -> None:
    """Make ``stream`` the current stream of its GPU (None: change nothing)."""
    if stream is not None:
        stream._cp.use()


class StreamContext:
    """A context manager that makes ``stream`` current inside a ``with`` block (None: no-op)."""

    def __init__(self, stream: Optional[Stream]) -> None:
        self.stream = stream
        self._prev: Any = None

    def __enter__(self) -> Optional[Stream]:
        if self.stream is not None:
            self._prev = _cupy("stream").cuda.get_current_stream()
            self.stream._cp.use()
        return self.stream

    def __exit__(self, *exc: Any) -> None:
        if self._prev is not None:
            self._prev.use()
            self._prev = None


def stream(stream: Optional[Stream]) -> StreamContext:
    """A context in which GPU work goes to ``stream`` (None: change nothing)."""
    return StreamContext(stream)


class ExternalStream(Stream):
    """A CUDA stream made elsewhere (by another library), known by its raw handle.

    mpitensor does not own it: the stream is neither created nor destroyed here.

    Args:
        stream_ptr: the ``cudaStream_t`` handle, an int.
        device: the GPU the stream belongs to (the current one by default).

    Raises:
        CudaUnavailableError: no GPU can be used.
    """

    def __init__(self, stream_ptr: int, device: DeviceArg = None, **kwargs: Any) -> None:
        cp = _cupy("ExternalStream")
        idx = _resolve(cp, cuda_index_arg(device, "ExternalStream"), "ExternalStream")
        handle = cp.cuda.ExternalStream(int(stream_ptr), device_id=idx)
        super().__init__(idx, _cupy_stream=handle, **kwargs)


def get_stream_from_external(data_ptr: int, device: DeviceArg = None) -> Stream:
    """Return an :class:`ExternalStream` for a ``cudaStream_t`` handle made elsewhere.

    Raises:
        CudaUnavailableError: no GPU can be used.
    """
    return ExternalStream(data_ptr, device)


__all__ += ["ExternalStream", "get_stream_from_external"]
