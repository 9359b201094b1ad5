"""``mpitensor.utils.tensorboard`` (``torch.utils.tensorboard``): ``SummaryWriter``, writing
TensorBoard event files through the tensorboardX package (``pip install 'mpitensor[tensorboard]'``).

Every ``add_*`` method of torch's writer is here with its arguments; mpitensor tensors (and
CuPy arrays) are handed to tensorboardX as NumPy arrays. ``add_graph`` needs torch's tracer and
raises NotImplementedError saying so. The files are ordinary TensorBoard event files:
``tensorboard --logdir runs`` shows them.

Example:
    >>> import mpitensor as torch
    >>> from mpitensor.utils.tensorboard import SummaryWriter  # doctest: +SKIP
    >>> with SummaryWriter("runs/demo") as w:  # doctest: +SKIP
    ...     w.add_scalar("loss", torch.tensor(0.5), global_step=1)
"""

from __future__ import annotations

from typing import Any

from mpitensor.tensor import Tensor

__all__ = ["SummaryWriter"]


def _plain(x: Any) -> Any:
    """Tensors (and CuPy arrays) as NumPy arrays or Python numbers; containers walked."""
    if isinstance(x, Tensor):
        x = x.detach()._data
    if hasattr(x, "get") and type(x).__module__.startswith("cupy"):
        x = x.get()
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)) and any(isinstance(v, Tensor) for v in x):
        return type(x)(_plain(v) for v in x)
    return x


def _writer_class() -> type:
    try:
        from tensorboardX import SummaryWriter as _Writer  # noqa: PLC0415 - optional
    except ImportError as exc:
        raise ImportError(
            "mpitensor.utils.tensorboard writes TensorBoard files through the tensorboardX "
            "package, which is not installed: pip install 'mpitensor[tensorboard]' (or "
            "pip install tensorboardX)") from exc
    return _Writer


class SummaryWriter:
    """torch's ``SummaryWriter(log_dir=None, comment='', purge_step=None, max_queue=10,
    flush_secs=120, filename_suffix='')``, writing through tensorboardX.

    Raises:
        ImportError: tensorboardX is not installed (the message says how to get it).
    """

    def __init__(self, log_dir: Any = None, comment: str = "", purge_step: Any = None,
                 max_queue: int = 10, flush_secs: int = 120, filename_suffix: str = "") -> None:
        self._w = _writer_class()(logdir=log_dir, comment=comment, purge_step=purge_step,
                                  max_queue=max_queue, flush_secs=flush_secs,
                                  filename_suffix=filename_suffix)

    @property
    def log_dir(self) -> str:
        """The folder the event files go to."""
        return self._w.logdir

    def get_logdir(self) -> str:
        return self._w.logdir

    def add_graph(self, model: Any, input_to_model: Any = None, verbose: bool = False,
                  use_strict_trace: bool = True) -> None:
        """Raise NotImplementedError: a model's graph comes from torch's tracer."""
        raise NotImplementedError(
            "SummaryWriter.add_graph traces the model with torch.jit, which mpitensor does not "
            "have; log scalars, histograms and images instead")

    def flush(self) -> None:
        self._w.flush()

    def close(self) -> None:
        self._w.close()

    def __enter__(self) -> "SummaryWriter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __getattr__(self, name: str) -> Any:
        if not name.startswith("add_"):
            raise AttributeError(f"SummaryWriter has no attribute {name!r}")
        method = getattr(self._w, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            return method(*(_plain(a) for a in args), **{k: _plain(v) for k, v in
                                                           kwargs.items()})

        call.__name__ = name
        call.__doc__ = f"torch's SummaryWriter.{name}, tensors passed as NumPy arrays."
        return call
