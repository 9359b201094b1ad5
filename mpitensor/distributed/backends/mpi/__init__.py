"""The MPI backend: :class:`~mpitensor.distributed.backends.mpi.group.MPIGroup` and what it stands on."""
