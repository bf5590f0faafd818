"""The tuning sweep's own steps: a trial's validation and the fan-in that picks the best."""

from components.tune.component import select_best, tuning_report, validate_trial

__all__ = ["select_best", "tuning_report", "validate_trial"]
