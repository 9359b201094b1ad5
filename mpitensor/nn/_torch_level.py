"""The neural-network functions torch also has at its top level (``torch.conv2d``,
``torch.layer_norm``, ``torch.dropout``, ...), with torch's top-level signatures, which are
not always those of ``torch.nn.functional`` (``torch.embedding(weight, indices)`` takes its
arguments the other way round, ``torch.dropout(input, p, train)`` has no default for
``train``). ``mpitensor/__init__.py`` exports :data:`__all__`."""

from __future__ import annotations

__all__: list = []
