"""Build script for the one compiled part of mpitensor (everything else is in setup.cfg).

``mpitensor/nn/_conv_native.c`` holds conv2d's band loops, which run without the interpreter
lock (see ``mpitensor/nn/_native.py``). The extension is optional: where it cannot be built
(no C compiler), the install still succeeds and conv2d uses its NumPy loops.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("mpitensor.nn._conv_native", ["mpitensor/nn/_conv_native.c"],
                             optional=True)])
