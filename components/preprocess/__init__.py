"""KFP component of `vaecf preprocess`."""

from components.preprocess.component import preprocess

__all__ = ["preprocess"]
