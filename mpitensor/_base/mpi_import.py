"""The first import of ``mpi4py.MPI``, which starts MPI: where it was, and MPICH's settings.

Processes that no MPI launcher started (torchrun's, ``mp.Process``, several shells) must not
start MPI before ``init_process_group`` joins them into one job; when one did, the error says
which line to move. Importing this module (``import mpitensor`` does, before anything else
could import mpi4py.MPI) installs the finder; it only looks, never loads.

Just before that import runs ``MPI_Init``, the finder also sets :data:`MPICH_ALGORITHMS`, the
algorithms MPICH is to use for the non-blocking collectives, where the environment names none
and ``MPITENSOR_MPI_ALGORITHMS`` is not ``off``. Our blocking collectives run on the
non-blocking MPI calls (so that a wait can time out and see a peer fail), and for some sizes
MPICH's default choice for those is many times slower than its blocking call: see
docs/distributed.md, "MPICH's algorithms". A program that imports ``mpi4py.MPI`` before
``mpitensor`` starts MPI with MPICH's defaults (set the variables in the environment instead).
"""

from __future__ import annotations

import os
import sys
import traceback
from typing import Any, Dict, Optional

from . import config as _config

_site: Optional[str] = None

ENV_ALGORITHMS = _config.ENV_MPI_ALGORITHMS

#: MPICH control variable -> value, set before ``MPI_Init`` where the environment has none.
#: Each was picked by measurement against MPICH's default and its blocking call
#: (docs/distributed.md); an algorithm MPICH cannot use for a call (a non-commutative
#: operation, say) falls back to its own choice (``MPIR_CVAR_COLLECTIVE_FALLBACK``'s default).
MPICH_ALGORITHMS: Dict[str, str] = {
    # recursive halving, the default below 512 KiB, ran 10-100x slower than pairwise exchange
    # from 128 KiB (2 ranks, MPICH 5.0.2), and no faster below
    "MPIR_CVAR_IREDUCE_SCATTER_BLOCK_INTRA_ALGORITHM": "sched_pairwise",
    "MPIR_CVAR_IREDUCE_SCATTER_INTRA_ALGORITHM": "sched_pairwise",
}


def set_algorithms(environ: Any = None) -> Dict[str, str]:
    """Set :data:`MPICH_ALGORITHMS` in ``environ`` (default ``os.environ``) where it names
    none, unless ``MPITENSOR_MPI_ALGORITHMS`` is ``off``; return what was set."""
    environ = os.environ if environ is None else environ
    if _config.mpi_algorithms() == "off":
        return {}
    added = {}
    for name, value in MPICH_ALGORITHMS.items():
        if not environ.get(name, "").strip():
            environ[name] = added[name] = value
    return added


class _Finder:
    """A meta-path finder that notes the first import of ``mpi4py.MPI`` and finds nothing."""

    @staticmethod
    def find_spec(name: str, path: Any = None, target: Any = None) -> None:
        global _site
        if _site is None and name == "mpi4py.MPI":
            _site = _importer()
            set_algorithms()  # before the import runs MPI_Init


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
