"""Build script for mpitensor's compiled parts (everything else is in setup.cfg).

Every extension is optional: where one cannot be built (no C compiler, or NumPy's headers
missing), the install still succeeds and the pure-Python code it speeds up runs instead.

* ``mpitensor/_cpu_kernels.c``: conv2d's band loops and 2x2 max pooling, which run without the
  interpreter lock (see ``mpitensor/nn/_kernels/native.py``), and the copies of runs that
  DTensor redistributions make (``copy_runs``, ``scatter_runs``: see
  ``mpitensor/distributed/tensor/_direct.py``);
* ``mpitensor/distributed/backends/mpi/_tiny.c``: small collectives through a board in shared
  memory (see ``mpitensor/distributed/backends/mpi/shm_tiny.py``);
* ``mpitensor/distributed/health/_slots.c``: the agreement check's shared slots of a one-machine
  group (see ``mpitensor/distributed/health/fingerprint.py``), built against NumPy's headers
  (NumPy 2's, from the build requirements: a module built on them also runs on NumPy 1.x; where
  it cannot load, the Python slots are used).
"""

from setuptools import Extension, setup

extensions = [Extension("mpitensor._cpu_kernels", ["mpitensor/_cpu_kernels.c"], optional=True),
              Extension("mpitensor.distributed.backends.mpi._tiny",
                        ["mpitensor/distributed/backends/mpi/_tiny.c"], optional=True)]
try:
    import numpy
except ImportError:  # a build without NumPy at hand (pyproject.toml asks for it)
    pass
else:
    extensions.append(Extension("mpitensor.distributed.health._slots",
                                ["mpitensor/distributed/health/_slots.c"],
                                include_dirs=[numpy.get_include()], optional=True))

setup(ext_modules=extensions)
