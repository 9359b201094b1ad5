"""The tensor-parallel styles: how one module's parameters are sharded and how its inputs
and outputs are laid out, as torch's ``torch.distributed.tensor.parallel`` styles.

* :class:`ColwiseParallel`: ``nn.Linear`` weight and bias ``Shard(0)`` (output features
  split), input replicated, output ``Shard(-1)``; ``nn.Embedding`` table ``Shard(1)``.
* :class:`RowwiseParallel`: ``nn.Linear`` weight ``Shard(1)`` (input features split), bias
  replicated, input ``Shard(-1)``, output ``Partial`` reduced to ``Replicate``;
  ``nn.Embedding`` table ``Shard(0)`` (vocabulary split), input replicated.
* :class:`SequenceParallel`: the parameters replicated (LayerNorm, Dropout, RMSNorm, ...),
  the activations sharded on the sequence dim.
* :class:`PrepareModuleInput` / :class:`PrepareModuleOutput`: only re-lay the inputs or
  outputs of a module; :class:`PrepareModuleInputOutput` both.

Plain tensors entering a module are taken as this rank's piece of a DTensor laid out as
``input_layouts`` (torch's convention), then redistributed to what the module needs.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence, Tuple

from mpitensor import nn
from mpitensor.tensor import Tensor

from .._api import DTensor, distribute_tensor
from ..placement_types import Placement, Replicate, Shard

__all__ = ["ParallelStyle", "ColwiseParallel", "RowwiseParallel", "SequenceParallel",
           "PrepareModuleInput", "PrepareModuleOutput", "PrepareModuleInputOutput"]


def _one(layout: Any, what: str) -> Optional[Placement]:
    if layout is None or isinstance(layout, Placement):
        return layout
    if isinstance(layout, (tuple, list)) and len(layout) == 1 and isinstance(layout[0],
                                                                             Placement):
        return layout[0]
    raise TypeError(f"{what} must be one Placement (the tensor-parallel mesh is 1-D), got "
                    f"{layout!r}")


def _check_mesh(mesh: Any, style: str) -> None:
    if mesh.ndim != 1:
        raise ValueError(f"{style} needs a 1-D device mesh (slice the tensor-parallel dim, "
                         f"e.g. mesh['tp']), got a {mesh.ndim}-D mesh {tuple(mesh.shape)}")


def _placed(p: Optional[Placement], ndim: int) -> Optional[Placement]:
    """``p`` with a negative shard dim counted from the end of an ``ndim``-D tensor."""
    if isinstance(p, Shard) and p.dim < 0:
        return Shard(p.dim + ndim)
    return p


def _layout(x: Any) -> Tuple[Optional[Placement], ...]:
    return tuple(_placed(p, x.ndim) for p in x.placements)


def to_dtensor(x: Any, mesh: Any, given: Optional[Placement],
               desired: Optional[Placement]) -> Any:
    """An input laid out as ``desired``: a plain tensor is this rank's piece of ``given``."""
    if given is None or not isinstance(x, Tensor):
        return x
    if not isinstance(x, DTensor):
        x = DTensor.from_local(x, mesh, (given,), run_check=False)
    elif _layout(x) != (_placed(given, x.ndim),):
        raise ValueError(f"input placements {x.placements} differ from the declared input "
                         f"layout {(given,)}")
    desired = _placed(desired, x.ndim)
    if desired is not None and _layout(x) != (desired,):
        x = x.redistribute(mesh, (desired,))
    return x


def from_dtensor(y: Any, mesh: Any, desired: Optional[Placement], local: bool) -> Any:
    """An output moved to ``desired`` and, with ``local``, unwrapped to its piece."""
    if not isinstance(y, DTensor):
        return y
    desired = _placed(desired, y.ndim)
    if desired is not None and _layout(y) != (desired,):
        y = y.redistribute(mesh, (desired,))
    return y.to_local() if local else y


def shard_parameter(module: Any, name: str, mesh: Any, placement: Placement,
                    src_data_rank: Optional[int]) -> None:
    p = getattr(module, name, None)
    if p is None or isinstance(p, DTensor):
        return
    d = distribute_tensor(p.detach(), mesh, [placement], src_data_rank=src_data_rank)
    module.register_parameter(name, nn.Parameter(d, requires_grad=p.requires_grad))


class ParallelStyle:
    """How :func:`parallelize_module` changes one module (see the subclasses)."""

    src_data_rank: Optional[int] = 0

    def _apply(self, module: Any, mesh: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} does not say how to parallelize "
                                  "a module")

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({fields})"


def _hook_io(module: Any, mesh: Any, given: Optional[Placement],
             desired_in: Optional[Placement], desired_out: Optional[Placement],
             local: bool) -> None:
    def before(_m: Any, args: Tuple[Any, ...]) -> Tuple[Any, ...]:
        if not args:
            raise ValueError(f"{type(module).__name__}: a tensor-parallel module takes its "
                             "input positionally")
        return (to_dtensor(args[0], mesh, given, desired_in),) + tuple(args[1:])

    def after(_m: Any, _args: Any, out: Any) -> Any:
        return from_dtensor(out, mesh, desired_out, local)

    module.register_forward_pre_hook(before)
    module.register_forward_hook(after)


class _LinearLike(ParallelStyle):
    """Colwise and Rowwise: the parameters' placements per module type and the I/O."""

    #: (input needed by Linear, Linear weight, Linear bias, input needed by Embedding,
    #: Embedding table, default input layout, default output layout)
    table: Tuple[Placement, ...] = ()

    def __init__(self, *, input_layouts: Any = None, output_layouts: Any = None,
                 use_local_output: bool = True) -> None:
        self.input_layouts = _one(input_layouts, "input_layouts") or self.table[5]
        self.output_layouts = _one(output_layouts, "output_layouts") or self.table[6]
        self.use_local_output = bool(use_local_output)

    def _apply(self, module: Any, mesh: Any) -> Any:
        _check_mesh(mesh, type(self).__name__)
        lin_in, w, b, emb_in, table = self.table[:5]
        if isinstance(module, nn.Linear):
            shard_parameter(module, "weight", mesh, w, self.src_data_rank)
            shard_parameter(module, "bias", mesh, b, self.src_data_rank)
            need = lin_in
        elif isinstance(module, nn.Embedding):
            shard_parameter(module, "weight", mesh, table, self.src_data_rank)
            need = emb_in
        else:
            raise TypeError(f"{type(self).__name__} applies to nn.Linear and nn.Embedding, "
                            f"not {type(module).__name__}")
        _hook_io(module, mesh, self.input_layouts, need, self.output_layouts,
                 self.use_local_output)
        return module


class ColwiseParallel(_LinearLike):
    """Split a Linear's output features (an Embedding's embedding dim) over the mesh."""

    table = (Replicate(), Shard(0), Shard(0), Replicate(), Shard(1), Replicate(), Shard(-1))


class RowwiseParallel(_LinearLike):
    """Split a Linear's input features (an Embedding's vocabulary) over the mesh; the output
    is summed (Partial) and redistributed to ``output_layouts`` (default Replicate)."""

    table = (Shard(-1), Shard(1), Replicate(), Replicate(), Shard(0), Shard(-1), Replicate())


class SequenceParallel(ParallelStyle):
    """Keep the parameters replicated and the activations sharded on ``sequence_dim``: for
    modules that treat every position on its own (LayerNorm, RMSNorm, Dropout)."""

    def __init__(self, *, sequence_dim: int = 1, use_local_output: bool = False) -> None:
        self.sequence_dim = int(sequence_dim)
        self.use_local_output = bool(use_local_output)

    def _apply(self, module: Any, mesh: Any) -> Any:
        _check_mesh(mesh, "SequenceParallel")
        for name, _p in list(module.named_parameters(recurse=False)):
            shard_parameter(module, name, mesh, Replicate(), self.src_data_rank)
        seq = Shard(self.sequence_dim)
        _hook_io(module, mesh, seq, seq, seq, self.use_local_output)
        return module


class PrepareModuleInput(ParallelStyle):
    """Lay a module's inputs out: each tensor argument (positional, then by keyword) is read
    as ``input_layouts`` and redistributed to ``desired_input_layouts`` (None: leave it)."""

    def __init__(self, *, input_layouts: Any = None, desired_input_layouts: Any = None,
                 input_kwarg_layouts: Optional[Dict[str, Any]] = None,
                 desired_input_kwarg_layouts: Optional[Dict[str, Any]] = None,
                 use_local_output: bool = False) -> None:
        self.input_layouts = _many(input_layouts)
        self.desired_input_layouts = _many(desired_input_layouts)
        if len(self.input_layouts) != len(self.desired_input_layouts):
            raise ValueError(f"input_layouts ({len(self.input_layouts)}) and "
                             f"desired_input_layouts ({len(self.desired_input_layouts)}) must "
                             "name as many inputs")
        self.input_kwarg_layouts = dict(input_kwarg_layouts or {})
        self.desired_input_kwarg_layouts = dict(desired_input_kwarg_layouts or {})
        self.use_local_output = bool(use_local_output)

    def _prepare(self, x: Any, mesh: Any, given: Any, desired: Any) -> Any:
        y = to_dtensor(x, mesh, given, desired)
        return y.to_local() if self.use_local_output and isinstance(y, DTensor) else y

    def _apply(self, module: Any, mesh: Any) -> Any:
        _check_mesh(mesh, "PrepareModuleInput")

        def before(_m: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
            if len(args) < len(self.input_layouts):
                raise ValueError(f"PrepareModuleInput names {len(self.input_layouts)} inputs "
                                 f"but the module got {len(args)} positional arguments")
            new = [self._prepare(a, mesh, g, d) for a, g, d in
                   zip(args, self.input_layouts, self.desired_input_layouts)]
            new += list(args[len(new):])
            kw = {k: self._prepare(v, mesh, self.input_kwarg_layouts.get(k),
                                   self.desired_input_kwarg_layouts.get(k))
                  for k, v in kwargs.items()}
            return tuple(new), kw

        module.register_forward_pre_hook(before, with_kwargs=True)
        return module


class PrepareModuleOutput(ParallelStyle):
    """Lay a module's outputs out: each DTensor output is redistributed from
    ``output_layouts`` to ``desired_output_layouts`` (and unwrapped with
    ``use_local_output``)."""

    def __init__(self, *, output_layouts: Any, desired_output_layouts: Any,
                 use_local_output: bool = True) -> None:
        self.output_layouts = _many(output_layouts)
        self.desired_output_layouts = _many(desired_output_layouts)
        if len(self.output_layouts) != len(self.desired_output_layouts):
            raise ValueError("output_layouts and desired_output_layouts must name as many "
                             "outputs")
        self.use_local_output = bool(use_local_output)

    def _apply(self, module: Any, mesh: Any) -> Any:
        _check_mesh(mesh, "PrepareModuleOutput")

        def after(_m: Any, _args: Any, out: Any) -> Any:
            outs = out if isinstance(out, tuple) else (out,)
            if len(outs) != len(self.output_layouts):
                raise ValueError(f"PrepareModuleOutput names {len(self.output_layouts)} "
                                 f"outputs but the module returned {len(outs)}")
            new = tuple(from_dtensor(to_dtensor(o, mesh, g, None), mesh, d,
                                     self.use_local_output)
                        for o, g, d in zip(outs, self.output_layouts,
                                           self.desired_output_layouts))
            return new if isinstance(out, tuple) else new[0]

        module.register_forward_hook(after)
        return module


class PrepareModuleInputOutput(ParallelStyle):
    """:class:`PrepareModuleInput` and :class:`PrepareModuleOutput` on one module: its inputs
    laid out as ``PrepareModuleInput`` (with ``use_local_input`` as its
    ``use_local_output``) and its outputs as ``PrepareModuleOutput``."""

    def __init__(self, *, input_layouts: Any = None, desired_input_layouts: Any = None,
                 input_kwarg_layouts: Optional[Dict[str, Any]] = None,
                 desired_input_kwarg_layouts: Optional[Dict[str, Any]] = None,
                 use_local_input: bool = False, output_layouts: Any,
                 desired_output_layouts: Any, use_local_output: bool = True) -> None:
        self.prepare_module_input = PrepareModuleInput(
            input_layouts=input_layouts, desired_input_layouts=desired_input_layouts,
            input_kwarg_layouts=input_kwarg_layouts,
            desired_input_kwarg_layouts=desired_input_kwarg_layouts,
            use_local_output=use_local_input)
        self.prepare_module_output = PrepareModuleOutput(
            output_layouts=output_layouts, desired_output_layouts=desired_output_layouts,
            use_local_output=use_local_output)

    def _apply(self, module: Any, mesh: Any) -> Any:
        self.prepare_module_input._apply(module, mesh)
        self.prepare_module_output._apply(module, mesh)
        return module


def _many(layouts: Any) -> Tuple[Optional[Placement], ...]:
    if layouts is None:
        return ()
    if isinstance(layouts, Placement):
        return (layouts,)
    if not isinstance(layouts, Sequence) or not all(
            x is None or isinstance(x, Placement) for x in layouts):
        raise TypeError(f"layouts must be a Placement or a sequence of Placement/None, got "
                        f"{layouts!r}")
    return tuple(layouts)
