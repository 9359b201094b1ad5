"""The process-group backends: each implements
:class:`~mpitensor.distributed.process_group.ProcessGroup`.

* ``backends/mpi/``: the MPI group (``group.py``), the buffers it hands to mpi4py
  (``buffers.py``), a node's shared-memory segments (``shm.py``) and the shared-memory
  reduction DDP uses within one machine (``node_reduce.py``);
* ``backends/nccl.py``: the NCCL group, which holds an MPI group for what NCCL lacks.
"""
