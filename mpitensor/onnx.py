"""``mpitensor.onnx`` (``torch.onnx``): importable, so programs that import it run; exporting
is not supported, and says so.

Example:
    >>> import mpitensor as torch
    >>> torch.onnx.is_in_onnx_export()
    False
"""

from __future__ import annotations

from typing import Any

__all__ = ["export", "is_in_onnx_export", "OnnxExporterError"]


class OnnxExporterError(RuntimeError):
    """What an export raises here (a RuntimeError, as torch's export errors are)."""


def export(model: Any = None, args: Any = (), f: Any = None, *a: Any, **kw: Any) -> Any:
    """Raise :class:`OnnxExporterError`: mpitensor cannot export ONNX graphs."""
    raise OnnxExporterError(
        "torch.onnx.export is not supported by mpitensor: exporting needs torch's tracer. "
        "Save the weights (torch.save(model.state_dict(), path)), load them into the same "
        "model under torch, and export from there")


def is_in_onnx_export() -> bool:
    """False: no export is ever running here."""
    return False
