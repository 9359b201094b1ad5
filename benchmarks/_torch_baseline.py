"""What the benchmarks need to run their torch rows: whether torch (with gloo) is there, and a
free local port for torch.distributed's TCP rendezvous. Imported by the benchmark scripts of
this folder (their own directory is on ``sys.path`` when they run)."""

from __future__ import annotations

import socket


def torch_missing_reason() -> str:
    """'' when torch with gloo imports, else why not (the benchmarks skip torch's rows)."""
    try:
        import torch.distributed as tdist
    except Exception as exc:  # ImportError, or a broken install
        return f"torch is not importable ({type(exc).__name__}: {exc})"
    if not tdist.is_available() or not tdist.is_gloo_available():
        return "this torch build has no distributed/gloo support"
    return ""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
