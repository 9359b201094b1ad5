"""torch's process-wide switches and odds and ends at its top level
(``use_deterministic_algorithms``, ``set_warn_always``, ``is_inference_mode_enabled``,
``typename``, ...) and the strided-view family (``as_strided``). ``mpitensor/__init__.py``
exports :data:`__all__`."""

from __future__ import annotations

__all__: list = []
