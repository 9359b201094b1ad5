"""``nn.AdaptiveLogSoftmaxWithLoss``: the efficient softmax of Grave et al. for large output
spaces. Frequent classes (below ``cutoffs[0]``) sit in a head softmax together with one
entry per cluster of rarer classes; each cluster has its own smaller softmax, reached through
a projection shrunk by ``div_value`` per cluster.

Example:
    >>> import mpitensor as mt
    >>> asm = AdaptiveLogSoftmaxWithLoss(16, 10, [4, 7])
    >>> out = asm(mt.randn(3, 16), mt.tensor([0, 5, 9]))
    >>> tuple(out.output.shape), tuple(out.loss.shape)
    ((3,), ())
"""

from __future__ import annotations

from collections import namedtuple
from typing import Any, Sequence

import numpy as np

from mpitensor import dtypes as _dt
from mpitensor._ops.combine import cat
from mpitensor.autograd import no_grad
from mpitensor.tensor import Tensor

from .. import functional as F  # noqa: N812 - torch's spelling
from .._functional.checks import as_tensor
from .container import ModuleList, Sequential
from .linear import Linear
from .module import Module

__all__ = ["AdaptiveLogSoftmaxWithLoss"]

_ASMoutput = namedtuple("_ASMoutput", ["output", "loss"])


class AdaptiveLogSoftmaxWithLoss(Module):
    """Adaptive softmax: log-probabilities of the targets, and their mean negative as loss.

    Args:
        in_features: the size of each input row.
        n_classes: the number of classes.
        cutoffs: increasing class boundaries in (0, n_classes) that split the classes into
            the head's shortlist and the clusters.
        div_value: each cluster's projection is ``div_value`` times narrower than the last.
        head_bias: give the head a bias.
        device, dtype: where and in which float dtype to create the parameters.

    Raises:
        ValueError: cutoffs that are not increasing unique ints in (0, n_classes).

    Example:
        >>> AdaptiveLogSoftmaxWithLoss(8, 10, [4]).head
        Linear(in_features=8, out_features=5, bias=False)
    """

    def __init__(self, in_features: int, n_classes: int, cutoffs: Sequence[int],
                 div_value: float = 4.0, head_bias: bool = False, device: Any = None,
                 dtype: Any = None) -> None:
        super().__init__()
        cutoffs = list(cutoffs)
        if len(cutoffs) == 0:
            raise ValueError("AdaptiveLogSoftmaxWithLoss: cutoffs must hold at least one "
                             "value")
        if (cutoffs != sorted(cutoffs) or min(cutoffs) <= 0 or max(cutoffs) > n_classes - 1
                or len(set(cutoffs)) != len(cutoffs)
                or any(int(c) != c for c in cutoffs)):
            raise ValueError(f"AdaptiveLogSoftmaxWithLoss: cutoffs must be unique increasing "
                             f"ints between 1 and n_classes - 1 ({n_classes - 1}), got "
                             f"{cutoffs}")
        self.in_features = in_features
        self.n_classes = n_classes
        self.cutoffs = [int(c) for c in cutoffs] + [n_classes]
        self.div_value = div_value
        self.head_bias = head_bias
        self.shortlist_size = self.cutoffs[0]
        self.n_clusters = len(self.cutoffs) - 1
        self.head_size = self.shortlist_size + self.n_clusters
        self.head = Linear(in_features, self.head_size, bias=head_bias, device=device,
                           dtype=dtype)
        self.tail = ModuleList()
        for i in range(self.n_clusters):
            hsz = int(in_features // (div_value ** (i + 1)))
            osz = self.cutoffs[i + 1] - self.cutoffs[i]
            self.tail.append(Sequential(
                Linear(in_features, hsz, bias=False, device=device, dtype=dtype),
                Linear(hsz, osz, bias=False, device=device, dtype=dtype)))

    def reset_parameters(self) -> None:
        """Re-draw the head's and the clusters' weights."""
        self.head.reset_parameters()
        for proj, out in self.tail:
            proj.reset_parameters()
            out.reset_parameters()

    def _rows(self, input: Tensor, fname: str) -> tuple:  # noqa: A002 - torch's name
        if input.ndim not in (1, 2):
            raise RuntimeError(f"{fname}: expected a 1-D or 2-D input, got shape "
                               f"{tuple(input.shape)}")
        if input.shape[-1] != self.in_features:
            raise RuntimeError(f"{fname}: expected {self.in_features} input features, got "
                               f"{input.shape[-1]}")
        return (input.unsqueeze(0), False) if input.ndim == 1 else (input, True)

    def forward(self, input: Tensor, target: Tensor) -> _ASMoutput:  # noqa: A002
        """The target classes' log-probabilities ``output`` (N,) and ``loss``, the mean of
        their negatives.

        Raises:
            RuntimeError: a bad input rank, batch sizes that differ, a target out of range.
        """
        fname = "AdaptiveLogSoftmaxWithLoss"
        x, batched = self._rows(input, fname)
        tgt = as_tensor(target, "target", fname)
        t = np.asarray(Tensor._wrap(tgt._data).cpu().numpy()).reshape(-1)
        if (tgt.ndim != (1 if batched else 0)) or t.shape[0] != x.shape[0]:
            raise RuntimeError(f"{fname}: input and target must have the same batch size, got "
                               f"input {tuple(input.shape)} and target {tuple(tgt.shape)}")
        if _dt.kind_of(t.dtype) not in "iu":
            raise RuntimeError(f"{fname}: target must hold class indices, got {t.dtype}")
        if t.size and (t.min() < 0 or t.max() >= self.n_classes):
            raise RuntimeError(f"{fname}: target values must lie in [0, {self.n_classes - 1}], "
                               f"got values in [{t.min()}, {t.max()}]")
        t = t.astype(np.int64)
        n = t.shape[0]
        head_lp = F.log_softmax(self.head(x), dim=1)
        # the head entry each row reads: its own class, or its cluster's entry
        cluster = np.searchsorted(np.asarray(self.cutoffs), t, side="right")
        head_col = np.where(cluster == 0, t, self.shortlist_size + cluster - 1)
        output = head_lp[np.arange(n), head_col]
        parts, order = [], []
        for i in range(1, self.n_clusters + 1):
            rows = np.nonzero(cluster == i)[0]
            if rows.size == 0:
                continue
            local = F.log_softmax(self.tail[i - 1](x[rows]), dim=1)
            parts.append(local[np.arange(rows.size), t[rows] - self.cutoffs[i - 1]])
            order.append(rows)
        if parts:
            rows = np.concatenate(order)
            back = np.empty(n, dtype=np.int64)
            # rows of the shortlist read a zero appended after the cluster values
            back[:] = rows.size
            back[rows] = np.arange(rows.size)
            zero = output[:1] * 0 if n else output
            output = output + cat([*parts, zero.detach()])[back]
        loss = (-output).mean()
        return _ASMoutput(output if batched else output[0], loss)

    def _full_log_prob(self, x: Tensor, head_out: Tensor) -> Tensor:
        head_lp = F.log_softmax(head_out, dim=1)
        cols = [head_lp[:, :self.shortlist_size]]
        for i, layers in enumerate(self.tail):
            cluster_lp = F.log_softmax(layers(x), dim=1)
            cols.append(cluster_lp + head_lp[:, self.shortlist_size + i].unsqueeze(1))
        return cat(cols, dim=1)

    def log_prob(self, input: Tensor) -> Tensor:  # noqa: A002 - torch's name
        """Log-probabilities of every class: (N, n_classes), or (n_classes,) for one row.

        Example:
            >>> import mpitensor as mt
            >>> asm = AdaptiveLogSoftmaxWithLoss(8, 10, [4])
            >>> round(float(asm.log_prob(mt.randn(2, 8)).exp().sum(1)[0]), 5)
            1.0
        """
        x, batched = self._rows(input, "AdaptiveLogSoftmaxWithLoss.log_prob")
        out = self._full_log_prob(x, self.head(x))
        return out if batched else out[0]

    def predict(self, input: Tensor) -> Tensor:  # noqa: A002 - torch's name
        """The most likely class of each row (int64): (N,), or a scalar for one row.

        Example:
            >>> import mpitensor as mt
            >>> AdaptiveLogSoftmaxWithLoss(8, 10, [4]).predict(mt.randn(3, 8)).shape
            mpitensor.Size([3])
        """
        x, batched = self._rows(input, "AdaptiveLogSoftmaxWithLoss.predict")
        with no_grad():
            out = self._full_log_prob(x, self.head(x)).argmax(dim=1)
        return out if batched else out[0]
