"""Arrays in memory shared between processes: what ``Tensor.share_memory_()`` moves data into.

A shared array lives in an anonymous shared file (``memfd_create``) mapped ``MAP_SHARED``:

- **fork** (``multiprocessing``'s default on Linux): a child inherits the mapping, so parent and
  child read and write the same memory with no pickling at all;
- **pickled through ``multiprocessing``** (``Process`` arguments under ``spawn`` or
  ``forkserver``, ``Queue``, ``Pipe``): the array travels as the file's descriptor, duplicated
  into the receiver (``multiprocessing.reduction.DupFd``), plus its dtype, shape, strides and
  offset; the receiver maps the same file. Only ``multiprocessing``'s pickler does this (see
  :func:`register_reductions`); ``pickle.dumps``, ``copy.deepcopy`` and ``mpitensor.save`` copy
  the values, as torch's do.

Each mapping keeps its descriptor open while any array uses it, so it can be shared onwards;
both are released with the last array (a finalizer on the mapping). The file has no name, so
nothing is left in ``/dev/shm`` by a process that is killed.

This is torch's ``file_descriptor`` sharing strategy; its ``file_system`` strategy (named files)
is accepted by ``mpitensor.multiprocessing.set_sharing_strategy`` and shares the same way.
"""

from __future__ import annotations

import mmap
import os
import pickle
import weakref
from typing import Any, Dict, Optional, Tuple

import numpy as np

__all__ = ["share", "is_shared", "register_reductions"]

#: id(mmap) -> (a weak reference to the mmap, its descriptor), for the mappings this process
#: made or received; the arrays alone keep a mapping alive
_MAPS: Dict[int, Tuple[weakref.ref, int]] = {}


def _forget(key: int, fd: int) -> None:
    _MAPS.pop(key, None)
    try:
        os.close(fd)
    except OSError:
        pass


def _map(fd: int, size: int) -> mmap.mmap:
    """Map ``size`` bytes of ``fd`` shared, and keep ``fd`` for as long as the mapping lives."""
    m = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    _MAPS[id(m)] = (weakref.ref(m), fd)
    weakref.finalize(m, _forget, id(m), fd)
    return m


def _mapping_of(arr: Any) -> Optional[Tuple[mmap.mmap, int, np.ndarray]]:
    """``(mapping, descriptor, root array)`` where ``arr`` lives in one of our mappings."""
    root = arr
    while isinstance(root.base, np.ndarray):
        root = root.base
    owner = root.base
    if isinstance(owner, memoryview):
        owner = owner.obj
    if owner is None:
        return None
    found = _MAPS.get(id(owner))
    if found is None or found[0]() is not owner:
        return None
    return owner, found[1], root


def is_shared(arr: Any) -> bool:
    """Whether ``arr`` (a NumPy array) lives in shared memory made by :func:`share`."""
    return isinstance(arr, np.ndarray) and _mapping_of(arr) is not None


def share(arr: np.ndarray) -> np.ndarray:
    """A copy of ``arr`` in new shared memory (same dtype, shape and values; C order)."""
    size = max(arr.nbytes, 1)  # a mapping cannot be empty
    fd = os.memfd_create("mpitensor-shared", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, size)
        m = _map(fd, size)
    except BaseException:
        os.close(fd)
        raise
    out = np.frombuffer(m, dtype=np.uint8, count=arr.nbytes).view(arr.dtype).reshape(arr.shape)
    out[...] = arr
    return out


def _rebuild(dup: Any, size: int, dtype: Any, shape: tuple, strides: tuple,
             offset: int) -> np.ndarray:
    m = _map(dup.detach(), size)
    return np.ndarray(shape, dtype=dtype, buffer=m, offset=offset, strides=strides)


def reduce_array(arr: np.ndarray) -> Optional[tuple]:
    """``multiprocessing``'s reduction of a shared array (None: not shared, pickle as usual)."""
    found = _mapping_of(arr)
    if found is None:
        return None
    m, fd, root = found
    from multiprocessing.reduction import DupFd  # noqa: PLC0415 - only when pickling

    offset = arr.__array_interface__["data"][0] - root.__array_interface__["data"][0]
    return (_rebuild, (DupFd(fd), len(m), arr.dtype, arr.shape, arr.strides, offset))


_registered: set = set()


def register_reductions(*classes: type) -> None:
    """Teach ``multiprocessing``'s pickler to send tensors of these classes that are in shared
    memory as their shared memory (its registry matches exact classes).

    ``share_memory_`` registers ``Tensor`` and the class of the tensor it moves, the receiving
    side the class it rebuilds, and importing ``mpitensor.multiprocessing`` registers
    ``Tensor``; plain pickling is untouched.
    """
    todo = [c for c in classes if c not in _registered]
    if not todo:
        return
    from multiprocessing.reduction import ForkingPickler  # noqa: PLC0415

    for cls in todo:
        ForkingPickler.register(cls, _reduce_tensor)
        _registered.add(cls)


def _reduce_tensor(t: Any) -> Any:
    shared = reduce_array(t._data) if isinstance(t._data, np.ndarray) else None
    if shared is None:
        return t.__reduce_ex__(pickle.DEFAULT_PROTOCOL)
    return (_rebuild_tensor, (type(t), shared, t._requires_grad))


def _rebuild_tensor(cls: type, shared: tuple, requires_grad: bool) -> Any:
    register_reductions(cls)  # so this process shares it onwards as shared memory too
    fn, args = shared
    t = cls(fn(*args))
    t.requires_grad_(requires_grad)
    return t
