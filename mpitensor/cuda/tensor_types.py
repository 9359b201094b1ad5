"""``torch.cuda``'s legacy typed tensor constructors (``torch.cuda.FloatTensor``, ...).

Each makes a GPU tensor of its dtype from the calls ``mpitensor.FloatTensor`` takes (sizes, a
``Size``, data, nothing), and ``isinstance(t, mpitensor.cuda.FloatTensor)`` asks whether ``t``
is a float32 tensor on a GPU, as torch answers it. Without a GPU, calling one raises TypeError,
as a CPU-only torch does, and ``isinstance`` is False for every tensor.

Example:
    >>> import mpitensor as torch
    >>> isinstance(torch.zeros(2), torch.cuda.FloatTensor)
    False
"""

from __future__ import annotations

from typing import Any

from mpitensor import backend as _backend
from mpitensor._core import legacy_types as _legacy
from mpitensor.tensor import Tensor

__all__ = ["FloatTensor", "DoubleTensor", "HalfTensor", "BFloat16Tensor", "LongTensor",
           "IntTensor", "ShortTensor", "CharTensor", "ByteTensor", "BoolTensor"]


class _CudaTensorType(type):
    """The metaclass of the GPU constructors: calling one makes a GPU Tensor; ``isinstance``
    compares dtype and device."""

    dtype: Any

    def __instancecheck__(cls, obj: Any) -> bool:
        return (isinstance(obj, Tensor) and _backend.is_cupy_array(obj._data)
                and obj._data.dtype == cls.dtype)

    def __repr__(cls) -> str:
        return f"<class 'mpitensor.cuda.{cls.__name__}'>"

    def __call__(cls, *args: Any) -> Tensor:
        if not _backend.cupy_available():
            reason = _backend.cupy_unavailable_reason() or "no CUDA device is visible"
            raise TypeError(f"mpitensor.cuda.{cls.__name__} makes GPU tensors, and no GPU can "
                            f"be used here: {reason}. Use mpitensor.{cls.__name__} for a CPU "
                            f"tensor")
        if len(args) == 1 and isinstance(args[0], Tensor) and args[0]._data.dtype == cls.dtype:
            if _backend.is_cupy_array(args[0]._data):
                return args[0]  # a GPU tensor of the type: itself, as torch
            raise TypeError(f"mpitensor.cuda.{cls.__name__}() takes a GPU tensor; move it "
                            f"with .cuda() first")
        return getattr(_legacy, cls.__name__)(*args).cuda()

    @property
    def is_cuda(cls) -> bool:
        return True


def _make(name: str) -> type:
    cls = _CudaTensorType(name, (), {
        "__doc__": f"Make a GPU tensor as mpitensor.{name} makes a CPU one: ``{name}(2, 3)``, "
                   f"``{name}([1, 2])``, ``{name}()``.",
        "__module__": "mpitensor.cuda",
        "__slots__": (),
    })
    cls.dtype = getattr(_legacy, name).dtype
    return cls


(FloatTensor, DoubleTensor, HalfTensor, BFloat16Tensor, LongTensor, IntTensor, ShortTensor,
 CharTensor, ByteTensor, BoolTensor) = map(_make, __all__)
