"""``nn.DataParallel``: one process, several GPUs; each forward splits the batch across them.

On a machine without a GPU (or without CuPy) ``DataParallel`` simply calls the module, as torch
does there. With GPUs, each forward:

1. scatters the inputs along ``dim`` to the GPUs (:func:`~.scatter_gather.scatter_kwargs`);
2. copies the module to each GPU (:func:`~.replicate.replicate`: the copies' parameters are
   differentiable copies of the originals, so backward sums every replica's gradient into the
   original parameters' ``.grad``);
3. runs each copy on its chunk (:func:`~.parallel_apply.parallel_apply`);
4. gathers the outputs on ``output_device`` (:func:`~.scatter_gather.gather`).

With one GPU the module runs directly on it. Across processes or machines, use
:class:`~mpitensor.nn.parallel.DistributedDataParallel` instead (as torch advises too).

The autograd engine runs every node with the current GPU unchanged, so a forward over several
GPUs hooks its nodes to make the right GPU current before each runs in backward (the device of
the gradient it receives; for a copy between devices, the one the gradient goes to), and puts
the caller's GPU back when backward ends.
"""

from __future__ import annotations

import itertools
import warnings
import weakref
from typing import Any, List, Optional, Sequence

from mpitensor import autograd as _autograd
from mpitensor import backend as _backend
from mpitensor.autograd import Node
from mpitensor.tensor import Tensor

from ..modules.module import Module
from ._outputs import collect_tensors
from .parallel_apply import parallel_apply
from .replicate import replicate
from .scatter_gather import as_device, gather, scatter_kwargs

__all__ = ["DataParallel", "data_parallel"]


def _gpu_devices(device_ids: Optional[Sequence[Any]]) -> List[_backend.device]:
    """The GPUs to run on: ``device_ids`` (default: every GPU); none without a usable GPU."""
    from mpitensor import cuda  # noqa: PLC0415 - imports CuPy lazily

    if not cuda.is_available():
        return []
    if device_ids is None:
        device_ids = list(range(cuda.device_count()))
    devices = [as_device(d) for d in device_ids]
    bad = [str(d) for d in devices if d.type != "cuda"]
    if bad:
        raise ValueError(f"DataParallel: device_ids must name GPUs, got {bad}; leave "
                         "device_ids=None to use every GPU")
    return [d if d.index is not None else _backend.device("cuda", cuda.current_device())
            for d in devices]


def _warn_imbalance(devices: Sequence[_backend.device]) -> None:
    """Warn, as torch does, when the GPUs differ much in memory or compute units: the
    slowest one sets the pace of every step."""
    if len(devices) < 2 or devices[0].type != "cuda" or not _backend.cupy_available():
        return
    cp = _backend.get_cupy()
    props = [cp.cuda.runtime.getDeviceProperties(d.index) for d in devices]
    for key, what in (("totalGlobalMem", "memory"), ("multiProcessorCount", "compute units")):
        values = [int(p[key]) for p in props]
        lo, hi = min(values), max(values)
        if lo < 0.75 * hi:
            slow = devices[values.index(lo)]
            warnings.warn(f"DataParallel: {slow} has less than 75% of the {what} of the "
                          f"largest GPU in {[str(d) for d in devices]}; it will hold the "
                          "others back. Leave it out of device_ids (or set "
                          "CUDA_VISIBLE_DEVICES)", UserWarning, stacklevel=3)
            return


def _output_device(output_device: Any, devices: Sequence[_backend.device]) -> _backend.device:
    return devices[0] if output_device is None else as_device(output_device)


# --------------------------------------------------------------------------------------------
# backward on several GPUs


def _use_device(dev: Optional[_backend.device]) -> None:
    """Make ``dev`` the current GPU (nothing for the CPU)."""
    if dev is not None and dev.type == "cuda":
        _backend.get_cupy().cuda.Device(dev.index).use()


def _current_device() -> Optional[_backend.device]:
    if not _backend.cupy_available():
        return None
    return _backend.device("cuda", int(_backend.get_cupy().cuda.runtime.getDevice()))


class _BackwardDevices:
    """Pre-hooks that make each node's GPU current before it runs in backward, and a callback
    that restores the caller's GPU when backward ends."""

    def __init__(self) -> None:
        self.saved: Optional[list] = None  # [device] while a backward runs

    def before(self, node_ref: "weakref.ReferenceType[Node]", grad: Tensor) -> None:
        if self.saved is None:
            self.saved = [_current_device()]
            _autograd.queue_callback(self._restore, lambda exc: self._restore())
        node = node_ref()
        # a copy between devices (ToCopy) records where its input was: the gradient goes there
        origin = getattr(node, "origin", None) if node is not None else None
        target = origin[1] if isinstance(origin, tuple) and len(origin) == 2 else None
        if not isinstance(target, _backend.device):
            target = None
        if target is None and grad is not None and grad._data is not None:
            target = grad.device
        _use_device(target)

    def _restore(self) -> None:
        saved, self.saved = self.saved, None
        if saved:
            _use_device(saved[0])


def _guard_backward(outputs: Any, stop: Sequence[Tensor]) -> int:
    """Hook every node between ``outputs`` and the tensors in ``stop`` (and the leaves).

    Returns:
        How many nodes were hooked.
    """
    found: List[Tensor] = []
    collect_tensors(outputs, found)
    boundary = {id(t.grad_fn) for t in stop if t.grad_fn is not None}
    guard = _BackwardDevices()
    seen: set = set()
    todo = [t.grad_fn for t in found if t.grad_fn is not None]
    while todo:
        node = todo.pop()
        if id(node) in seen or id(node) in boundary:
            continue
        seen.add(id(node))
        ref = weakref.ref(node)
        node.register_prehook(lambda g, ref=ref: guard.before(ref, g))
        todo.extend(n for n in node._next if type(n) is Node)
    return len(seen)


def _run(module: Module, devices: Sequence[_backend.device], output: _backend.device,
         inputs: tuple, kwargs: dict, scatter: Any, replicate_: Any, apply: Any,
         gather_: Any) -> Any:
    """Scatter, replicate, apply, gather: the forward of DataParallel and data_parallel.

    The four steps have the signatures of DataParallel's overridable methods.
    """
    ins, kws = scatter(inputs, kwargs, devices)
    if not ins and not kws:  # no arguments at all: one call
        ins, kws = ((),), ({},)
    if len(devices) == 1:
        return module(*ins[0], **kws[0])
    used = devices[:len(ins)]
    replicas = replicate_(module, used)
    out = gather_(apply(replicas, ins, kws), output)
    if _autograd.is_grad_enabled() and any(d.type == "cuda" for d in used):
        _guard_backward(out, _flat(inputs, kwargs))
    return out


def _flat(inputs: tuple, kwargs: dict) -> List[Tensor]:
    found: List[Tensor] = []
    collect_tensors(list(inputs) + list(kwargs.values()), found)
    return found


def _check_on(module: Module, src: _backend.device) -> None:
    for t in itertools.chain(module.parameters(), module.buffers()):
        if t is not None and str(t.device) != str(src):
            raise RuntimeError(
                f"DataParallel: the module's parameters and buffers must be on {src} "
                f"(device_ids[0]), but one is on {t.device}; call module.to('{src}') first")


# --------------------------------------------------------------------------------------------
# DataParallel


class DataParallel(Module):
    """Run a module on several GPUs of one process, splitting each batch along ``dim``.

    torch's ``nn.DataParallel``. Without a usable GPU it calls the module directly
    (``device_ids`` is then ``[]``), as torch does on a CPU-only machine. With GPUs the module
    must be on ``device_ids[0]``; each forward scatters the inputs, runs one replica per GPU
    and gathers the outputs on ``output_device``; backward sums the replicas' gradients into
    the module's own parameters. Buffers updated in place during forward (BatchNorm's running
    statistics) keep the first replica's update only, and each replica normalises with its
    own chunk's statistics, as in torch.

    Args:
        module: the module to parallelise (kept at ``.module``; the state dict's keys are
            prefixed ``module.``, as in torch).
        device_ids: the GPUs (numbers, ``"cuda:N"`` or devices); default: every GPU.
        output_device: where outputs are gathered (a GPU number, ``-1`` for the CPU);
            default: ``device_ids[0]``.
        dim: the batch dimension the inputs are split along.

    Attributes:
        module: the wrapped module.
        device_ids: the GPU numbers used (``[]`` without a GPU).
        output_device: the GPU number outputs are gathered on (``-1``: the CPU; None without
            a GPU).
        dim: the batch dimension.

    Raises:
        ValueError: ``device_ids`` names a CPU.
        RuntimeError: (at forward) the module is not on ``device_ids[0]``.

    Example:
        >>> import mpitensor as mt, mpitensor.nn as nn
        >>> model = nn.DataParallel(nn.Linear(4, 2))   # on a CPU-only machine: just the module
        >>> tuple(model(mt.ones(3, 4)).shape)
        (3, 2)
        >>> list(model.state_dict())
        ['module.weight', 'module.bias']
    """

    def __init__(self, module: Module, device_ids: Optional[Sequence[Any]] = None,
                 output_device: Any = None, dim: int = 0) -> None:
        super().__init__()
        if not isinstance(module, Module):
            raise TypeError(f"DataParallel: module must be an mpitensor.nn.Module, got "
                            f"{type(module).__name__}")
        self.module = module
        self.dim = dim
        self._devices = _gpu_devices(device_ids)
        if not self._devices:
            self.device_ids: List[Any] = []
            self.output_device: Any = None
            self.src_device_obj: Optional[_backend.device] = None
            return
        self.device_ids = [_index(d) for d in self._devices]
        self._output = _output_device(output_device, self._devices)
        self.output_device = _index(self._output)
        self.src_device_obj = self._devices[0]
        _warn_imbalance(self._devices)
        if len(self._devices) == 1:
            self.module.to(self.src_device_obj)

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        """Run the module: directly without GPUs, else split over ``device_ids`` and gathered."""
        if not self._devices:
            return self.module(*inputs, **kwargs)
        _check_on(self.module, self.src_device_obj)
        return _run(self.module, self._devices, self._output, inputs, kwargs, self.scatter,
                    self.replicate, self.parallel_apply, self.gather)

    def replicate(self, module: Module, device_ids: Sequence[Any]) -> List[Module]:
        """The replicas for one forward (override to customise), with autograd."""
        return replicate(module, device_ids, not _autograd.is_grad_enabled())

    def scatter(self, inputs: tuple, kwargs: dict, device_ids: Sequence[Any]) -> tuple:
        """Split the arguments over the devices (override to customise)."""
        return scatter_kwargs(inputs, kwargs, device_ids, dim=self.dim)

    def parallel_apply(self, replicas: Sequence[Module], inputs: Sequence[Any],
                       kwargs: Sequence[dict]) -> List[Any]:
        """Run each replica on its share (override to customise)."""
        return parallel_apply(replicas, inputs, kwargs, self._devices[:len(replicas)])

    def gather(self, outputs: Sequence[Any], output_device: Any) -> Any:
        """Collect the replicas' outputs on ``output_device`` (override to customise)."""
        return gather(outputs, output_device, dim=self.dim)

    def extra_repr(self) -> str:
        return f"device_ids={self.device_ids}" if self.device_ids else ""


def _index(d: _backend.device) -> Any:
    """torch's integer form of a device: the GPU number, ``-1`` for the CPU."""
    if d.type == "cuda":
        return d.index
    return -1


def data_parallel(module: Module, inputs: Any, device_ids: Optional[Sequence[Any]] = None,
                  output_device: Any = None, dim: int = 0,
                  module_kwargs: Optional[dict] = None) -> Any:
    """Evaluate ``module(*inputs, **module_kwargs)`` split over several GPUs (functional form).

    Args:
        module: the module (on ``device_ids[0]``).
        inputs: the positional arguments (a tuple, or one value).
        device_ids: the GPUs; default: every GPU.
        output_device: where to gather the output; default: ``device_ids[0]``.
        dim: the batch dimension.
        module_kwargs: keyword arguments for the module.

    Returns:
        The gathered output.

    Raises:
        RuntimeError: there is no usable GPU (as torch, which cannot tell the device type
            then), or the module is not on ``device_ids[0]``.

    Example:
        >>> import mpitensor as mt, mpitensor.nn as nn
        >>> from mpitensor.nn.parallel import data_parallel
        >>> if mt.cuda.device_count() > 1:
        ...     y = data_parallel(nn.Linear(4, 2).cuda(0), mt.ones(8, 4, device="cuda:0"))
    """
    if not isinstance(inputs, tuple):
        inputs = (inputs,) if inputs is not None else ()
    devices = _gpu_devices(device_ids)
    if not devices:
        raise RuntimeError("data_parallel: no usable GPU (CuPy and a CUDA device are needed); "
                           "call the module directly on the CPU")
    _check_on(module, devices[0])
    return _run(
        module, devices, _output_device(output_device, devices), inputs, dict(module_kwargs or {}),
        lambda ins, kws, devs: scatter_kwargs(ins, kws, devs, dim),
        lambda m, devs: replicate(m, devs, not _autograd.is_grad_enabled()),
        lambda reps, ins, kws: parallel_apply(reps, ins, kws, devices[:len(reps)]),
        lambda outs, dev: gather(outs, dev, dim))
