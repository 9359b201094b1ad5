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
        "needed, unless `world_size` is smaller: then the callers form a group of their own, "
        "meeting at `init_method`; processes no launcher started meet through `init_method`/"
        "`store`/`MASTER_ADDR` and are joined into one MPI job ([distributed.md](distributed.md))"
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
        "also takes dense gradients, updating their nonzero entries (weights and moments), "
        "those `grad.to_sparse()` would keep; torch refuses dense gradients"
    ),
    "torch.optim.LBFGS": (
        "an unknown `line_search_fn` is a RuntimeError at construction (torch raises it at the "
        "first `step`)"
    ),
    "torch.distributed.supports_complex": (
        "also `True` for `PRODUCT` (MPI multiplies complex numbers)"
    ),
    "torch.distributed.ProcessGroupGloo": (
        "for `isinstance` only: true of groups made with backend `gloo` (MPI groups); cannot "
        "be constructed"
    ),
    "torch.distributed.record_comm": (
        "names the argument-check errors of the collectives called inside it; there is no "
        "collective profiler to show it in"
    ),
    "torch.distributed.register_rendezvous_handler": (
        "handlers serve `rendezvous()`; `init_process_group` keeps its own env/tcp/file "
        "rendezvous"
    ),
    "torch.distributed.get_pg_count": (
        "the default group plus the groups still alive"
    ),
    "torch.distributed.QueueEmptyError": (
        "for `except` clauses: the stores have no queue operations, so nothing raises it"
    ),
    "torch.distributed.AllreduceOptions": (
        "a record with torch's fields and defaults (as the other eight `*Options`); groups "
        "here take keyword arguments, not these records"
    ),
    "torch.distributed.algorithms": (
        "no quantization hooks; PowerSGD's first random matrix comes from mpitensor's "
        "generator; a communication hook does its own dividing inside `join()` "
        "([ddp.md](ddp.md))"
    ),
    "torch.sparse_coo_tensor": (
        "indices are always checked (as torch with `check_invariants=True`) "
        "([sparse.md](sparse.md))"
    ),
    "torch.sparse_csr_tensor": (
        "2-D only; indices always checked ([sparse.md](sparse.md))"
    ),
    "torch.sparse.check_sparse_tensor_invariants": (
        "records the setting only: sparse indices are always checked"
    ),
    "torch.mm": (
        "a sparse leaf operand that requires grad raises `NotImplementedError` (torch gives "
        "it a dense gradient): use `torch.sparse.mm`"
    ),
    "torch.hspmm": (
        "differentiable (torch has no derivative for it)"
    ),
    "torch.smm": (
        "differentiable (torch has no derivative for it)"
    ),
    "torch.utils.data.argument_validation": (
        "does the type checks torch documents (torch 2.13's check nothing); an untyped pipe "
        "counts as `Any` ([datapipes.md](datapipes.md))"
    ),
    "torch.utils.data.runtime_validation": (
        "does the type checks torch documents (torch 2.13's fails on any pipe) "
        "([datapipes.md](datapipes.md))"
    ),
    "torch.utils.data.functional_datapipe": (
        "decorating a class that is not a DataPipe raises `TypeError`; "
        "`enable_df_api_tracing=True` raises `NotImplementedError`"
    ),
    "torch.nn.CrossMapLRN2d": (
        "the gradient is the exact derivative of the forward (torch's hand-written backward "
        "differs, and fails for `size=1`)"
    ),
    "torch.nn.LazyInstanceNorm1d": (
        "an unbatched first input takes `num_features` from dim 0 (torch reads dim 1 and "
        "fails)"
    ),
    "torch.nn.LazyLinear": (
        "`load_state_dict` also sets `in_features` from the loaded shapes (as every lazy "
        "module: torch leaves them 0 until the first forward)"
    ),
    "torch.nn.UninitializedParameter": (
        "keeps only dtype and device; moved to a GPU, it allocates there when it materialises"
    ),
    "torch.nn.attention": (
        "only the MATH kernel exists: an `sdpa_kernel` block without it makes "
        "`scaled_dot_product_attention` raise; flash-attention registration raises ([nn-"
        "layers.md](nn-layers.md))"
    ),
    "torch.nn.functional.grid_sample": (
        "`mode='bicubic'` raises `NotImplementedError`"
    ),
    "torch.nn.LinearCrossEntropyOptions": (
        "`chunking_method` only `'auto'`, `'batch'` or `None`; `acc_policy='accurate'` "
        "accumulates in float64; `allow_retain_graph` has no effect"
    ),
    "torch.nn.AdaptiveLogSoftmaxWithLoss": (
        "a cluster projection of width 0 (`in_features // div_value**(i+1) == 0`) is refused"
    ),
    "torch.nn.FractionalMaxPool2d": (
        "without `_random_samples`, samples come from mpitensor's generator, not torch's "
        "stream"
    ),
    "torch.fx.symbolic_trace": (
        "calls are recorded by swapping the code of mpitensor's public functions while a "
        "trace runs (no `__torch_function__`); functions of other modules run on the proxy "
        "unless `fx.wrap`ped; no `*args`/`**kwargs`/keyword-only forward parameters; "
        "`concrete_args` become defaults, not assertions ([fx.md](fx.md))"
    ),
    "torch.fx.Tracer": (
        "`nn.functional` calls are recorded with the arguments as written (torch adds "
        "defaults such as `inplace=False`) ([fx.md](fx.md))"
    ),
    "torch.fx.Proxy": (
        "`tensor * proxy` is recorded as `operator.mul` (torch: the method `mul`); while a "
        "hand-built proxy lives, mpitensor functions show the signature `(*args, **kwargs)`"
    ),
    "torch.fx.GraphModule": (
        "pickles by value (submodules, tensors and the graph); `node.meta` is not kept"
    ),
    "torch.distributed.nn.RemoteModule": (
        "no TorchScript (`_module_interface_cls` raises) and no device maps: a GPU module's "
        "outputs come back to the CPU ([rpc.md](rpc.md))"
    ),
    "torch.autocast": (
        "`cache_enabled` is accepted, casts are not cached; device types other than cpu/cuda "
        "raise; `LSTM` runs in float32 and rounds its outputs once ([amp.md](amp.md))"
    ),
    "torch.amp.autocast": (
        "as `torch.autocast`: casts not cached; cpu and cuda only ([amp.md](amp.md))"
    ),
    "torch.amp.GradScaler": (
        "an unknown device type raises; a disabled scaler's getters return values (torch "
        "raises `AttributeError`) ([amp.md](amp.md))"
    ),
    "torch.einsum": (
        "under CPU autocast, cast when a summed index is shared by two operands; with three "
        "or more operands the dtype does not depend on a contraction order"
    ),
    "torch.cuda.memory_stats": (
        "only `allocated_bytes.all.{current,peak,allocated}`, "
        "`reserved_bytes.all.{current,peak}`, `allocation.all.allocated` and `num_ooms` "
        "([amp.md](amp.md))"
    ),
    "torch.cuda.max_memory_allocated": (
        "counted from mpitensor's first CuPy import; `RuntimeError` if the program installed "
        "its own CuPy allocator"
    ),
    "torch.cuda.memory_summary": (
        "`CudaUnavailableError` without a GPU (torch's CPU build: `KeyError`)"
    ),
    "torch.cuda.Event": (
        "`ipc_handle()` raises `NotImplementedError`"
    ),
    "torch.matmul": (
        "operands of different floating dtypes are promoted (torch raises): `bfloat16 @ "
        "float32` gives float32"
    ),
    "torch.cuda.get_rng_state": (
        "a picklable dict `{\"kind\": \"mpitensor.cuda\", \"seed\": s}`, not a ByteTensor: "
        "CuPy's generator cannot be copied, so reading the state reseeds that GPU's stream from "
        "a seed derived from the old one; a round trip reproduces the numbers, but the numbers "
        "after the read differ from those without it ([devices.md](devices.md))"
    ),
    "torch.cuda.set_rng_state": (
        "takes only what `get_rng_state` returned (`TypeError` otherwise, with or without a GPU)"
    ),
    "torch.cuda.CUDAGraph": "raises `NotImplementedError` (no CUDA graph capture through CuPy)",
    "torch.cuda.make_graphed_callables": "raises `NotImplementedError`",
    "torch.cuda.set_sync_debug_mode": "only mode 0; \"warn\"/\"error\" raise",
    "torch.as_strided_scatter": (
        "the input's gradient zeroes the written positions (clone, `as_strided`, `copy_`); "
        "torch 2.13's keeps those and zeroes the others"
    ),
    "torch.set_num_interop_threads": (
        "recorded once (a second call raises, as torch's): there is no inter-op pool, "
        "independent ops run one after another"
    ),
}

#: Names mpitensor has at another path: torch path -> (mpitensor path, how it differs).
ELSEWHERE: Dict[str, Tuple[str, str]] = {}

