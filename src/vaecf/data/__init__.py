"""Datasets: download, per-dataset readers, implicit conversion and filtering, the split."""
