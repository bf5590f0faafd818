"""KFP component of `vaecf evaluate`."""

from components.evaluate.component import evaluate

__all__ = ["evaluate"]
