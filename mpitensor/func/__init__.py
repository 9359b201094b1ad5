"""``torch.func``: function transforms over tensors and modules.

=================  ===========================================================================
``vmap``           map a function over a batch dimension (a loop: exact, not vectorized)
``transforms``     ``grad``, ``grad_and_value``, ``vjp``, ``jacrev``, ``jacfwd`` (on reverse-
                   mode autograd; ``hessian`` refused: no double backward)
``module_call``    ``functional_call``, ``stack_module_state``
``_pytree``        nested tuples, lists and dicts of tensors, flattened and rebuilt
=================  ===========================================================================

Per-sample gradients, as torch's tutorial computes them:

Example:
    >>> import mpitensor as mt
    >>> from mpitensor.func import functional_call, grad, vmap
    >>> model = mt.nn.Linear(3, 1)
    >>> params = {k: v.detach() for k, v in model.named_parameters()}
    >>> def loss(p, x, y):
    ...     return ((functional_call(model, p, (x,)) - y) ** 2).sum()
    >>> g = vmap(grad(loss), in_dims=(None, 0, 0))(params, mt.randn(5, 3), mt.randn(5, 1))
    >>> tuple(g["weight"].shape)
    (5, 1, 3)
"""

from .module_call import functional_call, stack_module_state
from .transforms import grad, grad_and_value, hessian, jacfwd, jacrev, vjp
from .vmap import vmap

__all__ = ["functional_call", "stack_module_state", "grad", "grad_and_value", "vjp", "jacrev",
           "jacfwd", "hessian", "vmap"]
