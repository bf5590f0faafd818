"""Baselines scored through the same evaluation code as the VAE: popularity and EASE."""

from vaecf.baselines.ease import DEFAULT_LAMBDA, Ease, ease_weights
from vaecf.baselines.popularity import Popularity

BASELINES = ("popularity", "ease")

__all__ = ["BASELINES", "DEFAULT_LAMBDA", "Ease", "Popularity", "ease_weights"]
