"""2-D parallel training of a small decoder: tensor and sequence parallel over "tp", fully
sharded data parallel over "dp" (a 2x2 mesh on four processes).

    mpiexec -n 4 python fsdp_tp_transformer.py [--steps 8] [--dtype float64] [--loss-parallel]
    USE_MPITENSOR=0 torchrun --nproc-per-node 4 fsdp_tp_transformer.py ...   # the same on torch

The decoder: a token embedding, two blocks (RMS norm, causal self-attention, RMS norm, a
SwiGLU MLP, each with a residual), a final norm and a vocabulary projection. The
tensor-parallel plan splits the embedding by rows and hands its output on sharded over the
sequence; the norms run sequence parallel; the attention and MLP projections are column then
row parallel, their outputs sharded over the sequence again (the attention's query, key and
value stay DTensors split over the heads, its causal mask comes in replicated); the
vocabulary projection is column parallel (with ``--loss-parallel`` its logits stay sharded
over the vocabulary and the loss is taken under ``loss_parallel``). Then ``fully_shard`` over
"dp" per block and at the root, AdamW, ``clip_grad_norm_`` over the 2-D parameters. Weights
come from a formula and the batches from NumPy, so both libraries start alike; every rank
prints its loss and the gradient norm at every step, and the sum of the final weights.
"""
import argparse
import importlib
import math
import os
import sys

import numpy as np

# one switch picks the library; the rest of the program names torch's modules
LIB = "mpitensor" if os.environ.get("USE_MPITENSOR", "1") == "1" else "torch"
torch = importlib.import_module(LIB)
dist = importlib.import_module(f"{LIB}.distributed")
nn = importlib.import_module(f"{LIB}.nn")
F = importlib.import_module(f"{LIB}.nn.functional")
fsdp = importlib.import_module(f"{LIB}.distributed.fsdp")
dtensor = importlib.import_module(f"{LIB}.distributed.tensor")
tp = importlib.import_module(f"{LIB}.distributed.tensor.parallel")
Shard, Replicate = dtensor.Shard, dtensor.Replicate
ColwiseParallel, RowwiseParallel = tp.ColwiseParallel, tp.RowwiseParallel
SequenceParallel, PrepareModuleInput = tp.SequenceParallel, tp.PrepareModuleInput

VOCAB, DIM, HEADS, HIDDEN, SEQ, BATCH, EPS = 48, 24, 12, 36, 12, 3, 1e-6


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        for name in ("wq", "wk", "wv", "wo"):
            setattr(self, name, nn.Linear(DIM, DIM, bias=False))

    def forward(self, x, future):
        b, s, _ = x.shape
        head = DIM // HEADS
        # the global head count: under tensor parallelism these are DTensors split over heads
        q, k, v = (w(x).view(b, s, HEADS, head).transpose(1, 2)
                   for w in (self.wq, self.wk, self.wv))
        scores = (q @ k.transpose(-2, -1) / math.sqrt(head)).masked_fill(future, float("-inf"))
        out = F.softmax(scores, dim=-1) @ v
        return self.wo(out.transpose(1, 2).reshape(b, s, DIM))


class FeedForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1 = nn.Linear(DIM, HIDDEN, bias=False)
        self.w2 = nn.Linear(HIDDEN, DIM, bias=False)
        self.w3 = nn.Linear(DIM, HIDDEN, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention, self.feed_forward = Attention(), FeedForward()
        self.attention_norm, self.ffn_norm = nn.RMSNorm(DIM, eps=EPS), nn.RMSNorm(DIM, eps=EPS)

    def forward(self, x, future):
        h = x + self.attention(self.attention_norm(x), future)
        return h + self.feed_forward(self.ffn_norm(h))


class Decoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList([Block(), Block()])
        self.norm = nn.RMSNorm(DIM, eps=EPS)
        self.output = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens):
        future = torch.ones(tokens.shape[1], tokens.shape[1], dtype=torch.bool).triu(1)
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h, future)
        return self.output(self.norm(h))



def say(line: str) -> None:
    """One line in one write: the ranks share the launcher's pipe, and print's separate
    writes of the text and its newline interleave between ranks when output is unbuffered."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()

def fill(model, dtype):
    model.to(dtype)
    with torch.no_grad():
        for i, (name, p) in enumerate(model.named_parameters()):
            values = np.cos(np.arange(p.numel()) * 0.61 + i) * (0.3 if p.dim() > 1 else 0.1)
            if name.endswith("norm.weight"):
                values = values + 1.0
            p.copy_(torch.from_numpy(values.reshape(tuple(p.shape))).to(dtype))
    return model


def parallelize(model, tp_mesh, sharded_logits):
    output_style = (ColwiseParallel(input_layouts=Shard(1), use_local_output=False)
                    if sharded_logits else
                    ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()))
    tp.parallelize_module(model, tp_mesh, {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        "output": output_style,
    })
    for block in model.layers:
        # the attention's projections hand on DTensors (split over heads), its mask is
        # replicated: the attention computes on DTensors, the MLP on local pieces
        tp.parallelize_module(block, tp_mesh, {
            "attention_norm": SequenceParallel(),
            "attention": PrepareModuleInput(input_layouts=(Shard(1), Replicate()),
                                            desired_input_layouts=(Replicate(), Replicate())),
            "attention.wq": ColwiseParallel(use_local_output=False),
            "attention.wk": ColwiseParallel(use_local_output=False),
            "attention.wv": ColwiseParallel(use_local_output=False),
            "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
            "ffn_norm": SequenceParallel(),
            "feed_forward": PrepareModuleInput(input_layouts=Shard(1),
                                               desired_input_layouts=Replicate()),
            "feed_forward.w1": ColwiseParallel(),
            "feed_forward.w3": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
        })


def batch(step, dp_rank):
    rng = np.random.default_rng(1000 * step + dp_rank)
    tokens = rng.integers(0, VOCAB, size=(BATCH, SEQ + 1))
    return torch.from_numpy(tokens[:, :-1]), torch.from_numpy(tokens[:, 1:])


def main(args):
    dtype = getattr(torch, args.dtype)
    world = int(os.environ.get("WORLD_SIZE", "0")) or None
    if world is None:  # mpiexec without a launcher's variables: the process group says
        dist.init_process_group("gloo")
        world = dist.get_world_size()
    mesh = dtensor.init_device_mesh("cpu", (world // args.tp, args.tp), mesh_dim_names=("dp", "tp"))
    dp_mesh, tp_mesh = mesh["dp"], mesh["tp"]
    rank, dp_rank = dist.get_rank(), dp_mesh.get_local_rank()

    model = fill(Decoder(), dtype)
    parallelize(model, tp_mesh, args.loss_parallel)
    for block in model.layers:
        fsdp.fully_shard(block, mesh=dp_mesh)
    fsdp.fully_shard(model, mesh=dp_mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)

    for step in range(1, args.steps + 1):
        tokens, targets = batch(step, dp_rank)
        logits = model(tokens)
        if args.loss_parallel:
            with tp.loss_parallel():
                loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
                loss.backward()
        else:
            loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
            loss.backward()
        norm = nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.5)
        optimizer.step()
        optimizer.zero_grad()
        loss = loss.full_tensor() if hasattr(loss, "full_tensor") else loss
        norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
        say(f"rank {rank} step {step} loss {loss.item():.12f} norm {norm.item():.12f}")
    total = sum(float(p.detach().full_tensor().sum()) for p in model.parameters())
    say(f"rank {rank} weight sum {total:.12f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="FSDP + tensor parallel decoder")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--dtype", default="float64", choices=["float32", "float64"])
    parser.add_argument("--loss-parallel", action="store_true")
    main(parser.parse_args())
