"""Plots for the HTML report, rendered off-screen to PNG bytes.

Figures are built with ``matplotlib.figure.Figure`` (rendered by the Agg canvas), never through
pyplot, so no global backend or figure registry is touched. PNGs are written without a
software-version text chunk, so the same data gives the same bytes on the same matplotlib.
"""

from __future__ import annotations

import io
from collections.abc import Sequence

from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

Series = tuple[str, Sequence[float], Sequence[float | None]]


def _png(figure: Figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=90, metadata={"Software": None})
    return buffer.getvalue()


def panels(title: str, grid: list[tuple[str, str, list[Series]]], columns: int = 2) -> bytes:
    """A grid of line plots; each panel is (title, y label, [(label, xs, ys), ...]).

    ``None`` values are left out of a line (e.g. epochs that were not validated).
    """
    rows = (len(grid) + columns - 1) // columns
    figure = Figure(figsize=(5.6 * columns, 3.4 * rows), layout="tight")
    axes = figure.subplots(rows, columns, squeeze=False)
    for axis, (name, ylabel, series) in zip(axes.flat, grid, strict=False):
        for label, xs, ys in series:
            points = [(x, y) for x, y in zip(xs, ys, strict=True) if y is not None]
            if points:
                axis.plot(*zip(*points, strict=True), marker="o", markersize=3, label=label)
        axis.set_title(name)
        axis.set_ylabel(ylabel)
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        axis.grid(alpha=0.3)
        if len(series) > 1:
            axis.legend(fontsize=8)
    for axis in list(axes.flat)[len(grid):]:
        axis.set_visible(False)
    figure.suptitle(title)
    return _png(figure)


def scaling(series: list[tuple[str, list[int], list[float]]]) -> bytes:
    """Strong scaling: speed-up vs world size per configuration, against the ideal line."""
    figure = Figure(figsize=(11.2, 3.6), layout="tight")
    left, right = figure.subplots(1, 2)
    top = max((max(ws) for _, ws, _ in series), default=1)
    left.plot([1, top], [1, top], linestyle="--", color="grey", label="ideal")
    for label, sizes, speedups in series:
        left.plot(sizes, speedups, marker="o", label=label)
        right.plot(sizes, [s / n for s, n in zip(speedups, sizes, strict=True)], marker="o",
                   label=label)
    right.axhline(1.0, linestyle="--", color="grey")
    left.set(title="Speed-up vs world size", xlabel="world size", ylabel="speed-up")
    right.set(title="Efficiency vs world size", xlabel="world size", ylabel="efficiency",
              ylim=(0, 1.1))
    for axis in (left, right):
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    return _png(figure)


def bars(title: str, ylabel: str, labels: list[str], values: list[float]) -> bytes:
    """One bar per configuration (e.g. users/s of each benchmark configuration)."""
    figure = Figure(figsize=(max(5.0, 0.9 * len(labels) + 2), 3.6), layout="tight")
    axis = figure.subplots()
    axis.bar(range(len(values)), values, color="#2c5d8f")
    axis.set_xticks(range(len(labels)), labels, rotation=30, ha="right", fontsize=8)
    axis.set(title=title, ylabel=ylabel)
    axis.grid(axis="y", alpha=0.3)
    return _png(figure)
