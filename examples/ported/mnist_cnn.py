"""A small convolutional classifier for MNIST, trained with Adadelta and a StepLR schedule.

    python examples/ported/mnist_cnn.py --data-dir /path/to/mnist --epochs 2
    USE_MPITENSOR=0 python examples/ported/mnist_cnn.py --data-dir /path/to/mnist   # real torch

--data-dir holds MNIST's IDX files (``train-images-idx3-ubyte[.gz]`` and friends). Where only the
10k test files are there, the first 8,000 test images train and the last 2,000 evaluate.
"""
import argparse
import gzip
import os

import numpy as np

if os.environ.get("USE_MPITENSOR", "1") == "1":
    import mpitensor as torch
    import mpitensor.nn.functional as F
    from mpitensor import nn, optim
    from mpitensor.optim.lr_scheduler import StepLR
    from mpitensor.utils.data import DataLoader, TensorDataset
else:
    import torch
    import torch.nn.functional as F
    from torch import nn, optim
    from torch.optim.lr_scheduler import StepLR
    from torch.utils.data import DataLoader, TensorDataset

MEAN, STD = 0.1307, 0.3081


def read_idx(path):
    """An IDX file (optionally gzipped) as a numpy array: magic, big-endian dims, raw bytes."""
    if not os.path.exists(path) and os.path.exists(path + ".gz"):
        path += ".gz"
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = np.frombuffer(data, dtype=">u4", count=ndim, offset=4)
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def mnist_split(data_dir, prefix):
    images = read_idx(os.path.join(data_dir, f"{prefix}-images-idx3-ubyte"))
    labels = read_idx(os.path.join(data_dir, f"{prefix}-labels-idx1-ubyte"))
    x = ((images.astype(np.float32) / 255.0 - MEAN) / STD)[:, None, :, :]
    return x, labels.astype(np.int64)


def load_mnist(data_dir, train_limit=0, test_limit=0):
    if any(os.path.exists(os.path.join(data_dir, "train-images-idx3-ubyte" + ext))
           for ext in ("", ".gz")):
        train, test = mnist_split(data_dir, "train"), mnist_split(data_dir, "t10k")
    else:
        print("no MNIST training files: training on test images 0-7999, testing on 8000-9999")
        x, y = mnist_split(data_dir, "t10k")
        train, test = (x[:8000], y[:8000]), (x[8000:], y[8000:])
    if train_limit:
        train = (train[0][:train_limit], train[1][:train_limit])
    if test_limit:
        test = (test[0][:test_limit], test[1][:test_limit])
    real = torch.get_default_dtype()  # float32 unless --dtype float64
    return (TensorDataset(torch.from_numpy(train[0]).to(real), torch.from_numpy(train[1])),
            TensorDataset(torch.from_numpy(test[0]).to(real), torch.from_numpy(test[1])))


class Net(nn.Module):
    def __init__(self, dropout=0.25):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, kernel_size=5, padding=2)   # 28x28 -> 28x28
        self.conv2 = nn.Conv2d(16, 32, kernel_size=3)              # 14x14 -> 12x12
        self.drop_maps = nn.Dropout2d(dropout)
        self.fc1 = nn.Linear(32 * 6 * 6, 64)
        self.drop = nn.Dropout(2 * dropout)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = self.drop_maps(F.relu(self.conv2(x)))
        x = F.max_pool2d(x, kernel_size=2, stride=2)
        x = torch.flatten(x, 1)
        x = self.drop(F.relu(self.fc1(x)))
        return F.log_softmax(self.fc2(x), dim=1)


def train(args, model, device, loader, optimizer, epoch, step):
    model.train()
    for batch_idx, (data, target) in enumerate(loader):
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        output = model(data)
        loss = F.nll_loss(output, target)
        loss.backward()
        optimizer.step()
        step += 1
        if batch_idx % args.log_interval == 0:
            print(f"epoch {epoch} step {step} [{batch_idx * len(data)}/{len(loader.dataset)}] "
                  f"loss {loss.item():.12f}")
        if args.dry_run:
            break
    return step


def test(model, device, loader):
    model.eval()
    test_loss, correct = 0.0, 0
    with torch.no_grad():
        for data, target in loader:
            data, target = data.to(device), target.to(device)
            output = model(data)
            test_loss += F.nll_loss(output, target, reduction="sum").item()
            pred = output.argmax(dim=1, keepdim=True)
            correct += pred.eq(target.view_as(pred)).sum().item()
    n = len(loader.dataset)
    print(f"Test set: Average loss: {test_loss / n:.4f}, "
          f"Accuracy: {correct}/{n} ({100.0 * correct / n:.1f}%)")
    return correct / n


def main():
    parser = argparse.ArgumentParser(description="MNIST convnet")
    parser.add_argument("--batch-size", type=int, default=64, metavar="N")
    parser.add_argument("--test-batch-size", type=int, default=1000, metavar="N")
    parser.add_argument("--epochs", type=int, default=3, metavar="N")
    parser.add_argument("--lr", type=float, default=1.0, metavar="LR")
    parser.add_argument("--gamma", type=float, default=0.7, metavar="M",
                        help="learning-rate decay per epoch (StepLR)")
    parser.add_argument("--dropout", type=float, default=0.25,
                        help="dropout on the conv maps (twice that before the last layer)")
    parser.add_argument("--no-accel", action="store_true", help="train on the CPU")
    parser.add_argument("--dry-run", action="store_true", help="one batch per epoch")
    parser.add_argument("--seed", type=int, default=1, metavar="S")
    parser.add_argument("--log-interval", type=int, default=10, metavar="N")
    parser.add_argument("--save-model", action="store_true")
    parser.add_argument("--data-dir", default=os.environ.get("MNIST_DIR", "data/mnist"))
    parser.add_argument("--train-limit", type=int, default=0, help="use the first N images")
    parser.add_argument("--test-limit", type=int, default=0)
    parser.add_argument("--init-from", default=None,
                        help="start from a state dict saved as .npz (name -> array)")
    parser.add_argument("--dtype", choices=["float32", "float64"], default="float32",
                        help="the dtype of weights and images (torch.set_default_dtype)")
    args = parser.parse_args()
    torch.set_default_dtype(getattr(torch, args.dtype))

    use_accel = not args.no_accel and torch.accelerator.is_available()
    device = torch.accelerator.current_accelerator() if use_accel else torch.device("cpu")
    torch.manual_seed(args.seed)

    train_kwargs = {"batch_size": args.batch_size}
    test_kwargs = {"batch_size": args.test_batch_size}
    if use_accel:
        train_kwargs.update(num_workers=1, pin_memory=True)
        test_kwargs.update(num_workers=1, pin_memory=True)

    train_set, test_set = load_mnist(args.data_dir, args.train_limit, args.test_limit)
    test_loader = DataLoader(test_set, **test_kwargs)

    model = Net(args.dropout)
    if args.init_from:
        weights = np.load(args.init_from)
        model.load_state_dict({k: torch.from_numpy(weights[k]) for k in weights.files})
    model = model.to(device)
    optimizer = optim.Adadelta(model.parameters(), lr=args.lr)
    scheduler = StepLR(optimizer, step_size=1, gamma=args.gamma)

    step = 0
    for epoch in range(1, args.epochs + 1):
        # the order comes from numpy, so it is the same whichever library runs the program
        order = np.random.default_rng(args.seed + epoch).permutation(len(train_set)).tolist()
        train_loader = DataLoader(train_set, sampler=order, **train_kwargs)
        step = train(args, model, device, train_loader, optimizer, epoch, step)
        test(model, device, test_loader)
        scheduler.step()

    if args.save_model:
        torch.save(model.state_dict(), "mnist_cnn.pt")


if __name__ == "__main__":
    main()
