"""Where this process first imported ``mpi4py.MPI``, which starts MPI, for error messages.

Processes that no MPI launcher started (torchrun's, ``mp.Process``, several shells) must not
start MPI before ``init_process_group`` joins them into one job; when one did, the error says
which line to move. Importing this module (``import mpitensor`` does, before anything else
could import mpi4py.MPI) installs the finder; it only looks, never loads.
"""

from __future__ import annotations

import sys
import traceback
from typing import Any, Optional

_site: Optional[str] = None


class _Finder:
    """A meta-path finder that notes the first import of ``mpi4py.MPI`` and finds nothing."""

    @staticmethod
    def find_spec(name: str, path: Any = None, target: Any = None) -> None:
        global _site
        if _site is None and name == "mpi4py.MPI":
            _site = _importer()


def _importer() -> str:
    """The innermost frame outside the import machinery and mpi4py: the importing line."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        name = frame.filename.replace("\\", "/")
        if name.startswith("<frozen") or "/importlib/" in name or "/mpi4py/" in name:
            continue
        code = (frame.line or "").split("#")[0].strip()  # the statement, not its comment
        line = f": `{code}`" if code else ""
        return f"{frame.filename}, line {frame.lineno}, in {frame.name}{line}"
    return "unknown"


_FINDER = _Finder()


def install() -> None:
    """Start noting (where ``mpi4py.MPI`` is not imported yet)."""
    if "mpi4py.MPI" not in sys.modules and _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


install()


def site() -> Optional[str]:
    """``"FILE, line N, in FUNCTION: `the line`"`` of the first import seen, else None."""
    return _site
