"""Reference models: :class:`LeNet` (LeNet-5) for MNIST-sized images.

Example:
    >>> import mpitensor as mt
    >>> from mpitensor.models import LeNet
    >>> _ = mt.manual_seed(0)
    >>> LeNet()(mt.randn(2, 1, 28, 28)).shape
    mpitensor.Size([2, 10])
"""

from __future__ import annotations

from mpitensor import nn
from mpitensor.nn import functional as F  # noqa: N812 - torch's spelling
from mpitensor.tensor import Tensor

__all__ = ["LeNet"]


class LeNet(nn.Module):
    """LeNet-5 for 28×28 images, returning log-probabilities (pair with ``F.nll_loss``).

    Layers, with PyTorch's names so a torch ``state_dict`` loads directly: ``conv1`` =
    Conv2d(in_channels, 6, 5, padding=2), ReLU, max-pool 2; ``conv2`` = Conv2d(6, 16, 5), ReLU,
    max-pool 2; flatten; ``fc1`` = Linear(400, 120), ReLU; ``fc2`` = Linear(120, 84), ReLU;
    ``fc3`` = Linear(84, num_classes); ``log_softmax(dim=1)``.

    Args:
        num_classes: number of output classes (> 0).
        in_channels: channels of the input images (> 0).

    Raises:
        ValueError: a non-positive argument.

    Example:
        >>> net = LeNet()
        >>> [name for name, _ in net.named_children()]
        ['conv1', 'conv2', 'fc1', 'fc2', 'fc3']
    """

    def __init__(self, num_classes: int = 10, in_channels: int = 1) -> None:
        super().__init__()
        for name, v in (("num_classes", num_classes), ("in_channels", in_channels)):
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError(f"LeNet: {name} must be a positive integer, got {v!r}")
        self.conv1 = nn.Conv2d(in_channels, 6, 5, padding=2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        """Map a batch ``(N, in_channels, 28, 28)`` to log-probabilities ``(N, num_classes)``."""
        # Through the submodules, as torch's tutorials write it, so hooks on net.conv1 fire.
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return F.log_softmax(self.fc3(x), dim=1)
