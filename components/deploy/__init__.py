"""KFP component of `vaecf deploy`."""

from components.deploy.component import deploy

__all__ = ["deploy"]
