"""``RemoteModule``: an ``nn.Module`` built on another RPC worker and run there.

``RemoteModule("ps/cpu", nn.EmbeddingBag, args=(100, 16))`` asks worker ``ps`` to build
``nn.EmbeddingBag(100, 16)`` (moved to ``cpu``) and keeps an RRef to it. ``forward`` (and
calling the object) runs the module's ``forward`` on that worker over ``rpc_sync``;
``forward_async`` returns a Future. Inside a ``dist_autograd.context()``, the gradient of what
it returned flows back to the remote parameters (they accumulate in the context, as for any
RPC), and ``remote_parameters()`` gives the RRefs a ``DistributedOptimizer`` steps.

The object is a proxy, not a module with local state: the local-module methods torch refuses
for it (``parameters``, ``state_dict``, ``to``, hooks, ...) raise ``ValueError`` here too, and
``train()``/``eval()`` run on the remote module. It can be passed to other workers as an RPC
argument or result (it then refers to the same remote module), never pickled otherwise.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple, Union

from .... import nn
from ....backend import device as _device
from ...rpc import _state, _wire
from ...rpc._rref import RRef
from ...rpc.api import remote, rpc_async, rpc_sync

__all__ = ["RemoteModule"]

_FORMAT = "'<workername>/<device>', 'rank:<rank>/<device>' or '<device>'"
# what travels when a RemoteModule is an RPC argument or result
_SENT = ("on", "device", "is_device_map_set", "is_scriptable", "module_rref")


def _parse_remote_device(remote_device: Any) -> Tuple[Optional[str], Optional[int], str]:
    """``(worker name, rank, device)`` of ``remote_device`` as torch reads it.

    ``"worker1/cuda:0"`` -> ``("worker1", None, "cuda:0")``, ``"rank:1/cpu"`` -> ``(None, 1,
    "cpu")``, ``"worker1"`` -> ``("worker1", None, "cpu")``, ``"cuda:0"`` -> ``(None, None,
    "cuda:0")``.

    Raises:
        ValueError: a string of another shape (an empty worker name, more than one ``/``, a
            ``rank:`` that is not a number).
        TypeError: neither a string nor a device.
    """
    bad = ValueError(f"remote_device {remote_device!r} cannot be read: write it as {_FORMAT}")
    if isinstance(remote_device, _device):
        return None, None, str(remote_device)
    if not isinstance(remote_device, str):
        raise TypeError(f"remote_device must be a string such as 'worker1/cpu', got "
                        f"{type(remote_device).__name__}")
    fields = remote_device.split("/")
    if len(fields) > 2:
        raise bad
    if len(fields) == 2:
        worker, dev = fields
    else:
        try:
            _device(fields[0])
            worker, dev = None, fields[0]
        except (ValueError, RuntimeError, TypeError):
            worker, dev = fields[0], "cpu"
    if worker is not None and not worker:
        raise bad
    dev = str(_device(dev))  # an unknown device type raises (ValueError and RuntimeError)
    if worker is None:
        return None, None, dev
    parts = worker.split(":")
    if len(parts) == 1:
        return worker, None, dev
    if len(parts) == 2 and parts[0] == "rank" and parts[1].isdigit():
        return None, int(parts[1]), dev
    raise bad


def _create_module(module_cls: Any, args: tuple, kwargs: dict, dev: str) -> nn.Module:
    """Runs on the remote worker: build the module and move it to ``dev``."""
    module = module_cls(*args, **kwargs)
    if not isinstance(module, nn.Module):
        raise ValueError(f"RemoteModule: module_cls(*args, **kwargs) must return an nn.Module, "
                         f"but it returned a {type(module).__name__}")
    if dev != "cpu":
        module.to(dev)
    return module


def _param_rrefs(module_rref: RRef, recurse: bool) -> List[RRef]:
    """Runs on the module's owner: an owner RRef per parameter."""
    return [RRef(p) for p in module_rref.local_value().parameters(recurse)]


def _moved(value: Any, dev: str) -> Any:
    return value.to(dev) if hasattr(value, "requires_grad") and hasattr(value, "to") else value


def _remote_forward(module_rref: RRef, dev: str, is_device_map_set: bool, *args: Any,
                    **kwargs: Any) -> Any:
    """Runs on the module's owner: ``module.forward`` (tensors moved to a GPU module's device
    and the outputs back to the CPU, as torch does without a device map)."""
    module = module_rref.local_value()
    if not dev.startswith("cuda"):
        return module.forward(*args, **kwargs)
    out = module.forward(*(_moved(a, dev) for a in args),
                         **{k: _moved(v, dev) for k, v in kwargs.items()})
    if is_device_map_set:
        return out
    if isinstance(out, tuple):
        return tuple(_moved(o, "cpu") for o in out)
    return _moved(out, "cpu")


def _receive(*values: Any) -> "RemoteModule":
    """Rebuild a RemoteModule that came as an RPC argument or result."""
    m = object.__new__(RemoteModule)
    m.__dict__.update(nn.Module().__dict__)
    m.__dict__.update(zip(_SENT, values))
    return m


def _not_supported(name: str) -> Any:
    def method(self: "RemoteModule", *args: Any, **kwargs: Any) -> Any:
        raise ValueError(f"RemoteModule does not support {name}(): the module lives on "
                         f"{self.on!r}; call it there through get_module_rref().rpc_sync()")

    method.__name__ = method.__qualname__ = name
    method.__doc__ = "Not supported for a RemoteModule: raises ``ValueError``."
    return method


class RemoteModule(nn.Module):
    """A module that lives on another RPC worker (``torch.distributed.nn.RemoteModule``).

    Args:
        remote_device: where to build it: ``"<worker name>/<device>"`` (``"ps/cpu"``,
            ``"worker1/cuda:0"``), ``"rank:<rank>/<device>"``, or a worker name alone (cpu).
        module_cls: the module class (or any callable returning an ``nn.Module``), reachable
            by import on the remote worker (defined at module level).
        args, kwargs: passed to ``module_cls`` there.

    Raises:
        ValueError: ``remote_device`` cannot be read, or names an unknown device type.
        RuntimeError: RPC is not initialized in this process.
        UnknownWorkerError: no worker has that name.

    Example:
        >>> rm = RemoteModule("worker1/cpu", nn.Linear, args=(20, 30))
        >>> with dist_autograd.context() as cid:
        ...     loss = rm(torch.randn(4, 20)).sum()
        ...     dist_autograd.backward(cid, [loss])
        ...     DistributedOptimizer(optim.SGD, rm.remote_parameters(), lr=0.1).step(cid)
    """

    def __init__(self, remote_device: Union[str, Any], module_cls: Any,
                 args: Optional[tuple] = None, kwargs: Optional[Dict[str, Any]] = None,
                 _module_interface_cls: Any = None) -> None:
        super().__init__()
        if _module_interface_cls is not None:
            raise NotImplementedError("RemoteModule: _module_interface_cls (a TorchScript "
                                      "interface) is not supported: mpitensor has no "
                                      "TorchScript; leave it out")
        worker, rank, dev = _parse_remote_device(remote_device)
        agent = _state.current("RemoteModule")
        on: Union[str, int, None] = worker if worker is not None else rank
        if on is None:
            raise ValueError(f"RemoteModule: remote_device {remote_device!r} names no worker; "
                             f"write it as {_FORMAT.split(' or ')[0]}")
        agent.resolve(on, "RemoteModule")  # an unknown worker fails before anything is sent
        self.on = on
        self.device = dev
        self.is_device_map_set = False  # (TensorPipe device maps do not exist here)
        self.is_scriptable = False
        self.module_rref = remote(on, _create_module,
                                  (module_cls, tuple(args or ()), dict(kwargs or {}), dev))

    @staticmethod
    def init_from_module_rref(remote_device: str, module_rref: RRef,
                              _module_interface_cls: Any = None) -> "RemoteModule":
        """A RemoteModule over an existing remote module (``module_rref``), which it shares.

        Raises:
            ValueError: ``remote_device`` cannot be read.
            NotImplementedError: ``_module_interface_cls`` given (TorchScript).
        """
        if _module_interface_cls is not None:
            raise NotImplementedError("RemoteModule.init_from_module_rref: "
                                      "_module_interface_cls (TorchScript) is not supported")
        worker, rank, dev = _parse_remote_device(remote_device)
        return _receive(worker if worker is not None else rank, dev, False, False, module_rref)

    # ---- what runs remotely
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Run the remote module's ``forward`` on its worker and return the result."""
        return self.forward_async(*args, **kwargs).wait()

    def forward_async(self, *args: Any, **kwargs: Any) -> Any:
        """Start the remote module's ``forward``; return a Future of its result."""
        return rpc_async(self.module_rref.owner(), _remote_forward,
                         (self.module_rref, self.device, self.is_device_map_set) + args, kwargs)

    def remote_parameters(self, recurse: bool = True) -> List[RRef]:
        """RRefs to the remote module's parameters (for ``DistributedOptimizer``)."""
        return rpc_sync(self.on, _param_rrefs, args=(self.module_rref, recurse))

    def get_module_rref(self) -> RRef:
        """The RRef of the remote module."""
        return self.module_rref

    def train(self, mode: bool = True) -> Any:
        """Set the remote module's training mode; returns what its ``train`` returns (a
        copy of the module, pickled back, as in torch)."""
        return self.module_rref.rpc_sync().train(mode)

    def eval(self) -> Any:
        """The remote module's ``eval()`` (see :meth:`train`)."""
        return self.module_rref.rpc_sync().eval()

    def parameters(self, recurse: bool = True) -> Any:
        """Not supported: the parameters are remote; use :meth:`remote_parameters`."""
        raise ValueError("RemoteModule does not support parameters(): its parameters live on "
                         f"{self.on!r}; use remote_parameters() (RRefs) instead")

    # ---- travelling
    def __reduce__(self) -> tuple:
        if _wire.pickling_for() is None:
            raise RuntimeError("a RemoteModule can only be pickled by RPC calls (as an "
                               "argument or result); send get_module_rref() or rebuild it "
                               "with RemoteModule.init_from_module_rref")
        return (_receive, tuple(self.__dict__[k] for k in _SENT))

    def __getstate__(self) -> Any:
        raise RuntimeError("a RemoteModule cannot be pickled outside RPC calls")

    def __setstate__(self, state: Any) -> None:
        raise RuntimeError("a RemoteModule cannot be unpickled outside RPC calls")


for _name in ("register_buffer", "register_parameter", "add_module", "apply", "cuda", "ipu",
              "xpu", "cpu", "type", "float", "double", "half", "bfloat16", "to",
              "register_backward_hook", "register_forward_pre_hook", "register_forward_hook",
              "state_dict", "load_state_dict", "named_parameters", "buffers",
              "named_buffers", "children", "named_children", "modules", "named_modules",
              "requires_grad_", "zero_grad", "share_memory", "extra_repr"):
    setattr(RemoteModule, _name, _not_supported(_name))
del _name
