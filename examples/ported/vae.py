"""A fully connected variational autoencoder on MNIST, trained with Adam.

    python examples/ported/vae.py --data-dir /path/to/mnist --epochs 2
    USE_MPITENSOR=0 python examples/ported/vae.py --data-dir /path/to/mnist   # real torch

The loss is the summed binary cross-entropy of the reconstruction plus the KL divergence of
q(z|x) = N(mu, sigma^2) from N(0, 1). With --fixed-noise the reparameterisation draws its
epsilon from numpy (seeded by --seed) instead of torch.randn_like, so two runs of the same
program under different libraries see the same noise.
"""
import argparse
import gzip
import os

import numpy as np

if os.environ.get("USE_MPITENSOR", "1") == "1":
    import mpitensor as torch
    import mpitensor.nn.functional as F
    from mpitensor import nn, optim
    from mpitensor.utils.data import DataLoader, TensorDataset
else:
    import torch
    import torch.nn.functional as F
    from torch import nn, optim
    from torch.utils.data import DataLoader, TensorDataset


def read_idx(path):
    """An IDX file (optionally gzipped) as a numpy array."""
    if not os.path.exists(path) and os.path.exists(path + ".gz"):
        path += ".gz"
    with (gzip.open if path.endswith(".gz") else open)(path, "rb") as f:
        raw = f.read()
    dims = np.frombuffer(raw, dtype=">u4", count=raw[3], offset=4)
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * raw[3]).reshape(dims)


def mnist_pixels(data_dir, limit):
    """Train and test images as (N, 784) float32 in [0, 1]; labels are not needed."""
    def images(prefix):
        return read_idx(os.path.join(data_dir, f"{prefix}-images-idx3-ubyte"))

    try:
        train, test = images("train"), images("t10k")
    except FileNotFoundError:
        print("no MNIST training files: training on test images 0-7999, testing on 8000-9999")
        everything = images("t10k")
        train, test = everything[:8000], everything[8000:]
    if limit:
        train, test = train[:limit], test[:max(limit // 4, 1)]
    to_unit = lambda a: (a.reshape(len(a), -1).astype(np.float32) / 255.0)  # noqa: E731
    return to_unit(train), to_unit(test)


class VAE(nn.Module):
    def __init__(self, hidden=256, latent=16, noise=None):
        super().__init__()
        self.enc = nn.Linear(784, hidden)
        self.enc_mu = nn.Linear(hidden, latent)
        self.enc_logvar = nn.Linear(hidden, latent)
        self.dec = nn.Linear(latent, hidden)
        self.dec_out = nn.Linear(hidden, 784)
        self.noise = noise or torch.randn_like

    def encode(self, x):
        h = F.relu(self.enc(x))
        return self.enc_mu(h), self.enc_logvar(h)

    def reparameterize(self, mu, logvar):
        std = torch.exp(0.5 * logvar)
        eps = self.noise(std)
        return mu + eps * std

    def decode(self, z):
        return torch.sigmoid(self.dec_out(F.relu(self.dec(z))))

    def forward(self, x):
        mu, logvar = self.encode(x.view(-1, 784))
        z = self.reparameterize(mu, logvar)
        return self.decode(z), mu, logvar


def loss_function(recon_x, x, mu, logvar):
    bce = F.binary_cross_entropy(recon_x, x.view(-1, 784), reduction="sum")
    kld = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
    return bce + kld


def numpy_noise(seed):
    """A drop-in for torch.randn_like whose numbers come from a numpy generator."""
    rng = np.random.default_rng(seed)

    def like(t):
        return torch.from_numpy(rng.standard_normal(tuple(t.shape)).astype(np.float32)).to(
            device=t.device, dtype=t.dtype)
    return like


def train(args, model, loader, optimizer, epoch, step):
    model.train()
    total = 0.0
    for batch_idx, (data,) in enumerate(loader):
        optimizer.zero_grad()
        recon, mu, logvar = model(data)
        loss = loss_function(recon, data, mu, logvar)
        loss.backward()
        total += loss.item()
        optimizer.step()
        step += 1
        if batch_idx % args.log_interval == 0:
            print(f"epoch {epoch} step {step} [{batch_idx * len(data)}/{len(loader.dataset)}] "
                  f"loss {loss.item() / len(data):.12f}")
        if args.dry_run:
            break
    print(f"====> Epoch: {epoch} Average loss: {total / len(loader.dataset):.4f}")
    return step


def test(model, loader):
    model.eval()
    total = 0.0
    with torch.no_grad():
        for (data,) in loader:
            recon, mu, logvar = model(data)
            total += loss_function(recon, data, mu, logvar).item()
    print(f"====> Test set loss: {total / len(loader.dataset):.4f}")


def main():
    parser = argparse.ArgumentParser(description="MNIST VAE")
    parser.add_argument("--batch-size", type=int, default=128, metavar="N")
    parser.add_argument("--epochs", type=int, default=5, metavar="N")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=1, metavar="S")
    parser.add_argument("--log-interval", type=int, default=10, metavar="N")
    parser.add_argument("--dry-run", action="store_true", help="one batch per epoch")
    parser.add_argument("--data-dir", default=os.environ.get("MNIST_DIR", "data/mnist"))
    parser.add_argument("--limit", type=int, default=0,
                        help="train on the first N images (and test on N/4)")
    parser.add_argument("--fixed-noise", action="store_true",
                        help="draw the reparameterisation noise from numpy, seeded by --seed")
    parser.add_argument("--init-from", default=None,
                        help="start from a state dict saved as .npz (name -> array)")
    parser.add_argument("--samples", default=None,
                        help="after training, decode 64 latent draws and save them (.npy)")
    parser.add_argument("--dtype", choices=["float32", "float64"], default="float32",
                        help="the dtype of weights and images (torch.set_default_dtype)")
    args = parser.parse_args()
    torch.set_default_dtype(getattr(torch, args.dtype))

    torch.manual_seed(args.seed)
    train_x, test_x = mnist_pixels(args.data_dir, args.limit)
    real = torch.get_default_dtype()
    train_loader = DataLoader(TensorDataset(torch.from_numpy(train_x).to(real)),
                              batch_size=args.batch_size, shuffle=False)
    test_loader = DataLoader(TensorDataset(torch.from_numpy(test_x).to(real)),
                             batch_size=args.batch_size)

    model = VAE(noise=numpy_noise(args.seed) if args.fixed_noise else None)
    if args.init_from:
        weights = np.load(args.init_from)
        model.load_state_dict({k: torch.from_numpy(weights[k]) for k in weights.files})
    optimizer = optim.Adam(model.parameters(), lr=args.lr)

    step = 0
    for epoch in range(1, args.epochs + 1):
        step = train(args, model, train_loader, optimizer, epoch, step)
        test(model, test_loader)

    if args.samples:
        with torch.no_grad():
            sample = model.decode(torch.randn(64, 16))
        np.save(args.samples, sample.view(64, 28, 28).cpu().numpy())
        print(f"saved {tuple(sample.shape)} samples to {args.samples}")


if __name__ == "__main__":
    main()
