"""The tensor core's helpers: what every op needs besides the Tensor class itself.

``opkit``         the kit for writing an op: wrap, run, run_view, run_inplace, sum_to, ...
``dims``          dim/shape arguments in all of torch's spellings
``devices``       CPU/GPU placement and the array module (NumPy or CuPy) of a tensor
``promotion``     torch's type promotion and casting rules
``half``          float16/bfloat16 storage with float32 compute
``printing``      ``repr`` of tensors
``python_data``   arrays from Python numbers and nested lists, with torch's dtype rules
``autocast``      the autocast state and its per-op casts
``numpy_names``   NumPy's ``axis=``/``keepdims=`` spellings accepted where torch accepts them
``shared``        shared-memory storage behind ``share_memory_()``
``legacy_types``  ``FloatTensor`` and the ``'torch.FloatTensor'`` type names
``precision``     ``set_float32_matmul_precision``
``compile``       ``torch.compile``, which returns what it is given
"""
