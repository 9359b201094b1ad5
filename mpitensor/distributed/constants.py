"""``torch.distributed.constants``: the default timeouts of process groups."""

from __future__ import annotations

from ._c10d import default_pg_timeout

__all__ = ["default_pg_nccl_timeout", "default_pg_timeout"]

#: NCCL groups use the same default as the others (``MPITENSOR_TIMEOUT``, 30 minutes).
default_pg_nccl_timeout = default_pg_timeout
