"""mpitensor: distributed NumPy/CuPy tensors on MPI, with the torch.distributed API.

``import mpitensor as torch`` and ``import mpitensor.distributed as dist`` let code written for
the PyTorch distributed tutorials run on plain NumPy (CPU) or CuPy (GPU) arrays, launched with
``mpiexec -n 4 python train.py``.
"""

from __future__ import annotations

__version__ = "0.1.0"

# _ops first: it imports every op module, which add the Tensor methods and the functions of
# mpitensor.tensor's __all__ before any other module can use them
from ._base import config as _config
from ._base import mpi_import as _mpi_import  # noqa: F401 - from here on, the first import of mpi4py.MPI is noted
from . import (
    _ops,  # noqa: F401 - imported for what importing it does
    accelerator,
    amp,
    autograd,
    backend,
    backends,
    checkpoint,
    cpu,
    cuda,
    data,
    distributed,
    distributions,
    errors,
    fft,
    func,
    futures,
    jit,
    linalg,
    models,
    multiprocessing,
    nn,
    onnx,
    optim,
    profiler,
    random,
    serialization,
    signal,
    sparse,
    special,
    testing,
    utils,
    version,
)
from ._core.compile import compile  # noqa: A004 - torch's name
from ._ops.create import (
    channels_last,
    channels_last_3d,
    contiguous_format,
    layout,
    memory_format,
    preserve_format,
    strided,
)
from ._core.legacy_types import *  # noqa: F403 - FloatTensor, LongTensor, ... as in torch
from ._core.legacy_types import __all__ as _legacy_type_names
from ._core.precision import get_float32_matmul_precision, set_float32_matmul_precision
from ._ops.sparse import (
    dsmm,
    hsmm,
    hspmm,
    smm,
    sparse_coo,
    sparse_coo_tensor,
    sparse_csr,
    sparse_csr_tensor,
    spmm,
)
from ._base.threads import get_num_threads, set_num_threads
from .amp import autocast
from .amp.autocast_mode import (
    autocast_decrement_nesting,
    autocast_increment_nesting,
    clear_autocast_cache,
    get_autocast_cpu_dtype,
    get_autocast_dtype,
    get_autocast_gpu_dtype,
    is_autocast_cache_enabled,
    is_autocast_cpu_enabled,
    is_autocast_enabled,
    set_autocast_cache_enabled,
    set_autocast_cpu_dtype,
    set_autocast_cpu_enabled,
    set_autocast_dtype,
    set_autocast_enabled,
    set_autocast_gpu_dtype,
)
from .autograd import profiler as _autograd_profiler  # noqa: F401 - torch.autograd.profiler
from .autograd import enable_grad, inference_mode, is_grad_enabled, no_grad, set_grad_enabled
from .backend import cupy_available, device, get_default_device, set_default_device
from .checkpoint import CheckpointError, load, save
from .dtypes import *  # noqa: F403 - dtype names at package level, as in torch
from .dtypes import __all__ as _dtype_names
from .errors import *  # noqa: F403 - the error classes at package level
from .errors import __all__ as _error_names
from .func import vmap
from .tensor import *  # noqa: F403
from .tensor import __all__ as _tensor_names
from ._ops.linalg_legacy import *  # noqa: F403 - torch.qr, torch.svd, torch.cholesky, ...
from ._ops.linalg_legacy import __all__ as _linalg_legacy_names
from ._ops.runtime import *  # noqa: F403 - use_deterministic_algorithms, typename, ...
from ._ops.runtime import __all__ as _runtime_names
from ._ops.spectral import *  # noqa: F403 - hann_window, stft, istft, ...
from ._ops.spectral import __all__ as _spectral_names
from .nn._torch_level import *  # noqa: F403 - torch.conv2d, torch.layer_norm, ...
from .nn._torch_level import __all__ as _nn_level_names

if _config.LOG_SET:
    import logging as _logging

    class _RankFilter(_logging.Filter):
        """Stamps each record with this process's rank, found when the record is made."""

        def filter(self, record: _logging.LogRecord) -> bool:
            record.rank = _rank_for_log()
            return True

    def _rank_for_log() -> str:
        if distributed.is_initialized():
            return str(distributed.get_rank())
        rank = distributed.launcher_rank(None)  # mpiexec's, before init_process_group
        if rank is None:
            rank = _os.environ.get("RANK", "").strip()  # torchrun's
            return rank if rank.isdigit() else "0"
        return str(rank)

    import os as _os

    # The switch asks to see these lines: they go to stderr through a handler of the
    # "mpitensor" logger only (the root logger and the application's handlers stay as they
    # are, and records do not also reach them, which would print each line twice)
    _logger = _logging.getLogger("mpitensor")
    _logger.setLevel(_config.LOG_LEVEL)
    _handler = _logging.StreamHandler()  # sys.stderr, looked up at each record
    _handler.setFormatter(_logging.Formatter("[rank %(rank)s] %(name)s %(levelname)s: "
                                             "%(message)s"))
    _handler.addFilter(_RankFilter())
    _logger.addHandler(_handler)
    _logger.propagate = False

__all__ = [
    "__version__", "backend", "errors", "distributed", "device", "cupy_available", "autograd",
    "get_default_device", "set_default_device",
    "data", "utils", "nn", "models", "optim", "checkpoint", "save", "load", "CheckpointError",
    "no_grad", "enable_grad", "set_grad_enabled", "is_grad_enabled", "inference_mode",
    "set_num_threads", "get_num_threads", "cuda", "accelerator",
    "backends", "multiprocessing", "linalg", "random", "futures", "jit", "onnx", "compile",
    "serialization", "testing", "version", "fft", "special", "profiler",
    "get_float32_matmul_precision",
    "set_float32_matmul_precision", "distributions", "func", "vmap",
    "memory_format", "contiguous_format", "preserve_format", "channels_last",
    "channels_last_3d", "layout", "strided",
    "amp", "cpu", "autocast", "is_autocast_enabled", "get_autocast_dtype", "set_autocast_enabled",
    "set_autocast_dtype", "is_autocast_cpu_enabled", "set_autocast_cpu_enabled",
    "get_autocast_cpu_dtype", "set_autocast_cpu_dtype", "get_autocast_gpu_dtype",
    "set_autocast_gpu_dtype", "is_autocast_cache_enabled", "set_autocast_cache_enabled",
    "clear_autocast_cache", "autocast_increment_nesting", "autocast_decrement_nesting",
    "sparse", "sparse_coo", "sparse_coo_tensor", "sparse_csr", "sparse_csr_tensor", "spmm",
    "dsmm", "hsmm", "hspmm", "smm",
    *_dtype_names, *_tensor_names, *_legacy_type_names, *_error_names, "signal",
    *_linalg_legacy_names, *_runtime_names, *_spectral_names, *_nn_level_names,
]

from mpitensor._core import numpy_names as _numpy_names  # noqa: E402 - after every op has been defined

_numpy_names.install(Tensor, globals())


def __getattr__(name: str) -> object:
    # torch.fx loads on first use: most programs never trace, so they skip its import
    if name == "fx":
        import importlib

        return importlib.import_module(".fx", __name__)
    if name == "ops":  # torch.ops: the names CommDebugMode keys and register_sharding takes
        from .distributed.tensor.debug import ops

        return ops
    raise AttributeError(f"module 'mpitensor' has no attribute {name!r}")
