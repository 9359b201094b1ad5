"""The base layer: what every other part of the package stands on, and nothing tensor-shaped.

``config``      every ``MPITENSOR_*`` switch, declared once (name, parser, default, doc line)
``threads``     the BLAS / OpenMP thread pools (threadpoolctl) and the per-rank thread budget
``workspace``   reusable scratch buffers for kernels
``parallel``    splitting a kernel's work over this rank's threads
``gpu_memory``  the counting allocator behind ``torch.cuda`` memory statistics
``mpi_import``  where mpi4py.MPI was first imported (for error messages), and MPICH's
                algorithm settings made just before
"""
