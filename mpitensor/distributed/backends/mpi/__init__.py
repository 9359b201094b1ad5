"""The MPI backend: :class:`~.group.MPIGroup` and the pieces it stands on."""
