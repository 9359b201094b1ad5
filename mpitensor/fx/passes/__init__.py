"""Graph passes: ``shape_prop.ShapeProp`` records each node's tensor metadata."""

from . import shape_prop

__all__ = ["shape_prop"]
