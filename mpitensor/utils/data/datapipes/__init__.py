"""``torch.utils.data.datapipes``: composable data loading pipelines.

``iter`` holds the iterable-style DataPipes, ``map`` the map-style ones; ``datapipe`` the base
classes (:class:`IterDataPipe`, :class:`MapDataPipe`, :class:`DataChunk`,
:class:`DFIterDataPipe`).
"""

from __future__ import annotations

from . import datapipe, iter, map  # noqa: A004,F401 - torch's module names
from ._decorator import (
    argument_validation,
    functional_datapipe,
    guaranteed_datapipes_determinism,
    non_deterministic,
    runtime_validation,
    runtime_validation_disabled,
)
from .datapipe import DataChunk, DFIterDataPipe, IterDataPipe, MapDataPipe

# what mpitensor.utils.data exports from here (the submodules iter, map and datapipe are
# reached as attributes, as in torch)
__all__ = ["DFIterDataPipe", "DataChunk", "IterDataPipe", "MapDataPipe", "argument_validation",
           "functional_datapipe", "guaranteed_datapipes_determinism", "non_deterministic",
           "runtime_validation", "runtime_validation_disabled"]
