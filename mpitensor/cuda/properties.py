"""``torch.cuda``'s questions about a GPU: its properties, its NVML readings, CUDA error codes.

Properties come from CuPy (``cupy.cuda.runtime.getDeviceProperties``) under torch's attribute
names; the readings torch takes from NVML (``utilization``, ``temperature``, ``power_draw``,
``clock_rate``, ``memory_usage``, ``device_memory_used``, ``list_gpu_processes``) come from
``pynvml`` (the ``nvidia-ml-py`` package) as torch's do, the GPU found by its PCI bus id so that
``CUDA_VISIBLE_DEVICES`` numbering holds. Without ``pynvml`` they raise ModuleNotFoundError
(``list_gpu_processes`` returns a line saying so), as torch's do; without a GPU, the others raise
:class:`~mpitensor.cuda.CudaUnavailableError`, except the plain answers of a CPU-only torch:
``get_arch_list()`` is ``[]`` and ``is_tf32_supported()`` is False.
"""

from __future__ import annotations

from typing import Any

from mpitensor import backend as _backend
from mpitensor._core.devices import cuda_index_arg
from mpitensor.errors import OutOfMemoryError

from ._common import DeviceArg, _cupy, _resolve

__all__ = ["get_device_properties", "get_arch_list", "is_tf32_supported",
           "can_device_access_peer", "clock_rate", "utilization", "temperature", "power_draw",
           "memory_usage", "device_memory_used", "list_gpu_processes", "CudaError",
           "check_error", "cudaStatus", "DeferredCudaCallError", "get_sync_debug_mode",
           "set_sync_debug_mode", "has_half", "has_magma", "OutOfMemoryError"]

has_half = True  # float16 tensors work wherever CuPy does
has_magma = False  # GPU linear algebra is CuPy's cuSOLVER, not MAGMA


def _text(v: Any) -> str:
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


def _uuid(raw: Any) -> str:
    b = raw if isinstance(raw, (bytes, bytearray)) else bytes(raw or b"")
    h = b.hex()
    return "-".join((h[:8], h[8:12], h[12:16], h[16:20], h[20:32])) if len(b) == 16 else h


# torch's attribute name -> the key of CuPy's property dict, for the integer properties
_INT_FIELDS = {
    "major": "major", "minor": "minor", "total_memory": "totalGlobalMem",
    "multi_processor_count": "multiProcessorCount", "is_integrated": "integrated",
    "is_multi_gpu_board": "isMultiGpuBoard",
    "max_threads_per_multi_processor": "maxThreadsPerMultiProcessor",
    "max_threads_per_block": "maxThreadsPerBlock", "warp_size": "warpSize",
    "L2_cache_size": "l2CacheSize", "clock_rate": "clockRate",
    "memory_clock_rate": "memoryClockRate", "memory_bus_width": "memoryBusWidth",
    "shared_memory_per_block": "sharedMemPerBlock",
    "shared_memory_per_block_optin": "sharedMemPerBlockOptin",
    "shared_memory_per_multiprocessor": "sharedMemPerMultiprocessor",
    "regs_per_multiprocessor": "regsPerMultiprocessor", "pci_bus_id": "pciBusID",
    "pci_device_id": "pciDeviceID", "pci_domain_id": "pciDomainID",
}


class _DeviceProperties:
    """A GPU's properties under torch's attribute names (read from CuPy's property dict; a
    property this CUDA version does not report is 0)."""

    major: int
    minor: int
    total_memory: int
    multi_processor_count: int
    L2_cache_size: int
    pci_bus_id: int
    pci_device_id: int
    pci_domain_id: int

    def __init__(self, props: dict) -> None:
        self.name = _text(props.get("name", b""))
        self.gcnArchName = self.name  # torch reports the GPU name there on CUDA builds
        self.uuid = _uuid(props.get("uuid", b""))
        for attr, key in _INT_FIELDS.items():
            setattr(self, attr, int(props.get(key, 0)))

    def __repr__(self) -> str:
        return (f"_CudaDeviceProperties(name='{self.name}', major={self.major}, "
                f"minor={self.minor}, total_memory={self.total_memory // 2**20}MB, "
                f"multi_processor_count={self.multi_processor_count}, uuid={self.uuid}, "
                f"pci_bus_id={self.pci_bus_id}, pci_device_id={self.pci_device_id}, "
                f"pci_domain_id={self.pci_domain_id}, "
                f"L2_cache_size={self.L2_cache_size // 2**20}MB)")


def _gpu(device: DeviceArg, what: str) -> tuple:
    cp = _cupy(what)  # first, as a CPU-only torch fails before reading the argument
    return cp, _resolve(cp, cuda_index_arg(device, what), what)


def get_device_properties(device: DeviceArg = None) -> _DeviceProperties:
    """Return a GPU's properties (``.name``, ``.total_memory``, ``.major``, ``.minor``,
    ``.multi_processor_count``, ...), the current GPU's by default.

    Raises:
        CudaUnavailableError: where no GPU can be used.
        ValueError: a CPU device, or a GPU this process cannot see.

    Example:
        >>> import mpitensor as torch
        >>> if torch.cuda.is_available():
        ...     gib = torch.cuda.get_device_properties(0).total_memory / 2**30
    """
    cp, idx = _gpu(device, "get_device_properties")
    return _DeviceProperties(cp.cuda.runtime.getDeviceProperties(idx))


def get_arch_list() -> list:
    """Return the ``sm_XY`` architectures kernels are built for: CuPy compiles for the GPUs
    it sees, so those GPUs' architectures ([] without a GPU, as a CPU-only torch answers)."""
    if not _backend.cupy_available():
        return []
    cp = _backend.get_cupy()
    archs = set()
    for i in range(int(cp.cuda.runtime.getDeviceCount())):
        p = cp.cuda.runtime.getDeviceProperties(i)
        archs.add((int(p["major"]), int(p["minor"])))
    return [f"sm_{a}{b}" for a, b in sorted(archs)]


def is_tf32_supported() -> bool:
    """Return whether the current GPU computes in TF32 (compute capability 8.0 or newer);
    False without a GPU."""
    if not _backend.cupy_available():
        return False
    cp = _backend.get_cupy()
    p = cp.cuda.runtime.getDeviceProperties(int(cp.cuda.runtime.getDevice()))
    return int(p["major"]) >= 8


def can_device_access_peer(device: DeviceArg, peer_device: DeviceArg) -> bool:
    """Return whether GPU ``device`` can read ``peer_device``'s memory directly.

    Raises:
        CudaUnavailableError: no GPU can be used.
    """
    cp, a = _gpu(device, "can_device_access_peer")
    _, b = _gpu(peer_device, "can_device_access_peer")
    return a != b and bool(cp.cuda.runtime.deviceCanAccessPeer(a, b))


def _nvml(device: DeviceArg, what: str) -> tuple:
    """``(pynvml, handle)`` of the GPU ``device`` names, found by its PCI bus id."""
    try:
        import pynvml  # noqa: PLC0415 - optional, as in torch
    except ImportError as exc:
        raise ModuleNotFoundError(
            f"mpitensor.cuda.{what}() reads NVML through the nvidia-ml-py package (module "
            f"pynvml), which cannot be imported here: pip install nvidia-ml-py") from exc
    cp, idx = _gpu(device, what)
    pynvml.nvmlInit()
    bus_id = cp.cuda.runtime.deviceGetPCIBusId(idx)
    return pynvml, pynvml.nvmlDeviceGetHandleByPciBusId(_text(bus_id).encode())


def _reading(name: str, doc: str, read: Any) -> Any:
    """The public function ``name`` that returns ``read(pynvml, handle)`` for a GPU."""

    def reading(device: DeviceArg = None) -> int:
        nv, h = _nvml(device, name)
        return int(read(nv, h))

    reading.__name__ = reading.__qualname__ = name
    reading.__doc__ = (f"Return {doc} (NVML).\n\n    Raises:\n        ModuleNotFoundError: "
                       f"``pynvml`` is missing (as torch).\n        CudaUnavailableError: no "
                       f"GPU can be used.\n")
    return reading


utilization = _reading("utilization", "the percent of the last sample period a GPU's kernels "
                       "ran", lambda nv, h: nv.nvmlDeviceGetUtilizationRates(h).gpu)
memory_usage = _reading("memory_usage", "the percent of the last sample period a GPU's memory "
                        "was read or written",
                        lambda nv, h: nv.nvmlDeviceGetUtilizationRates(h).memory)
temperature = _reading("temperature", "a GPU's temperature in degrees Celsius",
                       lambda nv, h: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU))
power_draw = _reading("power_draw", "a GPU's power draw in milliwatts",
                      lambda nv, h: nv.nvmlDeviceGetPowerUsage(h))
clock_rate = _reading("clock_rate", "a GPU's streaming-multiprocessor clock in MHz",
                      lambda nv, h: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM))
device_memory_used = _reading("device_memory_used", "the bytes in use on a GPU by every "
                              "process, as the driver counts them",
                              lambda nv, h: nv.nvmlDeviceGetMemoryInfo(h).used)


def list_gpu_processes(device: DeviceArg = None) -> str:
    """Return a readable list of the processes using a GPU and their memory (NVML); where
    ``pynvml`` is missing, a line saying so (as torch returns one)."""
    try:
        nv, h = _nvml(device, "list_gpu_processes")
    except ModuleNotFoundError:
        return "nvidia-ml-py (module pynvml) is not installed: pip install nvidia-ml-py"
    cp = _backend.get_cupy()
    idx = _resolve(cp, cuda_index_arg(device, "list_gpu_processes"), "list_gpu_processes")
    procs = nv.nvmlDeviceGetComputeRunningProcesses(h)
    lines = [f"GPU:{idx}"]
    lines += [f"process {p.pid:>10d} uses {(p.usedGpuMemory or 0) / 2**20:12.3f} MB GPU memory"
              for p in procs]
    if not procs:
        lines.append("no processes are running")
    return "\n".join(lines)


class cudaStatus:  # noqa: N801 - torch's name
    """The two CUDA runtime status codes torch names."""

    SUCCESS: int = 0
    ERROR_NOT_READY: int = 34


class CudaError(RuntimeError):
    """A CUDA runtime error code, with the runtime's name and text for it where CuPy can give
    them."""

    def __init__(self, code: int) -> None:
        self.code = int(code)
        text = f"CUDA error {self.code}"
        if _backend.cupy_available():
            text = str(_backend.get_cupy().cuda.runtime.CUDARuntimeError(self.code))
        super().__init__(f"{text} ({self.code})")


def check_error(res: int) -> None:
    """Raise :class:`CudaError` for a CUDA runtime status ``res`` other than success (0)."""
    if int(res) != cudaStatus.SUCCESS:
        raise CudaError(res)


class DeferredCudaCallError(Exception):
    """An error raised by a call that was queued until CUDA started (torch's name)."""


_SYNC_MODES = {"default": 0, "warn": 1, "error": 2}


def set_sync_debug_mode(debug_mode: Any) -> None:
    """Choose what happens at a GPU call that waits for the GPU: 0/``"default"`` (nothing) is
    what mpitensor does; 1/``"warn"`` and 2/``"error"`` raise NotImplementedError, as
    mpitensor has no hook at its synchronising calls.

    Raises:
        CudaUnavailableError: no GPU can be used (a CPU-only torch raises too).
        ValueError: not one of 0, 1, 2, ``"default"``, ``"warn"``, ``"error"``.
        NotImplementedError: ``"warn"`` or ``"error"``.
    """
    _cupy("set_sync_debug_mode")
    mode = _SYNC_MODES.get(debug_mode, debug_mode) if isinstance(debug_mode, str) else debug_mode
    if isinstance(mode, bool) or mode not in (0, 1, 2):
        raise ValueError(f"set_sync_debug_mode() takes 0, 1, 2, 'default', 'warn' or 'error', "
                         f"got {debug_mode!r}")
    if mode:
        raise NotImplementedError("mpitensor.cuda.set_sync_debug_mode(): mpitensor cannot warn "
                                  "or fail at synchronising calls; only mode 0 ('default')")


def get_sync_debug_mode() -> int:
    """Return the synchronisation debug mode: 0 (see :func:`set_sync_debug_mode`).

    Raises:
        CudaUnavailableError: no GPU can be used.
    """
    _cupy("get_sync_debug_mode")
    return 0  # the only mode set_sync_debug_mode() takes
