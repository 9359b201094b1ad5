"""``Optimizer``: the base class of every optimiser (param groups, state, state dicts).

The layout follows ``torch.optim.Optimizer`` exactly, so code and checkpoints port: ``param_groups``
is a list of dicts (each with ``"params"`` and the hyper-parameters), ``state`` maps a parameter to
its per-parameter dict (``{"momentum_buffer": Tensor}`` for SGD), and ``state_dict()`` replaces
parameters by their position across the groups:
``{"state": {0: {...}, ...}, "param_groups": [{"lr": ..., "params": [0, 1, ...]}, ...]}``.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from typing import Any, Callable, Dict, Iterator, List, Optional

from mpitensor import autograd as _autograd
from mpitensor import backend as _backend
from mpitensor import dtypes as _dt
from mpitensor.tensor import Tensor

__all__ = ["Optimizer", "required", "swap_in_optimizer_params_and_state"]


class _RequiredParameter:
    """Marks a hyper-parameter that has no default and must be given (torch's ``required``)."""

    def __repr__(self) -> str:
        return "<required parameter>"


required = _RequiredParameter()


def _describe(x: Any) -> str:
    return type(x).__name__


class Optimizer:
    """Base class of optimisers: holds parameter groups and per-parameter state.

    Args:
        params: an iterable of Tensors, or of dicts (parameter groups) each with a ``"params"``
            entry and optional per-group hyper-parameters overriding ``defaults``.
        defaults: the default hyper-parameters of every group.

    Raises:
        TypeError: ``params`` is a single Tensor, a set, or holds something other than Tensors.
        ValueError: ``params`` is empty, a parameter is not a leaf, or appears twice.

    Example:
        >>> import mpitensor as mt
        >>> from mpitensor.optim import SGD
        >>> w = mt.zeros(3, requires_grad=True)
        >>> opt = SGD([w], lr=0.1)
        >>> opt.param_groups[0]["lr"]
        0.1
    """

    def __init__(self, params: Any, defaults: Dict[str, Any]) -> None:
        if not isinstance(defaults, dict):
            raise TypeError(f"defaults must be a dict of hyper-parameters, got "
                            f"{_describe(defaults)}")
        self.defaults: Dict[str, Any] = defaults
        self.state: defaultdict = defaultdict(dict)
        self.param_groups: List[Dict[str, Any]] = []
        if isinstance(params, Tensor):
            raise TypeError(
                "params argument given to the optimizer should be an iterable of Tensors or "
                "dicts, but got a Tensor: wrap it in a list, e.g. SGD([w], lr=0.1)"
            )
        if isinstance(params, (set, frozenset)):
            raise TypeError("optimizer parameters must be an ordered collection (a set's order "
                            "changes between runs, which breaks state_dict): pass a list")
        try:
            param_groups = list(params)
        except TypeError:
            raise TypeError(
                f"params argument given to the optimizer should be an iterable of Tensors or "
                f"dicts, but got {_describe(params)}"
            ) from None
        if len(param_groups) == 0:
            raise ValueError("optimizer got an empty parameter list: pass model.parameters() "
                             "(or a list of Tensors) that holds at least one parameter")
        if not isinstance(param_groups[0], dict):
            param_groups = [{"params": param_groups}]
        for group in param_groups:
            self.add_param_group(group)

    # ---- groups -----------------------------------------------------------------------------

    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        """Add a parameter group (e.g. a layer unfrozen during fine-tuning).

        Args:
            param_group: a dict with ``"params"`` (a Tensor or an iterable of Tensors) and
                optional hyper-parameters; missing ones are taken from ``defaults``.

        Raises:
            TypeError: not a dict, or ``params`` holds something other than Tensors.
            ValueError: a parameter is not a leaf, is already in a group, or a required
                hyper-parameter is missing.

        Example:
            >>> import mpitensor as mt
            >>> from mpitensor.optim import SGD
            >>> opt = SGD([mt.zeros(2, requires_grad=True)], lr=0.1)
            >>> opt.add_param_group({"params": [mt.zeros(3, requires_grad=True)], "lr": 0.01})
            >>> [g["lr"] for g in opt.param_groups]
            [0.1, 0.01]
        """
        if not isinstance(param_group, dict):
            raise TypeError(f"a parameter group must be a dict, got {_describe(param_group)}")
        if "params" not in param_group:
            raise ValueError("a parameter group must have a 'params' entry")
        params = param_group["params"]
        if isinstance(params, Tensor):
            params = [params]
        elif isinstance(params, (set, frozenset)):
            raise TypeError("optimizer parameters must be an ordered collection (a set's order "
                            "changes between runs, which breaks state_dict): pass a list")
        else:
            params = list(params)
        for i, p in enumerate(params):
            if not isinstance(p, Tensor):
                raise TypeError(f"optimizer can only optimize Tensors, but parameter {i} of the "
                                f"group is a {_describe(p)}")
            if not p.is_leaf:
                raise ValueError(f"can't optimize a non-leaf Tensor (parameter {i} of the group "
                                 f"was made by {type(p.grad_fn).__name__}); optimise the leaf "
                                 f"it was computed from, or .detach().requires_grad_() it")
        group = dict(param_group)
        group["params"] = params
        for name, default in self.defaults.items():
            if default is required and name not in group:
                raise ValueError(f"parameter group didn't specify a value of required "
                                 f"optimization parameter {name!r}")
            group.setdefault(name, default)
        seen = {id(p) for g in self.param_groups for p in g["params"]}
        ids = [id(p) for p in params]
        if len(set(ids)) != len(ids):
            raise ValueError("a parameter appears more than once in the parameter group; "
                             "each parameter must appear exactly once")
        if seen.intersection(ids):
            raise ValueError("some parameters appear in more than one parameter group; each "
                             "parameter must belong to exactly one group")
        self.param_groups.append(group)

    # ---- gradients --------------------------------------------------------------------------

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Reset the gradients of every parameter.

        Args:
            set_to_none: set ``.grad`` to None (the default, as in torch: cheaper, and the next
                backward allocates a fresh gradient) instead of filling it with zeros in place.

        Example:
            >>> import mpitensor as mt
            >>> from mpitensor.optim import SGD
            >>> w = mt.ones(2, requires_grad=True)
            >>> opt = SGD([w], lr=0.1)
            >>> w.grad = mt.ones(2)
            >>> opt.zero_grad()
            >>> w.grad is None
            True
        """
        for group in self.param_groups:
            for p in group["params"]:
                g = p.grad
                if g is None:
                    continue
                if set_to_none:
                    p.grad = None
                else:
                    if g.grad_fn is not None:  # as torch: a zeroed grad is detached
                        g.grad_fn = None
                    g._requires_grad = False
                    g._data.fill(0)

    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:
        """Update the parameters once; subclasses implement it."""
        raise NotImplementedError(f"{type(self).__name__} does not implement step()")

    @staticmethod
    def _closure_loss(closure: Optional[Callable[[], Any]]) -> Any:
        """What a step's ``closure`` returns, run with gradients enabled (None without one)."""
        if closure is None:
            return None
        with _autograd.enable_grad():
            return closure()

    # ---- state dicts ------------------------------------------------------------------------

    def state_dict(self) -> Dict[str, Any]:
        """Return the optimiser's state in torch's layout (parameters replaced by indices).

        The per-parameter state values are the optimiser's own Tensors (not copies), as in
        torch; :func:`mpitensor.save` writes them out.

        Returns:
            ``{"state": {index: {...}}, "param_groups": [{..., "params": [indices]}]}``; indices
            count the parameters across the groups in order, and only parameters that have
            state appear under ``"state"``.

        Example:
            >>> import mpitensor as mt
            >>> from mpitensor.optim import SGD
            >>> opt = SGD([mt.zeros(2, requires_grad=True)], lr=0.1, momentum=0.9)
            >>> opt.state_dict()["param_groups"][0]["params"]
            [0]
        """
        index: Dict[int, int] = {}
        groups = []
        start = 0
        for g in self.param_groups:
            packed = {k: v for k, v in g.items() if k != "params"}
            for i, p in enumerate(g["params"], start):
                index.setdefault(id(p), i)
            packed["params"] = [index[id(p)] for p in g["params"]]
            start += len(packed["params"])
            groups.append(packed)
        state = {index[id(p)]: dict(s) for p, s in self.state.items() if id(p) in index}
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Restore state from :meth:`state_dict` (e.g. read back with ``mpitensor.load``).

        Hyper-parameters of each group are replaced by the saved ones; per-parameter state is
        copied (so the dict can be reused), cast to the parameter's dtype and moved to its device
        when the parameter is floating point.

        Args:
            state_dict: a dict with ``"state"`` and ``"param_groups"`` as returned by
                :meth:`state_dict`; state values may be Tensors or NumPy/CuPy arrays.

        Raises:
            ValueError: the number of groups, of parameters in a group, or a state Tensor's shape
                does not match this optimiser's parameters, or an index is unknown.
            TypeError: ``state_dict`` is not such a dict.

        Example:
            >>> import mpitensor as mt
            >>> from mpitensor.optim import SGD
            >>> w = mt.zeros(2, requires_grad=True)
            >>> opt = SGD([w], lr=0.1, momentum=0.9)
            >>> opt.load_state_dict(SGD([w], lr=0.5, momentum=0.9).state_dict())
            >>> opt.param_groups[0]["lr"]
            0.5
        """
        if not isinstance(state_dict, dict) or "param_groups" not in state_dict \
                or "state" not in state_dict:
            raise TypeError("load_state_dict() takes a dict with 'state' and 'param_groups' "
                            "entries, as returned by Optimizer.state_dict()")
        saved_groups = state_dict["param_groups"]
        if not isinstance(saved_groups, (list, tuple)):
            raise TypeError(f"state_dict['param_groups'] must be a list, got "
                            f"{_describe(saved_groups)}")
        if len(saved_groups) != len(self.param_groups):
            raise ValueError(f"loaded state dict has a different number of parameter groups "
                             f"({len(saved_groups)}) than this optimizer "
                             f"({len(self.param_groups)}); build the optimizer with the same "
                             f"groups as the one that was saved")
        id_map: Dict[Any, Tensor] = {}
        for gi, (g, sg) in enumerate(zip(self.param_groups, saved_groups)):
            if not isinstance(sg, dict) or "params" not in sg:
                raise TypeError(f"state_dict['param_groups'][{gi}] must be a dict with 'params'")
            if len(sg["params"]) != len(g["params"]):
                raise ValueError(
                    f"loaded state dict contains a parameter group that doesn't match the size "
                    f"of optimizer's group: group {gi} has {len(sg['params'])} parameters in the "
                    f"state dict and {len(g['params'])} in this optimizer"
                )
            for k, p in zip(sg["params"], g["params"]):
                id_map[k] = p
        saved_state = state_dict["state"]
        if not isinstance(saved_state, dict):
            raise TypeError(f"state_dict['state'] must be a dict, got {_describe(saved_state)}")
        new_state: defaultdict = defaultdict(dict)
        for k, s in saved_state.items():
            if k not in id_map:
                raise ValueError(f"state_dict['state'] has an entry for parameter index {k!r}, "
                                 f"which no parameter group lists")
            p = id_map[k]
            if not isinstance(s, dict):
                raise TypeError(f"state_dict['state'][{k!r}] must be a dict, got {_describe(s)}")
            new_state[p] = {name: _cast_state(name, v, p, k) for name, v in s.items()}
        new_groups = []
        for g, sg in zip(self.param_groups, saved_groups):
            ng = {key: val for key, val in sg.items() if key != "params"}
            for key, default in self.defaults.items():  # dicts saved by older versions
                if default is not required:
                    ng.setdefault(key, default)
            ng["params"] = g["params"]
            new_groups.append(ng)
        self.state = new_state
        self.param_groups = new_groups

    # ---- printing / pickling ----------------------------------------------------------------

    def __repr__(self) -> str:
        s = type(self).__name__ + " ("
        for i, group in enumerate(self.param_groups):
            s += f"\nParameter Group {i}\n"
            for key in sorted(group):
                if key != "params":
                    s += f"    {key}: {group[key]}\n"
        return s + ")"

    def __getstate__(self) -> Dict[str, Any]:
        return {"defaults": self.defaults, "state": self.state, "param_groups": self.param_groups}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__dict__.update(state)


@contextlib.contextmanager
def swap_in_optimizer_params_and_state(optimizer: Optimizer, swapin_parameters: Dict[str, Tensor],
                                       swapin_optim_state: Dict[str, Any]) -> Iterator[None]:
    """Run with other parameters and state in ``optimizer``; the live ones come back on exit.

    Inside the context ``optimizer.param_groups`` hold ``swapin_parameters`` (in the order of
    the optimiser's own parameters, as ``model.named_parameters()`` gives them) with the
    hyper-parameters of ``swapin_optim_state["param_groups"]``, and ``optimizer.state`` holds
    ``swapin_optim_state["state"]`` keyed by those parameters. The state Tensors are used as
    they are, so in-place updates (a ``step()``) land in the dict given; entries added or
    replaced in the per-parameter dicts do not.

    Args:
        optimizer: the live optimiser.
        swapin_parameters: name -> Tensor, one per parameter of the optimiser, in its order.
        swapin_optim_state: a dict shaped like :meth:`Optimizer.state_dict`'s.

    Raises:
        ValueError: the number of parameters or groups does not match the optimiser's, or a
            state entry names a parameter index no group lists.

    Example:
        >>> import mpitensor as mt
        >>> from mpitensor.optim import SGD
        >>> w = mt.tensor([1.0], requires_grad=True)
        >>> opt = SGD([w], lr=0.5)
        >>> other = mt.tensor([4.0], requires_grad=True)
        >>> other.grad = mt.tensor([2.0])
        >>> with swap_in_optimizer_params_and_state(opt, {"w": other}, opt.state_dict()):
        ...     opt.step()
        >>> other, w
        (tensor([3.], requires_grad=True), tensor([1.], requires_grad=True))
    """
    params = list(swapin_parameters.values())
    live_groups, live_state = optimizer.param_groups, optimizer.state
    count = sum(len(g["params"]) for g in live_groups)
    saved_groups = swapin_optim_state["param_groups"]
    if len(params) != count or len(saved_groups) != len(live_groups):
        raise ValueError(f"swap_in_optimizer_params_and_state: the optimizer has {count} "
                         f"parameters in {len(live_groups)} groups; got {len(params)} "
                         f"parameters and {len(saved_groups)} groups to swap in")
    groups: List[Dict[str, Any]] = []
    by_index: Dict[Any, Tensor] = {}
    position = 0
    for live, saved in zip(live_groups, saved_groups):
        mine = params[position:position + len(live["params"])]
        position += len(mine)
        group = {k: v for k, v in saved.items() if k != "params"}
        group["params"] = mine
        by_index.update(zip(saved["params"], mine))
        groups.append(group)
    state: defaultdict = defaultdict(dict)
    for index, entry in swapin_optim_state["state"].items():
        if index not in by_index:
            raise ValueError(f"swap_in_optimizer_params_and_state: state for parameter index "
                             f"{index!r}, which no group lists")
        state[by_index[index]] = dict(entry)
    optimizer.param_groups, optimizer.state = groups, state
    try:
        yield
    finally:
        optimizer.param_groups, optimizer.state = live_groups, live_state


def _cast_state(name: str, v: Any, p: Tensor, index: Any) -> Any:
    """Copy a saved state value for parameter ``p``: dtype and device of ``p`` when floating."""
    if isinstance(v, Tensor):
        arr = v._data
    elif _backend.is_array(v):
        arr = v
    else:
        return v  # scalars such as a step count
    if name == "step" or _dt.kind_of(p._data.dtype) not in "fc":
        out = arr.copy()
    else:
        pa = p._data
        # Adafactor's row and column statistics keep the parameter's axes with one of them 1
        factored = arr.ndim == pa.ndim and all(a in (1, b) for a, b in zip(arr.shape, pa.shape))
        if arr.ndim != 0 and tuple(arr.shape) != tuple(pa.shape) and not factored:
            raise ValueError(
                f"state_dict['state'][{index!r}][{name!r}] has shape {tuple(arr.shape)} but "
                f"the parameter it belongs to has shape {tuple(pa.shape)}; the state dict was "
                f"saved from a different model"
            )
        xp = _backend.array_module(pa)
        if _backend.is_cupy_array(pa):
            with xp.cuda.Device(pa.device.id):
                out = xp.array(arr, dtype=pa.dtype, copy=True)
        else:
            out = xp.array(_backend.to_numpy(arr), dtype=pa.dtype, copy=True)
    return Tensor._wrap(out)
