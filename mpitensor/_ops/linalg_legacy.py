"""torch's linear-algebra functions outside ``torch.linalg`` (``torch.qr``, ``torch.svd``,
``torch.cholesky``, ``torch.lu``, ``torch.triangular_solve``, ...) and their Tensor methods,
with torch's conventions where they differ from ``torch.linalg``'s (``torch.svd`` returns
``V``, not ``Vh``; ``torch.cholesky(upper=...)``). ``mpitensor/__init__.py`` exports
:data:`__all__`."""

from __future__ import annotations

__all__: list = []
