"""vaecf: Mult-VAE collaborative filtering as a Kubeflow pipeline of containerized stages."""

__version__ = "0.1.0"
