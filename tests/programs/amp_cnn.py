"""A small CNN trained with mixed precision, written as public programs write it.

    python tests/programs/amp_cnn.py [--steps 8] [--amp-dtype bfloat16] [--init-from w.npz]
    USE_MPITENSOR=0 python tests/programs/amp_cnn.py ...   # the same program on torch

The device is CUDA where one is available, else the CPU; the forward runs under
``torch.autocast(device_type=..., dtype=...)``, the loss goes through ``torch.amp.GradScaler``
(growth every 3 clean steps, so the scale moves), and ``torch.cuda.Event`` timing and
``torch.cuda.max_memory_allocated`` are reported where CUDA is there, as such programs guard
them. Prints "step N loss X scale S" per step.
"""
import argparse
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


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, stride=2, padding=1)
        self.ln = nn.LayerNorm(8 * 4 * 4)
        self.fc = nn.Linear(8 * 4 * 4, 3)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.gelu(self.conv2(x))
        return self.fc(self.ln(torch.flatten(x, 1)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--amp-dtype", choices=["bfloat16", "float16"], default="bfloat16")
    ap.add_argument("--no-amp", action="store_true")
    ap.add_argument("--init-from", default=None, help="start from a state dict saved as .npz")
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    use_amp = not args.no_amp
    torch.manual_seed(0)
    rng = np.random.default_rng(1)
    model = Net().to(device)
    if args.init_from:
        w = np.load(args.init_from)
        model.load_state_dict({k: torch.from_numpy(w[k]) for k in w.files})
    opt = torch.optim.SGD(model.parameters(), lr=0.02)
    scaler = torch.amp.GradScaler(device.type, init_scale=2.0**10, growth_interval=3,
                                  enabled=use_amp)
    amp_dtype = getattr(torch, args.amp_dtype)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
    for step in range(1, args.steps + 1):
        x = torch.tensor(rng.standard_normal((8, 1, 8, 8)).astype(np.float32)).to(device)
        y = torch.tensor(rng.integers(0, 3, 8)).to(device)
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type=device.type, dtype=amp_dtype, enabled=use_amp):
            logits = model(x)
            loss = F.cross_entropy(logits, y)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        scaler.step(opt)
        scaler.update()
        print(f"step {step} loss {loss.item():.8f} scale {scaler.get_scale():g} "
              f"dtype {str(logits.dtype).replace('torch.', '').replace('mpitensor.', '')}")
    if device.type == "cuda":
        end.record()
        torch.cuda.synchronize()
        print(f"cuda: {start.elapsed_time(end):.1f} ms, peak "
              f"{torch.cuda.max_memory_allocated() / 2**20:.1f} MiB")
    print(f"state {scaler.state_dict()}")


if __name__ == "__main__":
    main()
