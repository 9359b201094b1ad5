"""A small ResNet trained data-parallel: DDP, DistributedSampler, SGD and OneCycleLR.

    mpiexec -n 2 python examples/ported/resnet_ddp.py --epochs 2
    USE_MPITENSOR=0 mpiexec -n 2 python examples/ported/resnet_ddp.py   # real torch, gloo
    torchrun --nproc-per-node 2 examples/ported/resnet_ddp.py          # real torch, torchrun

The data are CIFAR-shaped (3 x 32 x 32) random images from a fixed numpy seed, labelled by a
fixed random linear "teacher" on a 4 x 4 average-pooled copy of each image, so the task is
learnable and identical in every library. Rank and world size come from torchrun's RANK and
WORLD_SIZE, or else from the MPI launcher's PMI_RANK and PMI_SIZE.
"""
import argparse
import os

import numpy as np

if os.environ.get("USE_MPITENSOR", "1") == "1":
    import mpitensor as torch
    import mpitensor.distributed as dist
    import mpitensor.nn.functional as F
    from mpitensor import nn, optim
    from mpitensor.nn.parallel import DistributedDataParallel as DDP
    from mpitensor.optim.lr_scheduler import OneCycleLR
    from mpitensor.utils.data import DataLoader, TensorDataset
    from mpitensor.utils.data.distributed import DistributedSampler
else:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch import nn, optim
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.optim.lr_scheduler import OneCycleLR
    from torch.utils.data import DataLoader, TensorDataset
    from torch.utils.data.distributed import DistributedSampler


def setup(backend):
    """Join the job: env:// rendezvous, with the rank taken from torchrun or from mpiexec."""
    if "RANK" not in os.environ:
        os.environ["RANK"] = os.environ.get("PMI_RANK", "0")
        os.environ["WORLD_SIZE"] = os.environ.get("PMI_SIZE", "1")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    dist.init_process_group(backend, init_method="env://")
    return dist.get_rank(), dist.get_world_size()


class BasicBlock(nn.Module):
    def __init__(self, in_planes, planes, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = None
        if stride != 1 or in_planes != planes:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False),
                nn.BatchNorm2d(planes))

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += identity
        return F.relu(out)


class SmallResNet(nn.Module):
    def __init__(self, widths=(16, 32, 64), num_classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, widths[0], 3, padding=1, bias=False),
                                  nn.BatchNorm2d(widths[0]), nn.ReLU(inplace=True))
        blocks, in_planes = [], widths[0]
        for i, planes in enumerate(widths):
            blocks.append(BasicBlock(in_planes, planes, stride=1 if i == 0 else 2))
            in_planes = planes
        self.layers = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(in_planes, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)
        for m in self.modules():  # each residual branch starts as the identity
            if isinstance(m, BasicBlock):
                nn.init.zeros_(m.bn2.weight)

    def forward(self, x):
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(self.pool(x), 1))


def synthetic_cifar(n, size, seed):
    rng = np.random.default_rng(seed)
    teacher = np.random.default_rng(1234).standard_normal((3 * 4 * 4, 10))
    x = rng.standard_normal((n, 3, size, size)).astype(np.float32)
    pooled = x.reshape(n, 3, 4, size // 4, 4, size // 4).mean(axis=(3, 5)).reshape(n, -1)
    y = (pooled @ teacher).argmax(axis=1).astype(np.int64)
    return TensorDataset(torch.from_numpy(x).to(torch.get_default_dtype()), torch.from_numpy(y))


def evaluate(model, loader, device):
    model.eval()
    counts = torch.zeros(2, dtype=torch.float64, device=device)  # correct, seen
    with torch.no_grad():
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            pred = model(x).argmax(dim=1)
            counts[0] += (pred == y).sum().item()
            counts[1] += y.numel()
    dist.all_reduce(counts, op=dist.ReduceOp.SUM)
    return counts[0].item() / counts[1].item()


def main():
    parser = argparse.ArgumentParser(description="ResNet with DistributedDataParallel")
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=0.1, help="OneCycleLR's max_lr")
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--weight-decay", type=float, default=5e-4)
    parser.add_argument("--label-smoothing", type=float, default=0.1)
    parser.add_argument("--clip-grad-norm", type=float, default=0.0, help="0: no clipping")
    parser.add_argument("--sync-bn", action="store_true",
                        help="batch statistics over all ranks (SyncBatchNorm; GPU-only in torch)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--train-size", type=int, default=1024)
    parser.add_argument("--test-size", type=int, default=256)
    parser.add_argument("--image-size", type=int, default=32, help="a multiple of 4")
    parser.add_argument("--backend", default="gloo")
    parser.add_argument("--no-shuffle", action="store_true",
                        help="keep the DistributedSampler's order fixed")
    parser.add_argument("--max-steps", type=int, default=0, help="stop after N steps per epoch")
    parser.add_argument("--log-interval", type=int, default=5)
    parser.add_argument("--init-from", default=None,
                        help="start from a state dict saved as .npz (name -> array)")
    parser.add_argument("--save-model", default=None, help="rank 0 saves the weights here")
    parser.add_argument("--dtype", choices=["float32", "float64"], default="float32",
                        help="the dtype of weights and images (torch.set_default_dtype)")
    args = parser.parse_args()
    torch.set_default_dtype(getattr(torch, args.dtype))

    rank, world_size = setup(args.backend)
    torch.manual_seed(args.seed)
    device = torch.device("cpu")

    train_set = synthetic_cifar(args.train_size, args.image_size, seed=args.seed)
    test_set = synthetic_cifar(args.test_size, args.image_size, seed=args.seed + 1)
    sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank,
                                 shuffle=not args.no_shuffle, seed=args.seed)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler,
                              drop_last=True)
    test_loader = DataLoader(test_set, batch_size=128,
                             sampler=DistributedSampler(test_set, shuffle=False))

    model = SmallResNet()
    if args.init_from:
        weights = np.load(args.init_from)
        model.load_state_dict({k: torch.from_numpy(weights[k]) for k in weights.files})
    if args.sync_bn:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    model = DDP(model.to(device))

    optimizer = optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum,
                          weight_decay=args.weight_decay, nesterov=True)
    steps_per_epoch = len(train_loader)
    if args.max_steps:
        steps_per_epoch = min(steps_per_epoch, args.max_steps)
    scheduler = OneCycleLR(optimizer, max_lr=args.lr, epochs=args.epochs,
                           steps_per_epoch=steps_per_epoch)
    criterion = nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)

    step = 0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        for i, (x, y) in enumerate(train_loader):
            if i == steps_per_epoch:
                break
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad(set_to_none=True)
            loss = criterion(model(x), y)
            loss.backward()
            if args.clip_grad_norm:
                nn.utils.clip_grad_norm_(model.parameters(), args.clip_grad_norm)
            optimizer.step()
            lr = scheduler.get_last_lr()[0]  # the rate this step used
            scheduler.step()
            step += 1
            if step % args.log_interval == 0 or step == 1:
                print(f"rank {rank} epoch {epoch} step {step} loss {loss.item():.12f} "
                      f"lr {lr:.6f}", flush=True)
        acc = evaluate(model, test_loader, device)
        if rank == 0:
            print(f"epoch {epoch} test accuracy {100 * acc:.1f}%", flush=True)

    if args.save_model and rank == 0:
        torch.save(model.module.state_dict(), args.save_model)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
