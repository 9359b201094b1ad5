"""PyTorch with the gloo backend as an oracle beside mpitensor, in the ranks of an MPI test.

Each rank starts torch.distributed's gloo group with its MPI rank and world size (a TCP
rendezvous on 127.0.0.1, the port chosen by rank 0 and broadcast over MPI), so that a test can
run ``torch.nn.parallel.DistributedDataParallel`` on the same weights and data as mpitensor's
and compare what each rank holds. torch is an oracle only: without it (or without gloo) the
tests that need it skip, on every rank alike.
"""

from __future__ import annotations

import datetime
import socket
from typing import Any, Iterator

import numpy as np
import pytest
from mpi4py import MPI

_COMM = MPI.COMM_WORLD


def _missing_reason() -> str:
    try:
        import torch.distributed as tdist
    except Exception as exc:  # ImportError, or a broken install
        return f"torch is not importable ({type(exc).__name__}: {exc})"
    if not tdist.is_available() or not tdist.is_gloo_available():
        return "this torch build has no distributed/gloo support"
    return ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module", name="torch_gloo")
def torch_gloo_fixture() -> Iterator[Any]:
    """The ``torch`` module with a gloo default group over this MPI world (skips without it)."""
    comm = _COMM.Dup()  # the rendezvous never mixes with the traffic under test
    try:
        reasons = comm.allgather(_missing_reason())
        if any(reasons):
            pytest.skip(next(r for r in reasons if r))
        import torch
        import torch.distributed as tdist

        torch.set_num_threads(1)  # N ranks on few cores
        port = comm.bcast(_free_port() if comm.Get_rank() == 0 else None, root=0)
        tdist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                                 rank=comm.Get_rank(), world_size=comm.Get_size(),
                                 timeout=datetime.timedelta(seconds=60))
        try:
            yield torch
        finally:
            comm.Barrier()  # no rank tears gloo down while another still uses it
            tdist.destroy_process_group()
    finally:
        comm.Free()


def to_torch(arr: Any, torch: Any) -> Any:
    """A torch tensor holding a copy of ``arr`` (an mpitensor Tensor or a NumPy array)."""
    data = arr.detach().numpy() if hasattr(arr, "detach") else arr
    return torch.from_numpy(np.array(data, copy=True))


def copy_state(src: Any, dst: Any, torch: Any) -> None:
    """Give the torch module ``dst`` the parameters and buffers of the mpitensor module ``src``
    (the same names, in the same order)."""
    mine = dict(src.named_parameters()) | dict(src.named_buffers())
    theirs = dict(dst.named_parameters()) | dict(dst.named_buffers())
    assert list(mine) == list(theirs), (list(mine), list(theirs))
    with torch.no_grad():
        for name, t in theirs.items():
            t.copy_(to_torch(mine[name], torch))
