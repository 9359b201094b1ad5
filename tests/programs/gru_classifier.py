"""A bidirectional GRU that classifies variable-length sequences through packed sequences.

    python tests/programs/gru_classifier.py [--epochs 2] [--dtype float32] [--init-from w.npz]
    USE_MPITENSOR=0 python tests/programs/gru_classifier.py ...   # the same program on torch

Each sample is a sequence of 3 to 12 token ids (made in memory, seeded); its class is whether
token 7 occurs before token 3. Batches are padded with pad_sequence, packed with
pack_padded_sequence (enforce_sorted=False: the batch stays in its order), run through an
embedding and a 2-layer bidirectional GRU, and classified from the final hidden states of both
directions; pad_packed_sequence gives the padded outputs, whose mean over each sequence's own
length is a second feature. Adam, cross-entropy; "step N loss X" per step, accuracy at the end.
"""
import argparse
import os

import numpy as np

if os.environ.get("USE_MPITENSOR", "1") == "1":
    import mpitensor as torch
    import mpitensor.nn.functional as F
    from mpitensor import nn
    from mpitensor.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence, pad_sequence
else:
    import torch
    import torch.nn.functional as F
    from torch import nn
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence, pad_sequence

VOCAB = 12


def make_data(n, seed):
    rng = np.random.default_rng(seed)
    seqs, labels = [], []
    for _ in range(n):
        s = rng.integers(1, VOCAB, rng.integers(3, 13))
        first7 = np.flatnonzero(s == 7)
        first3 = np.flatnonzero(s == 3)
        label = int(first7.size > 0 and (first3.size == 0 or first7[0] < first3[0]))
        seqs.append(torch.tensor(s.tolist(), dtype=torch.long))
        labels.append(label)
    return seqs, torch.tensor(labels, dtype=torch.long)


class Classifier(nn.Module):
    def __init__(self, hidden=16):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 8, padding_idx=0)
        self.gru = nn.GRU(8, hidden, num_layers=2, bidirectional=True, batch_first=True)
        self.head = nn.Linear(4 * hidden, 2)

    def forward(self, padded, lengths):
        packed = pack_padded_sequence(self.embed(padded), lengths, batch_first=True,
                                      enforce_sorted=False)
        out, h = self.gru(packed)
        out, lens = pad_packed_sequence(out, batch_first=True)
        mean = out.sum(dim=1) / lens.to(out.dtype).unsqueeze(1)
        last = torch.cat([h[-2], h[-1]], dim=1)
        return self.head(torch.cat([last, mean], dim=1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--samples", type=int, default=160)
    ap.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    ap.add_argument("--init-from", default=None, help="start from a state dict saved as .npz")
    args = ap.parse_args()
    torch.set_default_dtype(getattr(torch, args.dtype))
    torch.manual_seed(0)
    seqs, labels = make_data(args.samples, 1)
    model = Classifier()
    if args.init_from:
        w = np.load(args.init_from)
        model.load_state_dict({k: torch.from_numpy(w[k]) for k in w.files})
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    step = 0
    for _epoch in range(args.epochs):
        for i in range(0, len(seqs), args.batch_size):
            batch = seqs[i:i + args.batch_size]
            lengths = torch.tensor([len(s) for s in batch])
            padded = pad_sequence(batch, batch_first=True)
            opt.zero_grad()
            loss = F.cross_entropy(model(padded, lengths), labels[i:i + args.batch_size])
            loss.backward()
            opt.step()
            step += 1
            print(f"step {step} loss {loss.item():.12f}")
    with torch.no_grad():
        lengths = torch.tensor([len(s) for s in seqs])
        pred = model(pad_sequence(seqs, batch_first=True), lengths).argmax(dim=1)
        print(f"train accuracy {(pred == labels).float().mean().item():.4f}")


if __name__ == "__main__":
    main()
