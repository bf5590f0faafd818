"""KFP component of `vaecf report`."""

from components.report.component import report

__all__ = ["report"]
