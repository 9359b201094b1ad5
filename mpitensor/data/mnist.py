"""MNIST: an IDX reader that validates what it reads, a verified downloader, and the dataset.

The IDX format (LeCun et al.): a 4-byte big-endian magic (two zero bytes, a type code, the
number of dimensions), one big-endian int32 per dimension, then the data. MNIST images have
magic 2051 (unsigned bytes, 3 dims: N x 28 x 28), labels 2049 (unsigned bytes, 1 dim: N).
Files may be gzip-compressed (``.gz``) or raw.
"""

from __future__ import annotations

import gzip
import hashlib
import logging
import os
import tempfile
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Callable, Optional, Union

import numpy as np

from mpitensor._base import config as _config
from mpitensor._core.opkit import wrap
from mpitensor.errors import MpiTensorError
from mpitensor.tensor import Tensor, as_tensor

from .dataset import Dataset, _index_array, _take

__all__ = [
    "DatasetError",
    "DatasetNotFoundError",
    "DatasetCorruptError",
    "DownloadError",
    "MNIST",
    "read_idx",
    "download_mnist",
    "MNIST_MIRRORS",
    "MNIST_RESOURCES",
    "MNIST_MEAN",
    "MNIST_STD",
]

_log = logging.getLogger("mpitensor.data")

MNIST_MEAN = 0.1307
MNIST_STD = 0.3081

#: Mirrors tried in order (torchvision's list); override with ``mirrors=`` or the environment
#: variable ``MPITENSOR_MNIST_MIRRORS`` (URLs separated by commas or spaces).
MNIST_MIRRORS = (
    "https://ossci-datasets.s3.amazonaws.com/mnist/",
    "http://yann.lecun.com/exdb/mnist/",
)

#: (file name, size in bytes, SHA-256) of the published gzip files. The t10k sums equal
#: ../shared/data/mnist/SHA256SUMS; the train sums are the ones listed, identically, by many
#: independent public MNIST downloaders (torch.rb's port of torchvision's MNIST among them).
#: torchvision itself lists MD5s (f68b3c2d..., d53e105e..., 9fb629c4..., ec29112d...).
MNIST_RESOURCES = (
    ("train-images-idx3-ubyte.gz", 9_912_422,
     "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609"),
    ("train-labels-idx1-ubyte.gz", 28_881,
     "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c"),
    ("t10k-images-idx3-ubyte.gz", 1_648_877,
     "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6"),
    ("t10k-labels-idx1-ubyte.gz", 4_542,
     "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6"),
)

_IDX_TYPES = {
    0x08: np.dtype(np.uint8), 0x09: np.dtype(np.int8), 0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"), 0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8"),
}
_IMAGES_MAGIC = 2051
_LABELS_MAGIC = 2049


class DatasetError(MpiTensorError, OSError):
    """A dataset's files are missing, unreadable, corrupt or could not be downloaded."""


class DatasetNotFoundError(DatasetError, FileNotFoundError):
    """Files a dataset needs are not on disk (and were not downloaded)."""


class DatasetCorruptError(DatasetError, ValueError):
    """A dataset file exists but its content is wrong (format, size, checksum)."""


class DownloadError(DatasetError):
    """No mirror delivered a file with the expected checksum (offline, blocked or corrupt)."""


def _read_bytes(path: Path) -> bytes:
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as fh:
                return fh.read()
        return path.read_bytes()
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise DatasetCorruptError(f"{path}: not a valid gzip file ({e}); delete it and download "
                                  "it again") from None


def read_idx(path: Union[str, os.PathLike], expect_magic: Optional[int] = None) -> np.ndarray:
    """Read one IDX file (gzip or raw) into a NumPy array, checking magic and size.

    Args:
        path: the file; a ``.gz`` suffix means gzip.
        expect_magic: the magic number it must carry (2051 images, 2049 labels), or None.

    Returns:
        An array of the file's shape, in native byte order.

    Raises:
        DatasetNotFoundError: no such file.
        DatasetCorruptError: bad gzip, wrong magic, unknown type code, or a size that does
            not match the header.

    Example:
        >>> read_idx("t10k-labels-idx1-ubyte.gz", expect_magic=2049).shape  # doctest: +SKIP
        (10000,)
    """
    path = Path(path)
    if not path.is_file():
        raise DatasetNotFoundError(f"{path}: no such file")
    raw = _read_bytes(path)
    if len(raw) < 4:
        raise DatasetCorruptError(f"{path}: {len(raw)} bytes is too short for an IDX header")
    magic = int.from_bytes(raw[:4], "big")
    if expect_magic is not None and magic != expect_magic:
        raise DatasetCorruptError(f"{path}: magic number {magic} (0x{magic:08x}), expected "
                                  f"{expect_magic} (0x{expect_magic:08x}); wrong or corrupt file")
    if raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_TYPES:
        raise DatasetCorruptError(f"{path}: magic number 0x{magic:08x} is not an IDX header")
    dtype, ndim = _IDX_TYPES[raw[2]], raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DatasetCorruptError(f"{path}: truncated header ({len(raw)} bytes, {ndim} dims)")
    shape = tuple(int.from_bytes(raw[4 + 4 * k:8 + 4 * k], "big") for k in range(ndim))
    expected = header + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(raw) != expected:
        raise DatasetCorruptError(
            f"{path}: {len(raw)} bytes (decompressed) but the header {shape} of {dtype} needs "
            f"{expected}; the file is {'truncated' if len(raw) < expected else 'too long'}")
    arr = np.frombuffer(raw, dtype=dtype, offset=header).reshape(shape)
    return arr.astype(dtype.newbyteorder("="), copy=True)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _mirrors(mirrors: Optional[Sequence[str]]) -> list:
    if mirrors is None:
        env = _config.mnist_mirrors()
        mirrors = env or list(MNIST_MIRRORS)
    if isinstance(mirrors, str):
        mirrors = [mirrors]
    out = [m if m.endswith("/") else m + "/" for m in mirrors]
    if not out:
        raise ValueError("mirrors is empty: give at least one base URL")
    return out


def _fetch(url: str, dest: Path, size: int, sha256: str, timeout: float) -> None:
    """Stream ``url`` to a temporary file beside ``dest``, verify, then rename it into place."""
    import urllib.request  # only a download pays for importing the HTTP stack

    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent)
    try:
        h = hashlib.sha256()
        n = 0
        with os.fdopen(fd, "wb") as out:
            req = urllib.request.Request(url, headers={"User-Agent": "mpitensor"})
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                for chunk in iter(lambda: resp.read(1 << 16), b""):
                    n += len(chunk)
                    if n > 4 * size + (1 << 20):
                        raise DatasetCorruptError(f"more than {n} bytes, expected {size}")
                    h.update(chunk)
                    out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
        digest = h.hexdigest()
        if digest != sha256:
            raise DatasetCorruptError(f"SHA-256 {digest} ({n} bytes), expected {sha256} "
                                      f"({size} bytes)")
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def download_mnist(
    root: Union[str, os.PathLike],
    mirrors: Optional[Sequence[str]] = None,
    timeout: float = 60.0,
    required: Optional[Sequence[str]] = None,
) -> list:
    """Download the four MNIST gzip files into ``root``, verified by SHA-256 (this rank only).

    Files already there with the right checksum are kept, as are uncompressed copies put
    there by hand (read_idx validates those). Each file is written to a temporary
    name and renamed only after its checksum matched, so nothing is left half-written.
    :class:`MNIST` with ``download=True`` calls this on rank 0 only.

    Args:
        root: the directory (created if needed).
        mirrors: base URLs tried in order (default: ``MPITENSOR_MNIST_MIRRORS`` or
            :data:`MNIST_MIRRORS`).
        timeout: seconds per connection attempt.
        required: the file names whose failure is an error (default: all four); the others
            only log a warning (``MNIST(train=False)`` needs only the t10k pair).

    Returns:
        The paths of the four files.

    Raises:
        DownloadError: a required file came from no mirror with the right checksum; the message
            lists each file, each mirror's failure, and where to put the files by hand.

    Example:
        >>> download_mnist("data/mnist")  # doctest: +SKIP
    """
    from http.client import HTTPException

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    urls = _mirrors(mirrors)
    failures: dict = {}
    paths = []
    for name, size, sha in MNIST_RESOURCES:
        dest = root / name
        paths.append(dest)
        if (dest.is_file() and _sha256(dest) == sha) or (root / name[:-3]).is_file():
            continue  # verified, or supplied uncompressed by hand (checked when read)
        tried = []
        for base in urls:
            try:
                _fetch(base + name, dest, size, sha, timeout)
                _log.info("downloaded %s from %s", name, base)
                break
            except (OSError, ValueError, HTTPException) as e:  # URLError, HTTPError: OSError
                tried.append(f"{base + name}: {e}")
        else:
            failures[name] = tried
    if required is not None and not set(failures) & set(required):
        for name, tried in failures.items():
            _log.warning("could not download %s (not needed now): %s", name, "; ".join(tried))
        failures = {}
    if failures:
        lines = "\n".join(f"  {name}:\n" + "\n".join(f"    {t}" for t in tried)
                          for name, tried in failures.items())
        raise DownloadError(
            f"could not download MNIST file(s) {sorted(failures)} into {root.resolve()}:\n"
            f"{lines}\nIf this machine is offline, copy the files (gzip or uncompressed) into "
            f"{root.resolve()} by hand, set MPITENSOR_MNIST_MIRRORS to a reachable mirror, or "
            "use mpitensor.data.datasets.Digits for a fully offline run.")
    return paths


def _download_coordinated(root: Path, mirrors: Optional[Sequence[str]], timeout: float,
                          required: Sequence[str]) -> None:
    """Rank 0 downloads while the other ranks wait; every rank then sees rank 0's outcome."""
    from mpitensor import distributed as dist

    if not dist.is_initialized() or dist.get_world_size() <= 1:
        download_mnist(root, mirrors, timeout, required)
        return
    error: Optional[BaseException] = None
    outcome: list = [None]
    if dist.get_rank() == 0:
        try:
            download_mnist(root, mirrors, timeout, required)
        except BaseException as e:  # noqa: BLE001 - every rank must learn of any failure
            error = e
            outcome[0] = f"{type(e).__name__}: {e}"
    # the broadcast is the barrier: nobody reads before rank 0 has finished (or failed)
    dist.broadcast_object_list(outcome, src=0)
    if error is not None:
        raise error
    if outcome[0] is not None:
        raise DownloadError(f"rank 0 failed to download MNIST into {root}: {outcome[0]}")


def _normalized(images: np.ndarray, normalize: bool) -> np.ndarray:
    """uint8 N x H x W -> float32 N x 1 x H x W, ToTensor (and Normalize) in one pass."""
    x = images.astype(np.float32)[:, None]
    if normalize:
        x *= np.float32(1.0 / (255.0 * MNIST_STD))
        x -= np.float32(MNIST_MEAN / MNIST_STD)
    else:
        x *= np.float32(1.0 / 255.0)
    return x


class _ImageDataset(Dataset):
    """Shared by MNIST and Digits: uint8 images, int64 labels, a cached float32 batch path."""

    classes = ["0 - zero", "1 - one", "2 - two", "3 - three", "4 - four", "5 - five",
               "6 - six", "7 - seven", "8 - eight", "9 - nine"]

    def _init_arrays(self, images: np.ndarray, labels: np.ndarray, transform: Any,
                     target_transform: Any, normalize: bool) -> None:
        self.data = wrap(np.ascontiguousarray(images, dtype=np.uint8))
        self.targets = wrap(labels.astype(np.int64))
        self.transform = transform
        self.target_transform = target_transform
        self.normalize = normalize
        self._arrays: Optional[tuple] = None

    def arrays(self) -> tuple:
        """Return ``(images, labels)`` as NumPy arrays, computed once and cached.

        ``images`` is float32 N x 1 x 28 x 28 (normalised with MNIST's mean 0.1307 and std
        0.3081 unless ``normalize=False``, then in [0, 1]); ``labels`` int64 N.
        """
        if self._arrays is None:
            self._arrays = (_normalized(self.data._data, self.normalize), self.targets._data)
        return self._arrays

    def tensors(self, device: Any = None) -> tuple:
        """Return :meth:`arrays` as Tensors (sharing memory on the CPU), e.g. for TensorDataset.

        Example:
            >>> x, y = Digits(train=False).tensors(); x.shape[1:]
            mpitensor.Size([1, 28, 28])
        """
        images, labels = self.arrays()
        return as_tensor(images, device=device), as_tensor(labels, device=device)

    def __len__(self) -> int:
        return self.data.shape[0]

    def __getitem__(self, index: int) -> tuple:
        images, labels = self.arrays()
        img: Any = wrap(images[index].copy())
        target: Any = int(labels[index])
        if self.transform is not None:
            img = self.transform(img)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return img, target

    def gather(self, indices: Any) -> Any:
        """Return the collated batch ``[images[indices], labels[indices]]`` in one gather each.

        With a transform set, samples go through ``__getitem__`` one by one (same result as
        the DataLoader's general path).
        """
        idx = _index_array(indices)
        if self.transform is not None or self.target_transform is not None:
            from .loader import default_collate

            return default_collate([self[int(i)] for i in idx])
        images, labels = self.arrays()
        return [wrap(_take(images, idx)), wrap(_take(labels, idx))]


class MNIST(_ImageDataset):
    """The MNIST handwritten digits, read from IDX files in ``root``.

    Files are looked up in ``root`` and then ``root/MNIST/raw`` (torchvision's layout), each as
    ``<name>.gz`` or uncompressed: ``train-images-idx3-ubyte``/``train-labels-idx1-ubyte``
    (``train=True``, 60,000) or ``t10k-*`` (10,000). Magic numbers, dimensions, sizes and the
    agreement of image and label counts are checked.

    ``ds[i]`` returns ``(image, label)``: a float32 1 x 28 x 28 Tensor with the standard
    ``ToTensor() + Normalize((0.1307,), (0.3081,))`` already applied (``normalize=False`` gives
    ``ToTensor()`` only: values in [0, 1]) and an int. ``transform`` receives that Tensor;
    ``target_transform`` the int. ``.data`` is the uint8 N x 28 x 28 Tensor and ``.targets``
    int64. A DataLoader batches it by one gather (see :meth:`gather`, :meth:`arrays`).

    Args:
        root: directory holding (or receiving) the files.
        train: the 60,000 training images, else the 10,000 test images.
        transform, target_transform: callables applied per sample.
        download: fetch missing files from the mirrors first (SHA-256 verified); under an
            initialised ``mpitensor.distributed`` rank 0 downloads while the others wait.
        mirrors: base URLs for the download (default ``MPITENSOR_MNIST_MIRRORS`` or
            :data:`MNIST_MIRRORS`).
        normalize: apply MNIST's mean/std normalisation.

    Raises:
        DatasetNotFoundError: files missing (the message names them and the directory).
        DatasetCorruptError: files present but malformed or inconsistent.
        DownloadError: ``download=True`` and no mirror served a verified copy.

    Example:
        >>> ds = MNIST("../shared/data/mnist", train=False)  # doctest: +SKIP
        >>> len(ds), ds[0][0].shape  # doctest: +SKIP
        (10000, mpitensor.Size([1, 28, 28]))
    """

    resources = MNIST_RESOURCES
    mirrors = MNIST_MIRRORS

    def __init__(
        self,
        root: Union[str, os.PathLike],
        train: bool = True,
        transform: Optional[Callable[[Tensor], Any]] = None,
        target_transform: Optional[Callable[[int], Any]] = None,
        download: bool = False,
        *,
        mirrors: Optional[Sequence[str]] = None,
        normalize: bool = True,
        timeout: float = 60.0,
    ) -> None:
        self.root = Path(os.path.expanduser(os.fspath(root)))
        self.train = train
        prefix = "train" if train else "t10k"
        if download:
            needed = [f"{prefix}-images-idx3-ubyte.gz", f"{prefix}-labels-idx1-ubyte.gz"]
            _download_coordinated(self.root, mirrors, timeout, needed)
        img_path = self._locate(f"{prefix}-images-idx3-ubyte")
        lbl_path = self._locate(f"{prefix}-labels-idx1-ubyte")
        missing = [n for n, p in ((f"{prefix}-images-idx3-ubyte.gz", img_path),
                                  (f"{prefix}-labels-idx1-ubyte.gz", lbl_path)) if p is None]
        if missing:
            raise DatasetNotFoundError(
                f"MNIST ({'train' if train else 'test'} split): missing {missing} (gzip or "
                f"uncompressed) in {self.root.resolve()}. Place the files in that directory, or "
                "pass download=True to fetch them from "
                f"{', '.join(_mirrors(mirrors))}.")
        try:
            images = read_idx(img_path, _IMAGES_MAGIC)
            labels = read_idx(lbl_path, _LABELS_MAGIC)
        except DatasetCorruptError as e:
            raise DatasetCorruptError(
                f"{e}. Replace the file in {img_path.parent.resolve()} with a good copy, or "
                "delete it and pass download=True to fetch verified copies.") from None
        if images.shape[1:] != (28, 28):
            raise DatasetCorruptError(f"{img_path}: images are {images.shape[1:]}, MNIST's are "
                                      "(28, 28)")
        if images.shape[0] != labels.shape[0]:
            raise DatasetCorruptError(f"{img_path} holds {images.shape[0]} images but {lbl_path} "
                                      f"holds {labels.shape[0]} labels; the files do not belong "
                                      "together")
        if labels.size and int(labels.max()) > 9:
            raise DatasetCorruptError(f"{lbl_path}: label {int(labels.max())} outside 0..9")
        self._init_arrays(images, labels, transform, target_transform, normalize)

    def _locate(self, base: str) -> Optional[Path]:
        for folder in (self.root, self.root / "MNIST" / "raw"):
            for name in (base + ".gz", base):
                p = folder / name
                if p.is_file():
                    return p
        return None

    def __repr__(self) -> str:
        return (f"Dataset MNIST\n    Number of datapoints: {len(self)}\n    Root location: "
                f"{self.root}\n    Split: {'Train' if self.train else 'Test'}")
