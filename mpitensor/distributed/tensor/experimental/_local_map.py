"""``local_map``: run a function written for plain tensors on DTensors' local pieces, and
wrap what it returns as DTensors with the placements given."""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional, Sequence

from .._api import DTensor
from ..placement_types import Placement

__all__ = ["local_map"]


def _is_placements(spec: Any) -> bool:
    return isinstance(spec, (list, tuple)) and all(isinstance(p, Placement) for p in spec)


def _to_local(i: int, arg: Any, spec: Any, mesh: Any, redistribute: bool) -> Any:
    if not isinstance(arg, DTensor):
        if spec is not None and not isinstance(arg, (int, float, bool, str)) and \
                hasattr(arg, "shape"):
            raise ValueError(f"local_map: argument {i} is a plain tensor but in_placements "
                             f"gives it {spec}; pass a DTensor, or None for it")
        return arg
    if arg.device_mesh != mesh:
        raise ValueError(f"local_map: argument {i} is on mesh {arg.device_mesh!r}, not "
                         f"{mesh!r}")
    if spec is not None:
        spec = tuple(spec)
        if spec != arg.placements:
            if not redistribute:
                raise ValueError(f"local_map: argument {i} has placements {arg.placements} "
                                 f"but in_placements wants {spec}; redistribute it first or "
                                 "pass redistribute_inputs=True")
            arg = arg.redistribute(mesh, spec)
    return arg.to_local()


def _wrap_out(out: Any, spec: Any, mesh: Any, where: str) -> Any:
    if spec is None:
        if isinstance(out, DTensor):
            raise ValueError(f"local_map: {where} is a DTensor; the function must return "
                             "plain tensors")
        return out
    if not hasattr(out, "shape"):
        raise ValueError(f"local_map: {where} is {type(out).__name__}, not a tensor, but "
                         f"out_placements gives it {spec}; give None for it")
    return DTensor.from_local(out, mesh, tuple(spec), run_check=False)


def _outputs(out: Any, out_placements: Any, mesh: Any) -> Any:
    if isinstance(out, (tuple, list)):
        specs = [out_placements] if _is_placements(out_placements) else list(out_placements)
        if len(specs) != len(out):
            raise ValueError(f"local_map: the function returned {len(out)} outputs but "
                             f"out_placements gives {len(specs)}")
        return type(out)(_wrap_out(o, s, mesh, f"output {i}")
                         for i, (o, s) in enumerate(zip(out, specs)))
    if out_placements is not None and not _is_placements(out_placements):
        if len(out_placements) != 1:
            raise ValueError(f"local_map: the function returned one output but "
                             f"out_placements gives {len(out_placements)}")
        out_placements = out_placements[0]
    return _wrap_out(out, out_placements, mesh, "the output")


def local_map(func: Optional[Callable[..., Any]] = None, out_placements: Any = None,
              in_placements: Optional[Sequence[Any]] = None,
              in_grad_placements: Optional[Sequence[Any]] = None,
              device_mesh: Any = None, *, redistribute_inputs: bool = False) -> Any:
    """``func`` made to take DTensors: each DTensor argument is checked against (or, with
    ``redistribute_inputs``, moved to) its ``in_placements`` entry, ``func`` runs on the local
    pieces, and each tensor it returns becomes a DTensor with its ``out_placements`` entry
    (None: returned as it is). Without any DTensor argument ``func`` runs as it is. Without
    ``func``, a decorator. The mesh: ``device_mesh``, else the first DTensor argument's.
    A Shard output's global size is its local size times the shards (as ``from_local``).

    Example (``mpiexec -n 2``)::

        mm = local_map(torch.mm, out_placements=[Shard(0)],
                       in_placements=([Shard(0)], [Replicate()]))
        z = mm(x, w)           # x Shard(0), w Replicate: each rank multiplies its rows
    """
    if func is None:
        return functools.partial(local_map, out_placements=out_placements,
                                 in_placements=in_placements,
                                 in_grad_placements=in_grad_placements,
                                 device_mesh=device_mesh,
                                 redistribute_inputs=redistribute_inputs)
    if in_grad_placements is not None:
        raise NotImplementedError("local_map: in_grad_placements is not supported here (the "
                                  "inputs' gradients keep the inputs' placements)")

    @functools.wraps(func)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        dts = [a for a in args if isinstance(a, DTensor)]
        if not dts:
            return func(*args, **kwargs)
        mesh = device_mesh if device_mesh is not None else dts[0].device_mesh
        if in_placements is not None and len(in_placements) != len(args):
            raise ValueError(f"local_map: in_placements has {len(in_placements)} entries for "
                             f"{len(args)} arguments")
        specs = in_placements if in_placements is not None else [None] * len(args)
        local = [_to_local(i, a, s, mesh, redistribute_inputs)
                 for i, (a, s) in enumerate(zip(args, specs))]
        return _outputs(func(*local, **kwargs), out_placements, mesh)

    return wrapped
