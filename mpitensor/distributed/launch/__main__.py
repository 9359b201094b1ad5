"""``python -m mpitensor.distributed.launch``: torch's older launcher, on ``mpitensor-run``.

``python -m torch.distributed.launch`` ported by changing the name: the options are
``mpitensor-run``'s (torchrun's among them: ``--nproc-per-node``, ``--nnodes``, ...), and each
rank's script gets ``--local-rank=N`` as its first argument, as torch's older launcher gives
it, unless ``--use-env`` is given (then, as under torchrun, ``LOCAL_RANK`` in the environment
only). Like torch, it warns that the launcher is deprecated: new code uses ``mpitensor-run``.
"""

import sys
import warnings

from ...run import main

warnings.warn("python -m mpitensor.distributed.launch is torch's deprecated launcher, kept for "
              "old scripts: use mpitensor-run (torchrun's name changed), which passes "
              "LOCAL_RANK in the environment only, not as --local-rank", FutureWarning,
              stacklevel=1)
sys.exit(main(legacy=True))
