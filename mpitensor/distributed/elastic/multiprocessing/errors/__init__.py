"""``torch.distributed.elastic.multiprocessing.errors``: ``@record`` for a program's entry point.

``@record`` on ``main`` lets an exception through unchanged, and first writes it (its type,
message and traceback, with a timestamp) as JSON to the file ``TORCHELASTIC_ERROR_FILE``
names, where a launcher set one (torchrun does, per worker, to report the first failure).
``SystemExit(0)`` from the entry point returns None, as torch's wrapper does, so a program run
through ``runpy`` does not stop the launcher's own code.

Example:
    >>> from mpitensor.distributed.elastic.multiprocessing.errors import record
    >>> @record
    ... def main():
    ...     pass
"""

from __future__ import annotations

import functools
import json
import os
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Optional, Tuple

__all__ = ["ChildFailedError", "ErrorHandler", "ProcessFailure", "get_error_handler", "record"]

ERROR_FILE_ENV = "TORCHELASTIC_ERROR_FILE"
_NO_FILE = "<N/A>"


class ErrorHandler:
    """Writes an entry point's exception to the error file a launcher asked for."""

    def _file(self) -> Optional[str]:
        return os.environ.get(ERROR_FILE_ENV) or None

    def initialize(self) -> None:
        """Called once before the entry point runs (nothing to prepare here)."""

    def record_exception(self, e: BaseException) -> None:
        """Write ``e`` to the error file, if one is set (replacing the file atomically)."""
        path = self._file()
        if path is None:
            return
        text = "".join(traceback.format_exception(type(e), e, e.__traceback__))
        self._write(path, {"message": {
            "message": f"{type(e).__name__}: {e}",
            "extraInfo": {"py_callstack": text, "timestamp": str(int(time.time()))}}})

    def dump_error_file(self, error_file: str, error_code: int = 0) -> None:
        """Copy a failed child's error file into this process's own (a launcher's parent)."""
        path = self._file()
        if path is None or not os.path.exists(error_file):
            return
        with open(error_file, encoding="utf-8") as f:
            data = json.load(f)
        if error_code and isinstance(data.get("message"), dict):
            data["message"].setdefault("errorCode", error_code)
        self._write(path, data)

    @staticmethod
    def _write(path: str, data: Dict[str, Any]) -> None:
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(data, f)
        os.replace(tmp, path)


def get_error_handler() -> ErrorHandler:
    """The handler ``@record`` uses by default."""
    return ErrorHandler()


@dataclass
class ProcessFailure:
    """One failed worker: its local rank, pid, exit code and error file (if it wrote one)."""

    local_rank: int
    pid: int
    exitcode: int
    error_file: str = _NO_FILE
    message: str = field(default="", init=False)
    timestamp: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self.timestamp = int(time.time())
        if self.error_file != _NO_FILE and os.path.exists(self.error_file):
            try:
                with open(self.error_file, encoding="utf-8") as f:
                    msg = json.load(f).get("message", {})
                self.message = msg.get("message", "") if isinstance(msg, dict) else str(msg)
            except (OSError, ValueError):
                self.message = f"unreadable error file {self.error_file}"
        else:
            self.message = f"exit code {self.exitcode} (no error file: decorate the entry " \
                           f"point with @record for a traceback)"


class ChildFailedError(Exception):
    """Workers of a launch failed: ``failures`` maps each failed global rank to its
    :class:`ProcessFailure`."""

    def __init__(self, name: str, failures: Dict[int, ProcessFailure]) -> None:
        if not failures:
            raise ValueError("ChildFailedError needs at least one failure")
        self.name, self.failures = name, failures
        rank, first = self.get_first_failure()
        super().__init__(f"{name} failed: rank {rank} (pid {first.pid}): {first.message}")

    def get_first_failure(self) -> Tuple[int, ProcessFailure]:
        """The failure that happened first (the lowest rank among equal times)."""
        rank = min(self.failures, key=lambda r: (self.failures[r].timestamp, r))
        return rank, self.failures[rank]


def record(fn: Callable, error_handler: Optional[ErrorHandler] = None) -> Callable:
    """Decorate an entry point: its exceptions are written to the launcher's error file (see
    the module's notes), then raised as they were."""
    handler = error_handler if error_handler is not None else get_error_handler()

    @functools.wraps(fn)
    def entry(*args: Any, **kwargs: Any) -> Any:
        handler.initialize()
        try:
            return fn(*args, **kwargs)
        except SystemExit as exc:
            if exc.code == 0:
                return None
            raise
        except ChildFailedError as exc:
            _, first = exc.get_first_failure()
            if first.error_file != _NO_FILE:
                handler.dump_error_file(first.error_file, first.exitcode)
            raise
        except Exception as exc:
            handler.record_exception(exc)
            raise
    return entry
