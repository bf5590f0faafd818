"""KFP component of `vaecf download`."""

from components.download.component import download

__all__ = ["download"]
