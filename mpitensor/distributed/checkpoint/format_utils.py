"""Converting between distributed checkpoints and ``torch.save`` files
(``torch.distributed.checkpoint.format_utils``).

:func:`dcp_to_torch_save` reads a whole checkpoint directory, whatever world size wrote it,
into one process and writes it as one torch file; :func:`torch_save_to_dcp` does the reverse.
Both run in this process alone (no process group is used). From the shell::

    python -m mpitensor.distributed.checkpoint.format_utils dcp_to_torch ckpt_dir model.pt
    python -m mpitensor.distributed.checkpoint.format_utils torch_to_dcp model.pt ckpt_dir

Example:
    >>> dcp_to_torch_save("checkpoint", "model.pt")  # doctest: +SKIP
    >>> torch_save_to_dcp("model.pt", "checkpoint_again")  # doctest: +SKIP
"""

from __future__ import annotations

import argparse
import enum
import os
import sys
from typing import Any, Dict, List, Optional, Sequence, Union

import numpy as np

from mpitensor import checkpoint as _files
from mpitensor.distributed.checkpoint import metadata as md
from mpitensor.distributed.checkpoint.filesystem import FileSystemReader
from mpitensor.distributed.checkpoint.state_dict_loader import load
from mpitensor.distributed.checkpoint.state_dict_saver import save
from mpitensor.tensor import Tensor

__all__ = ["FormatMode", "dcp_to_torch_save", "torch_save_to_dcp"]

PathLike = Union[str, "os.PathLike[str]"]


class FormatMode(enum.Enum):
    """The two directions of the command line."""

    TORCH_TO_DCP = "torch_to_dcp"
    DCP_TO_TORCH = "dcp_to_torch"


def _place(root: Dict[str, Any], path: Sequence[Any], value: Any) -> None:
    """Set ``value`` at ``path`` in a nested state dict, making dicts (and lists, for integer
    keys, as a save flattens them) on the way."""
    node: Any = root
    for key, nxt in zip(path[:-1], path[1:]):
        empty: Any = [] if isinstance(nxt, int) else {}
        if isinstance(node, list):
            node.extend([None] * (key + 1 - len(node)))
            if node[key] is None:
                node[key] = empty
        else:
            node.setdefault(key, empty)
        node = node[key]
    if isinstance(node, list):
        node.extend([None] * (path[-1] + 1 - len(node)))
    node[path[-1]] = value


def _empty_state_dict(meta: md.Metadata) -> Dict[str, Any]:
    """A state dict of the checkpoint's structure to load the whole of it into: a zero tensor
    of each entry's global shape and dtype, None for each object (the load replaces it)."""
    paths = meta.planner_data if isinstance(meta.planner_data, dict) else {}
    out: Dict[str, Any] = {}
    for fqn, stored in meta.state_dict_metadata.items():
        if isinstance(stored, md.TensorStorageMetadata):
            data = np.zeros(tuple(stored.size), dtype=np.dtype(stored.properties.dtype))
            value: Any = Tensor(data)
        else:
            value = None
        path = paths.get(fqn) or (fqn,)
        _place(out, list(path), value)
    return out


def dcp_to_torch_save(dcp_checkpoint_dir: PathLike, torch_save_path: PathLike) -> None:
    """Write the whole checkpoint in ``dcp_checkpoint_dir`` as one ``torch.save`` file.

    The nesting of the saved state dict comes back (from the metadata's record of it); every
    tensor is whole. ``torch.load`` reads the file, and so does ``mpitensor.load``.

    Args:
        dcp_checkpoint_dir: a directory written by ``dcp.save`` (here or by torch).
        torch_save_path: the file to write (written atomically, in torch's zip layout).

    Raises:
        CheckpointError: the directory is not a complete checkpoint.
    """
    reader = FileSystemReader(dcp_checkpoint_dir)
    state_dict = _empty_state_dict(reader.read_metadata())
    load(state_dict, storage_reader=reader, no_dist=True)
    _files.save(state_dict, os.fspath(torch_save_path), format="torch")


def torch_save_to_dcp(torch_save_path: PathLike, dcp_checkpoint_dir: PathLike) -> None:
    """Write the state dict in a ``torch.save`` file as a distributed checkpoint (one rank's).

    The file is read with ``weights_only=True``: tensors, containers, numbers and strings (as
    a state dict holds). A file holding other classes needs them allowed first, with
    ``mpitensor.serialization.safe_globals([...])``.

    Args:
        torch_save_path: a file written by ``torch.save`` or ``mpitensor.save``.
        dcp_checkpoint_dir: the checkpoint directory to write (replaced whole if it holds one).

    Raises:
        TypeError: the file does not hold a dict.
        CheckpointError: the file cannot be read, or the directory cannot be written.
    """
    state_dict = _files.load(os.fspath(torch_save_path), weights_only=True)
    if not isinstance(state_dict, dict):
        raise TypeError(f"torch_save_to_dcp: {os.fspath(torch_save_path)} holds a "
                        f"{type(state_dict).__name__}, not a state dict; a distributed "
                        f"checkpoint is made from a dict")
    save(state_dict, checkpoint_id=dcp_checkpoint_dir, no_dist=True)


def main(argv: Optional[List[str]] = None) -> int:
    """The command line: ``<mode> <src> <dst>``, mode ``torch_to_dcp`` or ``dcp_to_torch``."""
    parser = argparse.ArgumentParser(
        prog="python -m mpitensor.distributed.checkpoint.format_utils",
        description="Convert a torch.save file to a distributed checkpoint or back.")
    parser.add_argument("mode", choices=[m.value for m in FormatMode], help="Conversion mode")
    parser.add_argument("src", help="Path to the source model")
    parser.add_argument("dst", help="Path to the destination model")
    args = parser.parse_args(argv)
    if args.mode == FormatMode.TORCH_TO_DCP.value:
        if not os.path.isfile(args.src):
            parser.error(f"{args.src} is not a file; torch_to_dcp converts a torch.save file")
        torch_save_to_dcp(args.src, args.dst)
    else:
        if not os.path.isdir(args.src):
            parser.error(f"{args.src} is not a directory; dcp_to_torch converts a checkpoint "
                         f"directory")
        dcp_to_torch_save(args.src, args.dst)
    return 0


if __name__ == "__main__":
    sys.exit(main())
