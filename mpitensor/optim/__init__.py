"""Optimisers and learning-rate schedules with PyTorch's names (``torch.optim``).

Example:
    >>> import mpitensor as mt
    >>> import mpitensor.optim as optim
    >>> w = mt.tensor([1.0], requires_grad=True)
    >>> opt = optim.SGD([w], lr=0.1, momentum=0.9)
    >>> sched = optim.lr_scheduler.StepLR(opt, step_size=10, gamma=0.5)
    >>> sched.get_last_lr()
    [0.1]
"""

from __future__ import annotations

from . import lr_scheduler
from .adadelta import Adadelta
from .adagrad import Adagrad
from .adam import Adam, AdamW
from .optimizer import Optimizer
from .rmsprop import RMSprop
from .sgd import SGD

__all__ = ["Adadelta", "Adagrad", "Adam", "AdamW", "Optimizer", "RMSprop", "SGD", "lr_scheduler"]
