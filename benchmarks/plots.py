"""PNG plots of benchmark results for the docs: grouped bars or curves, one panel per measure.

matplotlib comes with the `bench` extra (`make bench`, or `pip install -e '.[bench]'`); without it
a benchmark still prints its tables and says the plot was skipped.
"""

from __future__ import annotations

import os
import sys
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

PLOT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs", "plots")
Panel = tuple[str, Mapping[str, Sequence[float]]]  # (y label, series name -> one value per group)


def plot_path(name: str, directory: str | None = None) -> str:
    """Where a benchmark's plot goes: docs/plots/ (shown in docs/benchmarks.md), or --plot-dir."""
    return os.path.normpath(os.path.join(directory or PLOT_DIR, f"{name}.png"))


def add_plot_dir(parser: Any) -> None:
    parser.add_argument("--plot-dir", default=None,
                        help="write the PNG plot here instead of docs/plots/ (the docs')")


def bar_panels(path: str, title: str, groups: Sequence[str], panels: Sequence[Panel],
               caption: str = "") -> str | None:
    """Side-by-side panels of grouped bars (a group per entry of `groups`, a bar per series),
    each bar labelled with its value. Returns the PNG's path, or None without matplotlib."""
    plt = _pyplot(path)
    if plt is None:
        return None
    width_in = max(7.0, 5.2 * len(panels))
    fig, axes = plt.subplots(1, len(panels), figsize=(width_in, 4.2), squeeze=False)
    for ax, (ylabel, series) in zip(axes[0], panels):
        width = 0.8 / max(len(series), 1)
        for i, (name, values) in enumerate(series.items()):
            xs = [g + (i - (len(series) - 1) / 2) * width for g in range(len(groups))]
            bars = ax.bar(xs, values, width, label=name)
            ax.bar_label(bars, labels=[_short(v) for v in values], fontsize=7, padding=1)
        ax.set_xticks(range(len(groups)), groups, fontsize=8)
        ax.set_ylabel(ylabel)
        ax.margins(y=0.15)
        ax.grid(axis="y", alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=len(labels), fontsize=8,
               bbox_to_anchor=(0.5, 0.94), frameon=False)
    return _finish(plt, fig, path, title, caption, width_in, top=0.88)


def _short(value: float) -> str:
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.2g}" if abs(value) < 1 else (
        f"{value:.1f}")


@dataclass(frozen=True)
class Curve:
    """One series of a line plot: points (xs[i], ys[i]), each optionally labelled."""

    name: str
    xs: Sequence[float]
    ys: Sequence[float]
    labels: Sequence[str] = ()
    style: str = "o-"  # a matplotlib format string: "o-" markers joined, "--" a dashed line


@dataclass(frozen=True)
class LinePanel:
    xlabel: str
    ylabel: str
    curves: Sequence[Curve]
    log_x: bool = False
    log_y: bool = False


def line_panels(path: str, title: str, panels: Sequence[LinePanel], caption: str = ""
                ) -> str | None:
    """Side-by-side panels of curves (lines through markers, each point labelled when the curve
    has labels), for sweeps and trade-offs. Returns the PNG's path, or None without matplotlib."""
    plt = _pyplot(path)
    if plt is None:
        return None
    import matplotlib.ticker

    width_in = max(7.0, 5.6 * len(panels))
    fig, axes = plt.subplots(1, len(panels), figsize=(width_in, 4.4), squeeze=False)
    for ax, panel in zip(axes[0], panels):
        for curve in panel.curves:
            ax.plot(curve.xs, curve.ys, curve.style, label=curve.name, markersize=4)
            for x, y, label in zip(curve.xs, curve.ys, curve.labels):
                ax.annotate(label, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
        if panel.log_x:
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        if panel.log_y:
            ax.set_yscale("log")
        ax.set_xlabel(panel.xlabel)
        ax.set_ylabel(panel.ylabel)
        ax.margins(0.12)
        if not panel.log_y:
            ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return _finish(plt, fig, path, title, caption, width_in, top=0.94)


def _pyplot(path: str) -> Any:
    """matplotlib.pyplot on the Agg backend, or None (and a message) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"plot skipped ({path}): matplotlib is not installed (pip install -e '.[bench]')",
              file=sys.stderr)
        return None
    return plt


def _finish(plt: Any, fig: Any, path: str, title: str, caption: str, width_in: float,
            top: float) -> str:
    """Title, the caption wrapped under the panels, and the PNG written to path."""
    fig.suptitle(title, fontsize=10)
    lines = textwrap.wrap(caption, width=int(width_in * 17)) if caption else []
    for i, line in enumerate(lines):
        fig.text(0.5, 0.01 + 0.035 * (len(lines) - 1 - i), line, ha="center", fontsize=7,
                 color="0.35")
    fig.tight_layout(rect=(0, 0.01 + 0.035 * len(lines), 1, top))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"plot: {path}")
    return path
