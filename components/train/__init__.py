"""KFP component of `vaecf train`."""

from components.train.component import train

__all__ = ["train"]
