"""Digits: scikit-learn's bundled 8 x 8 handwritten digits, made to look like MNIST.

Needs scikit-learn (its ``load_digits`` data ships inside the package, so nothing is
downloaded). Each 8 x 8 image (values 0..16) is resized bilinearly (half-pixel centres, as
``F.interpolate(..., mode="bilinear", align_corners=False)``) to 20 x 20, scaled to 0..255
and centred in a 28 x 28 frame with a 4-pixel border, the way MNIST centres its digits in a
20 x 20 box. Images are normalised exactly like MNIST's.
"""

from __future__ import annotations

import functools
import os
from typing import Any, Callable, Optional, Union

import numpy as np

from mpitensor.tensor import Tensor

from .mnist import _ImageDataset

__all__ = ["Digits"]

_BOX = 20  # MNIST fits each digit into a 20 x 20 box centred in the 28 x 28 image
_SIDE = 28


def _bilinear_matrix(n_in: int, n_out: int) -> np.ndarray:
    """The n_out x n_in matrix of 1-D bilinear weights (half-pixel centres, edges clamped)."""
    src = (np.arange(n_out) + 0.5) * (n_in / n_out) - 0.5
    src = np.clip(src, 0, n_in - 1)
    lo = np.floor(src).astype(np.int64)
    hi = np.minimum(lo + 1, n_in - 1)
    w = src - lo
    m = np.zeros((n_out, n_in))
    np.add.at(m, (np.arange(n_out), lo), 1 - w)
    np.add.at(m, (np.arange(n_out), hi), w)
    return m


@functools.lru_cache(maxsize=1)
def _load() -> tuple:
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise ImportError("mpitensor.data.datasets.Digits needs scikit-learn: "
                          "pip install scikit-learn") from None
    d = load_digits()
    small = d.images.astype(np.float64)  # N x 8 x 8, values 0..16
    r = _bilinear_matrix(small.shape[1], _BOX)
    big = np.einsum("ij,njk,lk->nil", r, small, r)  # separable resize, one vectorised step
    box = np.clip(np.rint(big * (255.0 / 16.0)), 0, 255).astype(np.uint8)
    pad = (_SIDE - _BOX) // 2
    images = np.zeros((len(box), _SIDE, _SIDE), dtype=np.uint8)
    images[:, pad:pad + _BOX, pad:pad + _BOX] = box
    images.setflags(write=False)
    labels = d.target.astype(np.int64)
    labels.setflags(write=False)
    return images, labels


class Digits(_ImageDataset):
    """scikit-learn's 1,797 digits as 28 x 28 MNIST look-alikes, with a fixed train/test split.

    Same interface as :class:`~mpitensor.data.datasets.MNIST`: ``ds[i]`` is a normalised float32
    1 x 28 x 28 image and an int label, ``.data`` uint8 N x 28 x 28, ``.targets`` int64,
    ``arrays()``/``tensors()``/``gather()`` for vectorised batches. The split is a fixed
    permutation (``seed``) of all samples: the first ``round(split * 1797)`` (1,438 at the
    default 0.8) are the training set, the rest the test set, each in ascending index order,
    identical on every machine and rank.

    Args:
        root: ignored (the data ships with scikit-learn); accepted for MNIST compatibility.
        train: the training part, else the test part.
        transform, target_transform: callables applied per sample.
        download: ignored (nothing to download).
        split: fraction of samples in the training part, in (0, 1).
        seed: seed of the split permutation.
        normalize: apply MNIST's mean/std normalisation.

    Raises:
        ImportError: scikit-learn is not installed.
        ValueError: ``split`` outside (0, 1).

    Example:
        >>> ds = Digits(train=False)
        >>> len(ds), ds[0][0].shape
        (359, mpitensor.Size([1, 28, 28]))
    """

    def __init__(
        self,
        root: Optional[Union[str, os.PathLike]] = None,
        train: bool = True,
        transform: Optional[Callable[[Tensor], Any]] = None,
        target_transform: Optional[Callable[[int], Any]] = None,
        download: bool = False,
        *,
        split: float = 0.8,
        seed: int = 0,
        normalize: bool = True,
    ) -> None:
        if not 0 < split < 1:
            raise ValueError(f"split must be a fraction in (0, 1), got {split}")
        self.root = root
        self.train = train
        images, labels = _load()
        perm = np.random.default_rng(seed).permutation(len(labels))
        n_train = int(round(split * len(labels)))
        idx = np.sort(perm[:n_train] if train else perm[n_train:])
        self._init_arrays(images[idx], labels[idx], transform, target_transform, normalize)

    def __repr__(self) -> str:
        return (f"Dataset Digits (scikit-learn, 28x28)\n    Number of datapoints: {len(self)}\n"
                f"    Split: {'Train' if self.train else 'Test'}")
