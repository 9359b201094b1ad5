"""``torch.nn.modules.dropout``: :class:`Dropout`, :class:`Dropout2d`,
:class:`Dropout1d`, :class:`Dropout3d`, :class:`AlphaDropout`, :class:`FeatureAlphaDropout`.

Each is the identity in evaluation mode (``model.eval()``); in training it draws from
mpitensor's global generator.

Example:
    >>> import mpitensor as mt
    >>> AlphaDropout(0.2).eval()(mt.ones(2))
    tensor([1., 1.])
"""

from __future__ import annotations

import numbers

from mpitensor.tensor import Tensor

from .. import functional as F  # noqa: N812 - torch's spelling
from .module import Module

__all__ = ["Dropout1d", "Dropout3d", "AlphaDropout", "FeatureAlphaDropout", "Dropout", "Dropout2d"]


class _DropoutNd(Module):
    """What every dropout layer shares: ``p`` checked to lie in [0, 1] (kept as given, as torch
    keeps it), ``inplace``, and a forward through the functional form named ``_fname``."""

    _fname = ""

    def __init__(self, p: float = 0.5, inplace: bool = False) -> None:
        super().__init__()
        if isinstance(p, bool) or not isinstance(p, numbers.Real) or not 0 <= p <= 1:
            raise ValueError(f"dropout probability has to be between 0 and 1, but got {p!r}")
        self.p = p
        self.inplace = inplace

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002 - torch's name
        return getattr(F, self._fname)(input, self.p, self.training, self.inplace)

    def extra_repr(self) -> str:
        return f"p={self.p}, inplace={self.inplace}"


def _layer(name: str, fname: str, what: str) -> type:
    """A dropout layer that runs ``F.<fname>``; ``what`` is its docstring's first line."""
    doc = (f"{what}\n\n    Args and Raises: as :class:`Dropout`.\n\n    Example:\n"
           f"        >>> {name}()\n        {name}(p=0.5, inplace=False)\n    ")
    return type(name, (_DropoutNd,), {"_fname": fname, "__doc__": doc, "__module__": __name__})


Dropout1d = _layer("Dropout1d", "dropout1d", "Zero whole channels of (N, C, L) or (C, L) inputs "
                   "in training.")
Dropout3d = _layer("Dropout3d", "dropout3d", "Zero whole channels of (N, C, D, H, W) or "
                   "(C, D, H, W) inputs in training.")
AlphaDropout = _layer("AlphaDropout", "alpha_dropout", "Alpha dropout (for SELU networks) in "
                      "training.")
FeatureAlphaDropout = _layer("FeatureAlphaDropout", "feature_alpha_dropout",
                             "Alpha dropout of whole channels in training.")


class Dropout(_DropoutNd):
    """Zero each element with probability ``p`` in training, scaling the rest by 1/(1-p).

    In evaluation mode (``model.eval()``) it is the identity. The mask is drawn from
    mpitensor's global generator (``mpitensor.manual_seed``).

    Args:
        p: probability of zeroing an element, in [0, 1].
        inplace: overwrite the input.

    Raises:
        ValueError: ``p`` outside [0, 1].

    Example:
        >>> import mpitensor as mt
        >>> d = Dropout(0.5).eval()
        >>> d(mt.ones(3))
        tensor([1., 1., 1.])
    """

    _fname = "dropout"


class Dropout2d(_DropoutNd):
    """Zero whole channels with probability ``p`` in training, scaling the rest by 1/(1-p).

    Each (sample, channel) plane of an (N, C, H, W) input is kept or dropped as a whole
    (see :func:`~mpitensor.nn.functional.dropout2d`); in evaluation mode it is the identity.
    The draws come from mpitensor's global generator (``mpitensor.manual_seed``).

    Args and Raises: as :class:`Dropout`, ``p`` being the probability of zeroing a channel.

    Example:
        >>> import mpitensor as mt
        >>> Dropout2d(0.5).eval()(mt.ones(1, 2, 1, 1)).flatten()
        tensor([1., 1.])
    """

    _fname = "dropout2d"
