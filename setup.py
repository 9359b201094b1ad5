"""Build script for the one compiled part of mpitensor (everything else is in setup.cfg).

``mpitensor/_cpu_kernels.c`` holds conv2d's band loops and 2x2 max pooling, which run without
the interpreter lock (see ``mpitensor/nn/_native.py``). The extension is optional: where it
cannot be built (no C compiler), the install still succeeds and these layers use their NumPy
loops.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("mpitensor._cpu_kernels", ["mpitensor/_cpu_kernels.c"],
                             optional=True)])
