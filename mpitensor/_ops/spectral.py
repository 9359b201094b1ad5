"""Windows and the short-time Fourier transform: ``torch.hann_window`` and the other window
functions, ``torch.stft`` / ``torch.istft`` and their Tensor methods
(``mpitensor.signal.windows`` has torch.signal's window family). ``mpitensor/__init__.py``
exports :data:`__all__`."""

from __future__ import annotations

__all__: list = []
