"""Hyperparameter tuning: the search space, trials, and picking the best by validation."""
