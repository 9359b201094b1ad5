"""Train a small transformer on a 2x2 mesh: tensor parallel over "tp", data parallel over "dp".

    mpiexec -n 4 python examples/sharded_training.py            # dp=2 x tp=2
    python examples/sharded_training.py --no-parallel           # the same model on one process
    mpiexec -n 4 python examples/sharded_training.py --fsdp     # fully_shard over dp
    USE_MPITENSOR=0 mpiexec -n 4 python examples/sharded_training.py   # real torch (gloo)

The recipe is torch's 2-D one (tensor parallelism + DDP), and the program is plain torch code:
only the imports below the ``USE_MPITENSOR`` switch differ.

1. ``init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))`` lays the ranks out as a
   grid: rank r sits at (r // tp, r % tp).
2. ``parallelize_module(model, mesh["tp"], plan)`` shards every block over its "tp" line:
   q/k/v and the MLP's first layer ``ColwiseParallel`` (output features, hence heads, split),
   the attention output and the MLP's second layer ``RowwiseParallel`` (input features split,
   the partial sums reduce-scattered along the sequence), the layer norms ``SequenceParallel``
   (their activations split along the sequence), ``PrepareModuleInput`` gathering the sequence
   back before attention and the MLP; the embeddings are split over the vocabulary, the
   output layer over the classes.
3. ``DistributedDataParallel(model, device_mesh=mesh["dp"])`` averages every gradient piece
   over its "dp" line: the two rows of the mesh each train on half of the global batch.
   With ``--fsdp``, torch's FSDP2 + TP recipe instead: ``fully_shard(block, mesh=mesh["dp"])``
   per block, then on the model, shards every tensor-parallel piece once more over "dp"
   (gathered around each block's forward and backward, gradients reduce-scattered).

The data are synthetic, so nothing is read: next-token prediction on a fixed random sequence of
64 tokens, 12 windows of 8 tokens per step. The weights are set from a NumPy seed, so every
library and layout starts from the same model; the losses printed (averaged over "dp") are the
single-process run's to float32 rounding (``tests/test_sharded_example.py`` checks it to 1e-5,
and against torch's run where torch is installed).

``--tp`` sets the tensor-parallel size (1, 2 or 4, dividing the world; default 2 where the
world is even, else 1), so any world size runs: ``python examples/sharded_training.py`` is a
1x1 mesh, ``mpiexec -n 2`` a 1x2 mesh (tensor parallel only), ``mpiexec -n 3`` a 3x1 mesh
(data parallel only). The data-parallel size (world / tp) must divide the global batch of 12.
``--fsdp`` shards over "dp" with ``fully_shard`` instead of DDP (the same losses).
``--loss-parallel`` keeps the logits split over the classes (a DTensor) and computes the
cross-entropy under ``loss_parallel()``, without gathering them. ``--steps`` (default 20) and
``--lr`` (AdamW, default 0.01) size the run. Rank 0 prints
everything; a bad flag prints one line on rank 0's stderr and exits with code 2.
"""
import argparse
import contextlib
import os
import sys

import numpy as np

if os.environ.get("USE_MPITENSOR", "1") == "1":
    import mpitensor as torch
    import mpitensor.distributed as dist
    import mpitensor.nn.functional as F
    from mpitensor import nn
    from mpitensor.distributed.device_mesh import init_device_mesh
    from mpitensor.distributed.fsdp import fully_shard
    from mpitensor.distributed.tensor import DTensor, Replicate, Shard
    from mpitensor.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        loss_parallel,
        parallelize_module,
    )
    from mpitensor.nn.parallel import DistributedDataParallel as DDP
else:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        loss_parallel,
        parallelize_module,
    )
    from torch.nn.parallel import DistributedDataParallel as DDP

VOCAB, DIM, HEADS, HIDDEN, SEQ, LAYERS = 16, 32, 4, 64, 8, 2
TEXT_LEN, BATCH = 64, 12  # the fixed sequence; windows per step (the global batch)


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.head_dim = DIM // HEADS
        self.wq = nn.Linear(DIM, DIM, bias=False)
        self.wk = nn.Linear(DIM, DIM, bias=False)
        self.wv = nn.Linear(DIM, DIM, bias=False)
        self.wo = nn.Linear(DIM, DIM, bias=False)

    def forward(self, x):
        b, t, _ = x.shape
        # -1: the heads this rank holds (all of them without tensor parallelism)
        q = self.wq(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(b, t, -1))


class FeedForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1 = nn.Linear(DIM, HIDDEN)
        self.w2 = nn.Linear(HIDDEN, DIM)

    def forward(self, x):
        return self.w2(F.gelu(self.w1(x)))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention_norm = nn.LayerNorm(DIM)
        self.attention = Attention()
        self.ffn_norm = nn.LayerNorm(DIM)
        self.feed_forward = FeedForward()

    def forward(self, x):
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, DIM)
        self.pos_embeddings = nn.Embedding(SEQ, DIM)
        self.layers = nn.ModuleList([Block() for _ in range(LAYERS)])
        self.norm = nn.LayerNorm(DIM)
        self.output = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens):
        pos = torch.arange(tokens.shape[1]).unsqueeze(0)
        h = self.tok_embeddings(tokens) + self.pos_embeddings(pos)
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h))


def init_weights(model, seed):
    """Every weight from one NumPy generator (the same in every library); biases zero, layer
    norms as built (ones and zeros)."""
    rng = np.random.default_rng(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                continue
            a = rng.standard_normal(tuple(p.shape)).astype(np.float32) * 0.1
            p.copy_(torch.from_numpy(a * 0 if name.endswith("bias") else a))


def tp_plan(split_loss=False):
    """How each module is split over "tp" (torch's sequence-parallel transformer plan); with
    ``split_loss`` the logits stay split over the classes (a DTensor, for loss_parallel)."""
    block = {
        "attention_norm": SequenceParallel(),
        "attention": PrepareModuleInput(input_layouts=(Shard(1),),
                                        desired_input_layouts=(Replicate(),)),
        "attention.wq": ColwiseParallel(),
        "attention.wk": ColwiseParallel(),
        "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
        "ffn_norm": SequenceParallel(),
        "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),),
                                           desired_input_layouts=(Replicate(),)),
        "feed_forward.w1": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
    }
    plan = {f"layers.*.{name}": style for name, style in block.items()}
    plan.update({
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "pos_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1),
                                  use_local_output=False) if split_loss else
        ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
    })
    return plan


def batch(step):
    """The global batch of a step: BATCH windows of the fixed sequence and their next tokens."""
    text = np.random.default_rng(0).integers(0, VOCAB, TEXT_LEN)
    starts = np.random.default_rng(1000 + step).integers(0, TEXT_LEN - SEQ, BATCH)
    x = np.stack([text[s:s + SEQ] for s in starts])
    y = np.stack([text[s + 1:s + SEQ + 1] for s in starts])
    return torch.from_numpy(x), torch.from_numpy(y)


def setup():
    """Join the job (env:// rendezvous, the rank from torchrun or from mpiexec's PMI)."""
    if "RANK" not in os.environ:
        os.environ["RANK"] = os.environ.get("PMI_RANK", "0")
        os.environ["WORLD_SIZE"] = os.environ.get("PMI_SIZE", "1")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    dist.init_process_group("gloo", init_method="env://")
    return dist.get_rank(), dist.get_world_size()


def mesh_shape(args, world):
    """(dp, tp), or the reason the flags do not fit this world."""
    if args.no_parallel:
        if args.fsdp:
            return "--fsdp shards over a mesh: leave out --no-parallel"
        return (1, 1) if world == 1 else "--no-parallel trains on one process: run it " \
            "without mpiexec (python examples/sharded_training.py --no-parallel)"
    tp = args.tp if args.tp is not None else (2 if world % 2 == 0 else 1)
    if tp not in (1, 2, 4) or world % tp:
        return f"--tp {tp} must be 1, 2 or 4 and divide the world size {world}"
    if BATCH % (world // tp):
        return f"the data-parallel size {world // tp} (world {world} / tp {tp}) must divide " \
            f"the global batch of {BATCH}"
    return world // tp, tp


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--tp", type=int, default=None, help="tensor-parallel size")
    parser.add_argument("--loss-parallel", action="store_true",
                        help="keep the logits split over the classes; loss_parallel() loss")
    parser.add_argument("--fsdp", action="store_true",
                        help="fully_shard over dp (torch's FSDP2 + TP recipe) instead of DDP")
    parser.add_argument("--no-parallel", action="store_true",
                        help="train the same model on one process, without a mesh")
    args = parser.parse_args()
    sys.stdout.reconfigure(line_buffering=True, write_through=False)
    rank, world = setup()
    shape = mesh_shape(args, world)
    if isinstance(shape, str):
        if rank == 0:
            print(f"sharded_training.py: {shape}", file=sys.stderr)
        dist.destroy_process_group()
        sys.exit(2)
    dp, tp = shape
    model = Transformer()
    init_weights(model, seed=0)
    n_params = sum(p.numel() for p in model.parameters())
    if args.no_parallel:
        where = "one process, no parallelism"
    else:
        mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
        parallelize_module(model, mesh["tp"], tp_plan(args.loss_parallel))
        wq = model.layers[0].attention.wq.weight
        where = (f"{world} rank(s) as a {dp}x{tp} mesh (dp={dp}, tp={tp}); "
                 f"layers.0.attention.wq.weight {tuple(wq.placements)} over tp, "
                 f"local {tuple(wq.to_local().shape)} of {tuple(wq.shape)}")
        if args.fsdp:
            for layer in model.layers:
                fully_shard(layer, mesh=mesh["dp"])
            fully_shard(model, mesh=mesh["dp"])
            where += "; fully_shard over dp"
        else:
            model = DDP(model, device_mesh=mesh["dp"])
    if rank == 0:
        print(f"sharded_training: {LAYERS}-layer transformer, {n_params:,} parameters; {where}")
    train(model, args, rank, dp, None if args.no_parallel else mesh)
    dist.destroy_process_group()


def train(model, args, rank, dp, mesh):
    """AdamW on next-token cross-entropy; rank 0 prints the loss averaged over "dp"."""
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    share = BATCH // dp
    r = 0 if mesh is None else mesh.get_local_rank("dp")
    losses = []
    for step in range(args.steps):
        x, y = batch(step)
        x, y = x[r * share:(r + 1) * share], y[r * share:(r + 1) * share]
        split = args.loss_parallel and mesh is not None
        opt.zero_grad()
        with loss_parallel() if split else contextlib.nullcontext():
            logits = model(x)
            loss = F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))
            loss.backward()
        opt.step()
        mean = loss.detach()
        mean = mean.full_tensor() if isinstance(mean, DTensor) else mean.clone()
        if mesh is not None:
            dist.all_reduce(mean, group=mesh.get_group("dp"))  # SUM (gloo has no AVG)
        losses.append(mean.item() / dp)
        if rank == 0:
            print(f"step {step + 1}/{args.steps}: loss {losses[-1]:.8f}")
    if rank == 0:
        print(f"final loss {losses[-1]:.8f} after {args.steps} steps (step 1: {losses[0]:.8f})")


if __name__ == "__main__":
    main()
