"""Every differentiable collective of mpitensor.distributed.nn.functional, forward and
backward, on every rank (run by tests/test_distributed_nn.py under mpiexec). Rank r's input is
x_r = (r + 1) * [1, 2]; the loss weights each output by known numbers, so every gradient has a
closed form, printed as "rank R NAME value grad"."""
import numpy as np

import mpitensor as torch
import mpitensor.distributed as dist
import mpitensor.distributed.nn.functional as dfn

dist.init_process_group("mpi")
r, n = dist.get_rank(), dist.get_world_size()


def x_of(rank):
    return torch.tensor([1.0, 2.0], dtype=torch.float64) * (rank + 1)


def show(name, value, x):
    v = np.round(np.asarray(value.detach().numpy() if hasattr(value, "detach") else value), 9)
    g = np.round(x.grad.numpy(), 9) if x.grad is not None else None
    print(f"rank {r} {name} {v.tolist()} {None if g is None else g.tolist()}", flush=True)


def fresh():
    return x_of(r).requires_grad_(True)


x = fresh()
y = dfn.all_reduce(x)
(y * (r + 1)).sum().backward()
show("all_reduce", y, x)

x = fresh()
pieces = dfn.all_gather(x)
sum((p * (i + 1) * (r + 1)).sum() for i, p in enumerate(pieces)).backward()
show("all_gather", torch.stack(pieces), x)

x = fresh()
y = dfn.broadcast(x, src=1)
(y * (r + 1)).sum().backward()
show("broadcast", y, x)

x = fresh()
y = dfn.reduce(x, dst=0)
(y * (r + 1)).sum().backward()
show("reduce", y, x)

x = fresh()
pieces = dfn.gather(x, dst=n - 1)
sum((p * (i + 1)).sum() for i, p in enumerate(pieces)).backward()
show("gather", torch.stack(pieces), x)

xs = [x_of(r * 10 + j).requires_grad_(True) for j in range(n)]
y = dfn.scatter(xs, src=0)
(y * (r + 1)).sum().backward()
show("scatter", y, xs[1])

xs = [x_of(r * 10 + j).requires_grad_(True) for j in range(n)]
y = dfn.reduce_scatter(torch.zeros(2), xs)
(y * (r + 1)).sum().backward()
show("reduce_scatter", y, xs[0])

xs = [x_of(r * 10 + j).requires_grad_(True) for j in range(n)]
pieces = dfn.all_to_all([torch.zeros(2) for _ in range(n)], xs)
sum((p * (i + 1) * (r + 1)).sum() for i, p in enumerate(pieces)).backward()
show("all_to_all", torch.stack(pieces), xs[n - 1])

x = torch.arange(n * 2, dtype=torch.float64).requires_grad_(True)
y = dfn.all_to_all_single(torch.zeros(n * 2, dtype=torch.float64), x + 100 * r)
(y * torch.arange(n * 2, dtype=torch.float64)).sum().backward()
show("all_to_all_single", y, x)

try:
    dfn.all_reduce(fresh(), op=dist.ReduceOp.MAX)
except RuntimeError as exc:
    print(f"rank {r} MAX RuntimeError: {exc}", flush=True)
with torch.no_grad():
    print(f"rank {r} MAX no_grad {dfn.all_reduce(fresh(), op=dist.ReduceOp.MAX).tolist()}",
          flush=True)
dist.destroy_process_group()
