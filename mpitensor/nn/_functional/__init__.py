"""The implementations behind ``mpitensor.nn.functional``, one module per family of ops.

Each op is an autograd Function (forward and backward side by side) working on Tensors;
the array-level loops they call live in :mod:`mpitensor.nn._kernels`. Users import these ops
from ``mpitensor.nn.functional``, which re-exports them under torch's names.
"""
