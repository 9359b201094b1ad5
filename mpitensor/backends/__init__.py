"""``mpitensor.backends``: torch's per-backend switches, for programs that set them.

``backends.cudnn`` and ``backends.cuda.matmul`` hold flags a torch program sets at start-up
(``torch.backends.cudnn.benchmark = True``); mpitensor keeps them, checks they are booleans and
otherwise ignores them, since it calls neither cuDNN nor TF32 matmuls (its convolutions are
NumPy/CuPy matrix products). ``backends.mps`` answers that there is no Apple GPU support.

Example:
    >>> import mpitensor as torch
    >>> torch.backends.cudnn.benchmark = True
    >>> torch.backends.mps.is_available()
    False
"""

from __future__ import annotations

from . import cuda, cudnn, mps

__all__ = ["cuda", "cudnn", "mps"]
