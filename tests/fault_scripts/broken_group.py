"""A torch-style program in which one rank skips a call and the others catch the timeout.

Usage (``tests/test_group_broken.py`` runs it)::

    mpiexec -n 2 python tests/fault_scripts/broken_group.py SCENARIO --timeout 2 --out DIR

Every rank writes what each of its calls did to ``DIR/result<rank>.json``: ``{"call": name,
"value": [...]}`` for a call that returned (its output), or ``{"call": name, "error": class
name, "msg": ..., "took": seconds}`` for one that raised. Every exception is caught, as a
careless training loop would do, and the program goes on; it ends with exit code 0.

Rank r contributes ``r + 1 + 100 k`` to a call, where k is the call's number in the program
(:data:`CALL_ID`), so a call completed against another call of a peer gives a sum that shows it.

Scenarios:

- ``all_reduce``: rank 1 skips one all_reduce and sleeps past the timeout; the other ranks
  (rank 2 arriving late, at 60 % of the timeout) time out in it and go on. Then every rank
  makes the same later calls: all_reduce, broadcast, async all_reduce + wait(), p2p.
- ``broadcast``: the same with a broadcast from rank 1 as the skipped call.
- ``recv``: rank 0 receives from rank 1, which sends only after the timeout, then sends its
  next message; rank 0 then receives that next one.
- ``work``: rank 0's async all_reduce, waited on with ``wait()``, times out; rank 1 meanwhile
  waits in ``irecv(...).wait(timeout=3600)`` for a message rank 0 sends after the all_reduce:
  it must learn of the break at once, not in an hour.
- ``poll``: rank 0 polls its async all_reduce with ``wait(timeout=...)`` (a bound of its own:
  the work stays pending), which runs out, and drops the work; rank 1 comes back later.
- ``interrupt``: rank 1 skips an all_reduce for a while; rank 0, with a timeout of an hour,
  is interrupted inside it by a signal handler that raises (as Ctrl-C raises
  ``KeyboardInterrupt``), catches that and goes on: its data was posted, so the group breaks.
- ``recover``: the ``all_reduce`` scenario, then ``new_group`` on the broken world, then
  ``destroy_process_group()`` and ``init_process_group()`` again: their calls give the right
  numbers on every rank.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import time
from pathlib import Path
from typing import Any, Callable, List

import numpy as np

import mpitensor as torch
import mpitensor.distributed as dist

log: List[dict] = []
# each call's number k in the program: rank r contributes r + 1 + 100 k to it
CALL_ID = {"first_all_reduce": 1, "skipped_all_reduce": 2, "skipped_broadcast": 2,
           "work_wait": 2, "all_reduce": 3, "refused_all_reduce": 3, "broadcast": 4,
           "async_all_reduce": 5, "ring": 6, "all_reduce_new_group": 7}


def value(rank: int, name: str) -> float:
    return float(rank + 1 + 100 * CALL_ID[name])


def call(name: str, fn: Callable[[], Any]) -> None:
    """Run one call; log its output or its error (caught: the program goes on)."""
    t0 = time.monotonic()
    try:
        out = fn()
    except Exception as exc:  # noqa: BLE001 - the careless user's loop
        log.append({"call": name, "error": type(exc).__name__, "msg": str(exc),
                    "took": time.monotonic() - t0})
        return
    log.append({"call": name, "value": np.asarray(out).ravel().tolist(),
                "took": time.monotonic() - t0})


def all_reduce(rank: int, name: str, group: Any = None) -> Any:
    t = torch.full((2,), value(rank, name))
    dist.all_reduce(t, group=group)
    return t.numpy()


def broadcast(rank: int, name: str, src: int = 0) -> Any:
    t = torch.full((2,), value(rank, name))
    dist.broadcast(t, src=src)
    return t.numpy()


def async_all_reduce(rank: int, name: str) -> Any:
    t = torch.full((2,), value(rank, name))
    work = dist.all_reduce(t, async_op=True)
    work.wait()
    return t.numpy()


def ring(rank: int, n: int) -> Any:
    """Send to the next rank, receive from the previous one (isend, so no deadlock)."""
    out = torch.zeros(2)
    work = dist.isend(torch.full((2,), value(rank, "ring")), (rank + 1) % n)
    dist.recv(out, (rank - 1) % n)
    work.wait()
    return out.numpy()


def later_calls(rank: int, n: int) -> None:
    """The calls every rank makes after the fault, the same on every rank."""
    call("all_reduce", lambda: all_reduce(rank, "all_reduce"))
    call("broadcast", lambda: broadcast(rank, "broadcast"))
    call("async_all_reduce", lambda: async_all_reduce(rank, "async_all_reduce"))
    call("ring", lambda: ring(rank, n))


def skip(mode: str, rank: int, timeout: float) -> None:
    """Rank 1 skips one collective (sleeping past the timeout); the others make it."""
    # the broadcast's root is the rank that skips it: the receivers wait for it
    fn = all_reduce if mode == "all_reduce" else (lambda r, name: broadcast(r, name, src=1))
    if rank == 1:
        time.sleep(timeout * 1.5)
        return
    if rank == 2:
        time.sleep(timeout * 0.6)  # late: it would time out 0.6 timeouts after rank 0
    call(f"skipped_{mode}", lambda: fn(rank, f"skipped_{mode}"))


def p2p_late(rank: int, timeout: float) -> None:
    if rank == 0:
        call("recv_first", lambda: recv_from(1))
        call("recv_second", lambda: recv_from(1))
    elif rank == 1:
        time.sleep(timeout * 1.5)
        call("send_first", lambda: dist.send(torch.full((2,), 10.0), 0))
        call("send_second", lambda: dist.send(torch.full((2,), 20.0), 0))


def recv_from(src: int) -> Any:
    out = torch.zeros(2)
    dist.recv(out, src)
    return out.numpy()


def work_wait(rank: int) -> None:
    if rank == 0:
        call("work_wait", lambda: async_all_reduce(rank, "work_wait"))
        call("send_after", lambda: dist.send(torch.full((2,), 5.0), 1))
    elif rank == 1:
        def long_wait() -> Any:
            out = torch.zeros(2)
            dist.irecv(out, 0).wait(timeout=3600)
            return out.numpy()
        call("irecv_long_wait", long_wait)


def poll_and_drop(rank: int, timeout: float) -> None:
    if rank == 1:
        time.sleep(timeout * 1.5)
        return

    def poll() -> Any:
        t = torch.full((2,), value(rank, "skipped_all_reduce"))
        work = dist.all_reduce(t, async_op=True)
        work.wait(timeout=timeout * 0.25)  # runs out; the work is dropped with this frame
        return t.numpy()
    call("skipped_all_reduce", poll)


class Interrupted(Exception):
    """What the program's SIGALRM handler raises inside the wait."""


def interrupt(rank: int, timeout: float) -> None:
    if rank == 1:
        time.sleep(timeout * 1.5)
        return
    if rank == 0:
        def handler(signum: int, frame: Any) -> None:
            raise Interrupted(f"signal {signum} while waiting")
        signal.signal(signal.SIGALRM, handler)
        signal.setitimer(signal.ITIMER_REAL, timeout * 0.5)
    call("skipped_all_reduce", lambda: all_reduce(rank, "skipped_all_reduce"))


def recover(rank: int, n: int, timeout: float) -> None:
    skip("all_reduce", rank, timeout)
    call("refused_all_reduce", lambda: all_reduce(rank, "refused_all_reduce"))
    sub: Any = None

    def make() -> Any:
        nonlocal sub
        sub = dist.new_group(list(range(n)))
        return [0.0]
    call("new_group", make)
    call("all_reduce_new_group", lambda: all_reduce(rank, "all_reduce_new_group", sub))
    call("destroy", lambda: dist.destroy_process_group() or [0.0])
    call("init", lambda: dist.init_process_group(
        "gloo", timeout=datetime.timedelta(seconds=timeout)) or [0.0])
    later_calls(rank, n)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("scenario", choices=["all_reduce", "broadcast", "recv", "work", "poll",
                                        "interrupt", "recover"])
    p.add_argument("--timeout", type=float, default=2.0)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout))
    rank, n = dist.get_rank(), dist.get_world_size()
    call("first_all_reduce", lambda: all_reduce(rank, "first_all_reduce"))  # all is well
    if args.scenario in ("all_reduce", "broadcast"):
        skip(args.scenario, rank, args.timeout)
        later_calls(rank, n)
    elif args.scenario == "recv":
        p2p_late(rank, args.timeout)
        later_calls(rank, n)
    elif args.scenario == "work":
        work_wait(rank)
        later_calls(rank, n)
    elif args.scenario == "poll":
        poll_and_drop(rank, args.timeout)
        later_calls(rank, n)
    elif args.scenario == "interrupt":
        dist.GroupMember.WORLD.set_timeout(3600)  # nothing times out: the signal ends the wait
        interrupt(rank, args.timeout)
        later_calls(rank, n)
    else:
        recover(rank, n, args.timeout)
    name = args.out / f"result{rank}.json"
    name.with_suffix(".tmp").write_text(json.dumps({"rank": rank, "log": log}))
    os.replace(name.with_suffix(".tmp"), name)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
