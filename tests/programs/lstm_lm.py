"""A word-level LSTM language model, trained with truncated backpropagation through time.

    python tests/programs/lstm_lm.py [--steps 20] [--dtype float32] [--init-from w.npz]
    USE_MPITENSOR=0 python tests/programs/lstm_lm.py ...   # the same program on torch

The corpus is made in memory (a seeded Markov chain over a 50-word vocabulary), so the program
needs no download. Embedding -> 2-layer LSTM (dropout between layers) -> tied decoder; the
hidden state is carried across batches and detached (repackaged) each time; gradients are
clipped; plain SGD with a learning rate cut when the validation loss stops falling. It prints
"step N loss X" per step and the validation perplexity per epoch.
"""
import argparse
import math
import os

import numpy as np

if os.environ.get("USE_MPITENSOR", "1") == "1":
    import mpitensor as torch
    import mpitensor.nn.functional as F
    from mpitensor import nn
else:
    import torch
    import torch.nn.functional as F
    from torch import nn

VOCAB = 50


def corpus(n, seed):
    rng = np.random.default_rng(seed)
    table = np.random.default_rng(0).dirichlet(np.full(VOCAB, 0.2), size=VOCAB)
    words = [0]
    for _ in range(n - 1):
        words.append(int(rng.choice(VOCAB, p=table[words[-1]])))
    return torch.tensor(words, dtype=torch.long)


def batchify(data, bsz):
    nbatch = data.size(0) // bsz
    return data[:nbatch * bsz].view(bsz, -1).t().contiguous()


def get_batch(source, i, bptt):
    seq_len = min(bptt, len(source) - 1 - i)
    return source[i:i + seq_len], source[i + 1:i + 1 + seq_len].reshape(-1)


class RNNModel(nn.Module):
    def __init__(self, ntoken, ninp, nhid, nlayers, dropout=0.0):
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, nhid, nlayers, dropout=dropout)
        self.decoder = nn.Linear(nhid, ntoken)
        self.decoder.weight = self.encoder.weight  # tied weights (ninp == nhid)
        self.nlayers, self.nhid = nlayers, nhid

    def forward(self, input, hidden):
        emb = self.drop(self.encoder(input))
        output, hidden = self.rnn(emb, hidden)
        decoded = self.decoder(self.drop(output)).view(-1, self.decoder.out_features)
        return F.log_softmax(decoded, dim=1), hidden

    def init_hidden(self, bsz):
        weight = next(self.parameters())
        return (weight.new_zeros(self.nlayers, bsz, self.nhid),
                weight.new_zeros(self.nlayers, bsz, self.nhid))


def repackage_hidden(h):
    if isinstance(h, torch.Tensor):
        return h.detach()
    return tuple(repackage_hidden(v) for v in h)


def evaluate(model, data, bptt, bsz):
    model.eval()
    total, hidden = 0.0, model.init_hidden(bsz)
    with torch.no_grad():
        for i in range(0, data.size(0) - 1, bptt):
            x, y = get_batch(data, i, bptt)
            out, hidden = model(x, hidden)
            total += len(x) * F.nll_loss(out, y).item()
    return total / (len(data) - 1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20, help="batches per epoch")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--bptt", type=int, default=12)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument("--lr", type=float, default=5.0)
    ap.add_argument("--clip", type=float, default=0.25)
    ap.add_argument("--dropout", type=float, default=0.0)
    ap.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    ap.add_argument("--init-from", default=None, help="start from a state dict saved as .npz")
    args = ap.parse_args()
    torch.set_default_dtype(getattr(torch, args.dtype))
    torch.manual_seed(1)
    train = batchify(corpus(args.steps * args.bptt * args.batch_size + 1, 1), args.batch_size)
    val = batchify(corpus(400, 2), 4)
    model = RNNModel(VOCAB, args.hidden, args.hidden, 2, args.dropout)
    if args.init_from:
        w = np.load(args.init_from)
        model.load_state_dict({k: torch.from_numpy(w[k]) for k in w.files})
    lr, best, step = args.lr, None, 0
    for epoch in range(1, args.epochs + 1):
        model.train()
        hidden = model.init_hidden(args.batch_size)
        for i in range(0, train.size(0) - 1, args.bptt):
            x, y = get_batch(train, i, args.bptt)
            hidden = repackage_hidden(hidden)
            model.zero_grad()
            out, hidden = model(x, hidden)
            loss = F.nll_loss(out, y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
            for p in model.parameters():
                p.data.add_(p.grad, alpha=-lr)
            step += 1
            print(f"step {step} loss {loss.item():.12f}")
        v = evaluate(model, val, args.bptt, 4)
        print(f"epoch {epoch} valid loss {v:.6f} ppl {math.exp(v):.4f}")
        if best is None or v < best:
            best = v
        else:
            lr /= 4.0


if __name__ == "__main__":
    main()
