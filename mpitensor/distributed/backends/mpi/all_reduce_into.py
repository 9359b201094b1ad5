"""The MPI group's all_reduce out of place: ``input`` read where it lies, ``output`` written.

torch's ``all_reduce`` works in place only, so a caller that must keep its input (a Partial
DTensor keeps its terms when it is redistributed) copied it first and reduced the copy. This
call does without that copy, on every path the in-place one takes:

* the node-local engine (``shm_coll.all_reduce_into``): each member reads its peers' input
  and writes the reduction into its own output (the direct path), or streams its input
  through the segment's slots and drains the result into its output;
* MPI: ``Iallreduce(sendbuf, recvbuf)`` (a staged buffer, a plan's widening or view, AVG's
  division as the in-place path does them), or at small sizes the in-place call's own
  persistent request (``persistent.py``: the peers' all_reduce may take it);
* across nodes (``hierarchical``): the input copied into the output, reduced there in place
  (that path has no out-of-place form).

It is the same collective as ``all_reduce`` to its peers and to the group's health: one call
counted under that name, the same fingerprint (shape, dtype, op) in the agreement check,
the same debug signature, timeouts and fault notices. ``output`` may be ``input`` itself (then
it is ``all_reduce`` in place); any other overlap is refused (``ValueError``, before any
traffic). Internal (a group method): torch has no out-of-place ``all_reduce``.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import numpy as np

from ....backend import array_module
from ....tensor import Tensor
from ...health import fingerprint as _fp
from ...process_group import Work
from . import buffers as B
from . import hierarchical as _hier
from . import shm_coll as _shmc

SAME, APART, PARTIAL = "same", "apart", "partial"


def _address(a: Any) -> int:
    return a.__array_interface__["data"][0] if isinstance(a, np.ndarray) else a.data.ptr


def relation(out: Any, inp: Any) -> Optional[str]:
    """How ``out``'s memory meets ``inp``'s: SAME (the same elements, laid out alike), APART
    (no element in common), PARTIAL (anything else); None where either is not an array (the
    checks say what is wrong)."""
    if type(out) is np.ndarray and type(inp) is np.ndarray and out is not inp and (
            not np.may_share_memory(out, inp)):
        return APART  # (the usual case, in 0.3 µs: the general test below takes 3)
    if not (hasattr(out, "__array_interface__") or hasattr(out, "__cuda_array_interface__")):
        return None
    if not (hasattr(inp, "__array_interface__") or hasattr(inp, "__cuda_array_interface__")):
        return None
    if out is inp:
        return SAME
    xp = array_module(out)
    if xp is not array_module(inp) or not xp.may_share_memory(out, inp):
        return APART  # (the bounds alone: cheap)
    if (_address(out) == _address(inp) and out.shape == inp.shape
            and out.strides == inp.strides and out.dtype == inp.dtype):
        return SAME
    return PARTIAL if xp.shares_memory(out, inp) else APART


def all_reduce_into(g: Any, output: Any, input: Any, op: Any, async_op: bool,
                    fast_op: Callable[[Any, Any], Any]) -> Optional[Work]:
    """``g``'s all_reduce of ``input`` into ``output`` (see the module docstring);
    ``fast_op(op, dtype)``: the MPI datatype and op where the reduction needs no plan."""
    out = output._data if type(output) is Tensor else output
    inp = input._data if type(input) is Tensor else input
    rel = relation(out, inp)
    if rel == SAME:
        return g.all_reduce(output, op, async_op)
    if rel == APART and type(out) is np.ndarray and type(inp) is np.ndarray:
        if inp.nbytes >= g.shm_ar_min:
            done = _shmc.all_reduce_into(g, output, out, inp, op, async_op)
            if done is not _shmc.PASS:
                return done
        if not g.slow and g.rank_ >= 0 and out.shape == inp.shape and out.dtype == inp.dtype:
            fast = fast_op(op, inp.dtype)
            fo = out.flags
            if fast is not None and fo.c_contiguous and fo.writeable and inp.flags.c_contiguous:
                return _fast(g, output, out, inp, op, async_op, fast)
    return g.call_guarded("all_reduce", _general, g, output, input, op, async_op, rel)


def _fast(g: Any, output: Any, out: np.ndarray, inp: np.ndarray, op: Any, async_op: bool,
          fast: Any) -> Optional[Work]:
    """Contiguous NumPy arrays apart, a dtype and op MPI reduces as they are, debug off."""
    if g.hier is not None and _hier.takes(g, inp):
        g._fast_count("all_reduce", inp)
        np.copyto(out, inp)
        return _hier.all_reduce(g, output, out, None, op, async_op)
    s = g._fast_count("all_reduce", inp)
    chk = g._fp_first(s, "all_reduce", inp, op, -1, (out, inp))
    req = g._iallreduce([inp, fast[0]], fast[1], [out, fast[0]])
    if chk is not None:
        req = _fp.Checked(g.health, req, *chk)
    return g._fast_finish(req, "all_reduce", s, [output], (out, inp), async_op)


def _general(g: Any, output: Any, input: Any, op: Any, async_op: bool,
             rel: Optional[str]) -> Optional[Work]:
    """Checks before any traffic, staging, plans (the in-place path's ``_all_reduce``)."""
    where = g.begin("all_reduce")

    def prepare() -> Any:
        out, inp, _ = g._out_in(output, input, "output", "input", where)
        if out.shape != inp.shape:
            raise ValueError(f"{where}: output is {B.describe(out)} but input is "
                             f"{B.describe(inp)}; an all_reduce into another buffer needs "
                             "the input's shape")
        if rel == PARTIAL:
            raise ValueError(f"{where}: output and input overlap without being the same "
                             "buffer; pass the same array (in place) or two apart")
        return out, inp, B.reduce_plan(inp.dtype, B.coerce_op(op, where), where)

    out, inp, plan = g._maybe_debug(
        where, lambda: g._shaped_sig("all_reduce", input, "input", where, reduce=str(op)),
        prepare)
    if (g.hier is not None and (hop := _hier.reduction(plan, op, where)) is not None
            and _hier.takes(g, inp)):
        buf, finish = _hier.staged(out)
        buf[...] = inp if isinstance(inp, np.ndarray) else inp.get()
        return _hier.all_reduce(g, output, buf, finish, hop, async_op, plan.average)
    sspec = [B.apply_plan_in(B.stage_in(inp), plan), plan.mpi_type]
    rspec, finish = g._reduced_into(out, plan)
    mop = plan.mpi_op
    return g._run(where, lambda: g._iallreduce(sspec, mop, rspec), finish, async_op,
                  [output], keep=(sspec, rspec), check=(inp, B.coerce_op(op, where), -1))
