"""A small DCGAN: a ConvTranspose2d generator against a Conv2d discriminator, trained with
Adam and binary cross-entropy in torch's usual alternating loop.

    python tests/programs/dcgan.py [--steps 6] [--dtype float32] [--init-from w.npz]
    USE_MPITENSOR=0 python tests/programs/dcgan.py ...   # the same program on torch

The "real" images are 16x16 blobs made in memory (seeded) and the latent noise comes from
numpy, so both libraries see the same numbers. Prints "step N loss_D X loss_G Y" ("step N loss
Y" too, for the comparison) per step.
"""
import argparse
import os

import numpy as np

if os.environ.get("USE_MPITENSOR", "1") == "1":
    import mpitensor as torch
    from mpitensor import nn
else:
    import torch
    from torch import nn

NZ, NGF, NDF = 8, 8, 8


class Generator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(
            nn.ConvTranspose2d(NZ, NGF * 2, 4, 1, 0, bias=False),      # 1 -> 4
            nn.BatchNorm2d(NGF * 2),
            nn.ReLU(True),
            nn.ConvTranspose2d(NGF * 2, NGF, 4, 2, 1, bias=False),     # 4 -> 8
            nn.BatchNorm2d(NGF),
            nn.ReLU(True),
            nn.ConvTranspose2d(NGF, 1, 4, 2, 1, bias=False),           # 8 -> 16
            nn.Tanh(),
        )

    def forward(self, z):
        return self.main(z)


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(
            nn.Conv2d(1, NDF, 4, 2, 1, bias=False),                    # 16 -> 8
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(NDF, NDF * 2, 4, 2, 1, bias=False),              # 8 -> 4
            nn.BatchNorm2d(NDF * 2),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(NDF * 2, 1, 4, 1, 0, bias=False),                # 4 -> 1
            nn.Sigmoid(),
        )

    def forward(self, x):
        return self.main(x).view(-1, 1).squeeze(1)


class Pair(nn.Module):
    """Both networks, so that one state dict holds every initial weight."""

    def __init__(self):
        super().__init__()
        self.netG, self.netD = Generator(), Discriminator()


def blobs(n, rng):
    yy, xx = np.mgrid[0:16, 0:16]
    cy, cx = rng.uniform(4, 12, (2, n, 1, 1))
    img = np.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / 8.0) * 2 - 1
    return img[:, None].astype(np.float64)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    ap.add_argument("--init-from", default=None, help="start from a state dict saved as .npz")
    args = ap.parse_args()
    torch.set_default_dtype(getattr(torch, args.dtype))
    torch.manual_seed(0)
    pair = Pair()
    if args.init_from:
        w = np.load(args.init_from)
        pair.load_state_dict({k: torch.from_numpy(w[k]) for k in w.files})
    netG, netD = pair.netG, pair.netD
    real_dtype = torch.get_default_dtype()
    criterion = nn.BCELoss()
    optD = torch.optim.Adam(netD.parameters(), lr=2e-3, betas=(0.5, 0.999))
    optG = torch.optim.Adam(netG.parameters(), lr=2e-3, betas=(0.5, 0.999))
    rng = np.random.default_rng(1)
    for step in range(1, args.steps + 1):
        real = torch.from_numpy(blobs(args.batch_size, rng)).to(real_dtype)
        noise = torch.from_numpy(rng.standard_normal((args.batch_size, NZ, 1, 1))).to(
            real_dtype)
        ones = torch.full((args.batch_size,), 1.0, dtype=real_dtype)
        zeros = torch.full((args.batch_size,), 0.0, dtype=real_dtype)
        netD.zero_grad()
        err_real = criterion(netD(real), ones)
        err_real.backward()
        fake = netG(noise)
        err_fake = criterion(netD(fake.detach()), zeros)
        err_fake.backward()
        optD.step()
        netG.zero_grad()
        err_g = criterion(netD(fake), ones)
        err_g.backward()
        optG.step()
        print(f"step {step} loss_D {(err_real + err_fake).item():.12f} "
              f"loss_G {err_g.item():.12f}")
        print(f"step {step} loss {err_g.item():.12f}")


if __name__ == "__main__":
    main()
