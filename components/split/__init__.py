"""KFP component of `vaecf split`."""

from components.split.component import split

__all__ = ["split"]
