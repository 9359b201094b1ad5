"""Placeholder: being written."""
__all__: list = []


class Module:
    """Placeholder."""
