"""How mpitensor differs from torch, name by name: the notes of ``docs/porting.md`` (written by
``tools/porting_table.py``) and of the checker ``python -m mpitensor.porting``.

Keys are torch paths in the snapshot ``mpitensor/_torch_names.json``; the generator fails if one
is not there, or (NOTES) does not resolve in mpitensor, or (ELSEWHERE) resolves at torch's path
after all. Sources: docs/*.md and the docstrings they quote.
"""

from __future__ import annotations

from typing import Dict, Tuple

__all__ = ["NOTES", "ELSEWHERE"]

#: Names that resolve in mpitensor but behave otherwise than torch's.
NOTES: Dict[str, str] = {
    "torch.multiprocessing.spawn": (
        "the processes are MPI ranks started by `mpiexec` (one job: `init_process_group` in "
        "`fn` needs no rendezvous); `fn` must be importable by name, whatever the start method; "
        "`nprocs < 1` is an error; `timeout=` is an extension ([launching.md](launching.md))"
    ),
    "torch.multiprocessing.start_processes": (
        "as `spawn`: MPI ranks started by `mpiexec`; `fork`/`forkserver` act as `spawn`, with a "
        "warning"
    ),
    "torch.multiprocessing.ProcessContext": (
        "`processes` are `RankProcess` objects (`pid`, `is_alive()`, `exitcode`, `join()`, "
        "`terminate()`, `kill()`); also `kill()` and `results`"
    ),
    "torch.multiprocessing.ProcessExitedException": (
        "a killed rank's `error_index` is `None` when several ranks ended at the same instant; "
        "also `.rank`, `.pid`"
    ),
    "torch.multiprocessing.set_sharing_strategy": (
        "accepted, changes nothing: tensors put on a `Queue` are pickled with their data"
    ),
    "torch.save": (
        "the format follows the name: `.pt`/`.pth` write torch's zip layout (torch reads it), "
        "`.safetensors` safetensors, anything else (and file objects) mpitensor's own "
        "checksummed format, which torch cannot read; `format=` chooses ([checkpoints.md]"
        "(checkpoints.md))"
    ),
    "torch.load": (
        "reads mpitensor, torch zip, torch legacy and safetensors files (told apart by their "
        "first bytes); `weights_only=True` is the default, as in torch >= 2.6; a whole "
        "pickled `nn.Module` (torch's too) loads with `weights_only=False` or its classes in "
        "`serialization.add_safe_globals` ([checkpoints.md](checkpoints.md))"
    ),
    "torch.device": (
        "also equals its string (`device('cuda:0') == 'cuda:0'`) ([devices.md](devices.md))"
    ),
    "torch.manual_seed": "seeds the CPU and every GPU (CuPy); returns the default `Generator`",
    "torch.Generator": (
        "NumPy's PCG64 on the CPU (CuPy's generator on a GPU): the same seed gives the same "
        "numbers within mpitensor, not torch's numbers; `get_state()` is a picklable dict, not "
        "a ByteTensor"
    ),
    "torch.get_rng_state": "a picklable dict (the default `Generator`'s state), not a ByteTensor",
    "torch.Tensor.type": (
        "with no argument, names the type `'mpitensor.FloatTensor'`; takes `'torch.FloatTensor'`"
        "-style names, the legacy classes and dtypes"
    ),
    "torch.set_num_threads": (
        "sets NumPy's BLAS and OpenMP pools (threadpoolctl); `init_process_group` already "
        "limits them to the rank's share of the node's cores"
    ),
    "torch.distributed.init_process_group": (
        'backend `"mpi"` by default; `"gloo"` (and `"nccl"` without a GPU) run on MPI; under '
        "`mpiexec` `rank`/`world_size`, when given, must equal MPI's and `init_method` is not "
        "needed; processes no launcher started meet through `init_method`/`store`/"
        "`MASTER_ADDR` and are joined into one MPI job ([distributed.md](distributed.md))"
    ),
    "torch.distributed.get_default_backend_for_device": (
        '`"mpi"` for the CPU where torch answers `"gloo"`; `"nccl"` for CUDA'
    ),
    "torch.distributed.get_backend": (
        '`"mpi"` or `"nccl"`: a CPU group reports `"mpi"` where torch reports `"gloo"`'
    ),
    "torch.distributed.all_to_all_single": (
        "as with torch's MPI backend, every rank passes split sizes or none does"
    ),
    "torch.nn.parallel.DistributedDataParallel": (
        "buckets are not rebuilt after the first iteration; no communication hooks and no "
        "mixed precision; `overlap=` and `verify_in_sync()` are extensions; a parameter left "
        "without gradient (no `find_unused_parameters`) is averaged as zero and reported once, "
        "at the next forward ([ddp.md](ddp.md))"
    ),
    "torch.backends.cudnn.enabled": (
        "settable flag with torch's default, inert: mpitensor never calls cuDNN"
    ),
    "torch.backends.cudnn.benchmark": "settable flag with torch's default, inert",
    "torch.backends.cudnn.deterministic": "settable flag with torch's default, inert",
    "torch.backends.cudnn.allow_tf32": "settable flag with torch's default, inert",
    "torch.backends.cudnn.is_available": "always `False`",
    "torch.backends.cudnn.version": "always `None`",
    "torch.cuda.empty_cache": "frees CuPy's unused pooled blocks (device and pinned)",
    "torch.cuda.memory_allocated": "bytes in use in CuPy's memory pool (0 without a GPU)",
    "torch.cuda.memory_reserved": "bytes held by CuPy's memory pool (0 without a GPU)",
    "torch.accelerator.current_accelerator": (
        "`device(type='cuda')` wherever CuPy imports (as a CUDA build of torch answers), "
        "else `None`"
    ),
    "torch.optim.SparseAdam": (
        "mpitensor has no sparse tensors: gradients are dense, and the entries updated (weights "
        "and moments) are the nonzero ones, those `grad.to_sparse()` would keep; torch refuses "
        "dense gradients"
    ),
    "torch.optim.LBFGS": (
        "an unknown `line_search_fn` is a RuntimeError at construction (torch raises it at the "
        "first `step`)"
    ),
}

#: Names mpitensor has at another path: torch path -> (mpitensor path, how it differs).
ELSEWHERE: Dict[str, Tuple[str, str]] = {}

