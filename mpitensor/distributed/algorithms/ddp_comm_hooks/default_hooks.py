"""The basic DDP communication hooks: plain averaging and low-precision (float16 / bfloat16)
compression of the bucket before it is summed, with wrappers that add the compression to any
other hook.

A hook is ``hook(state, bucket) -> Future[Tensor]``; for these ``state`` is the process group
(``None``: the default group). Register one with
``DistributedDataParallel.register_comm_hook(state, hook)``.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from ... import _grad_bucket
from ..._work_future import WorkFuture
from ...process_group import ProcessGroup

__all__ = ["allreduce_hook", "bf16_compress_hook", "bf16_compress_wrapper",
           "fp16_compress_hook", "fp16_compress_wrapper"]

GradBucket = _grad_bucket.GradBucket
Hook = Callable[[Any, GradBucket], WorkFuture]


def _group(process_group: Optional[ProcessGroup]) -> ProcessGroup:
    from ... import _pg  # the package imports this module lazily: no cycle at import time

    return _pg(process_group)


def _allreduce_fut(process_group: Optional[ProcessGroup], tensor: Any) -> WorkFuture:
    """Divide ``tensor`` by the group's size, then sum it over the group; a future of it."""
    from ... import all_reduce

    group = _group(process_group)
    tensor.div_(group.size())
    return all_reduce(tensor, group=group, async_op=True).get_future().then(
        lambda fut: fut.value()[0])


def allreduce_hook(process_group: Optional[ProcessGroup], bucket: GradBucket) -> WorkFuture:
    """Average the bucket over ``process_group``: what DDP does without a hook.

    Example:
        >>> ddp.register_comm_hook(None, allreduce_hook)
    """
    return _allreduce_fut(process_group, bucket.buffer())


def _compress_hook(dtype: Any, process_group: Optional[ProcessGroup],
                   bucket: GradBucket) -> WorkFuture:
    from ... import all_reduce

    group = _group(process_group)
    buffer = bucket.buffer()
    compressed = buffer.to(dtype).div_(group.size())

    def decompress(fut: Any) -> Any:
        buffer.copy_(fut.value()[0])
        return buffer

    return all_reduce(compressed, group=group, async_op=True).get_future().then(decompress)


def fp16_compress_hook(process_group: Optional[ProcessGroup], bucket: GradBucket) -> WorkFuture:
    """Average the bucket in float16: cast, divide by the world size, sum, cast back.

    Halves the traffic of a float32 model; the averaged gradients carry float16 rounding
    (and saturate beyond float16's range, 65504).
    """
    from ....dtypes import float16

    return _compress_hook(float16, process_group, bucket)


def bf16_compress_hook(process_group: Optional[ProcessGroup], bucket: GradBucket) -> WorkFuture:
    """Average the bucket in bfloat16 (float32's range, 8 bits of mantissa)."""
    from ....dtypes import bfloat16

    return _compress_hook(bfloat16, process_group, bucket)


def _compress_wrapper(short: str, dtype_name: str, hook: Hook) -> Hook:
    if not callable(hook):
        raise TypeError(f"{short}_compress_wrapper: hook must be callable, got {hook!r}")

    def wrapped(hook_state: Any, bucket: GradBucket) -> WorkFuture:
        from .... import dtypes

        full = bucket.buffer()
        bucket.set_buffer(full.to(getattr(dtypes, dtype_name)))
        fut = hook(hook_state, bucket)
        if not hasattr(fut, "then"):
            raise TypeError(f"{short}_compress_wrapper: the wrapped hook must return a "
                            f"Future, got {type(fut).__name__}")

        def decompress(f: Any) -> Any:
            full.copy_(f.value())
            return full

        return fut.then(decompress)

    wrapped.__name__ = f"{short}_compress_wrapper_hook"
    return wrapped


def fp16_compress_wrapper(hook: Hook) -> Hook:
    """Wrap ``hook`` so that it communicates a float16 copy of the bucket (the result is cast
    back to the bucket's dtype). Example: ``fp16_compress_wrapper(powerSGD_hook)``."""
    return _compress_wrapper("fp16", "float16", hook)


def bf16_compress_wrapper(hook: Hook) -> Hook:
    """Wrap ``hook`` so that it communicates a bfloat16 copy of the bucket."""
    return _compress_wrapper("bf16", "bfloat16", hook)
