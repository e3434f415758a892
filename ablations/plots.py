"""Plots the notebooks and reports share (matplotlib, Agg: no display needed): headline frontiers, microbenchmark
off/on rows, and the pyplot they draw with. The attribution's own plots: `ablations/attribution/plots.py`."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def pyplot():
    """matplotlib's pyplot on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    return plt


def plot_frontiers(curves: dict[str, dict[str, list]], path: Path, title: str = "") -> Path:
    """Each coalition's points (P90 interactivity, throughput per GPU) and its frontier as a line
    (`inspection.frontiers`' result); the path written."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.4), dpi=120)
    try:
        for k, (name, curve) in enumerate(curves.items()):
            color = f"C{k % 10}"
            points = curve["points"]
            ax.scatter([p.interactivity for p in points], [p.throughput_per_gpu for p in points], color=color,
                       alpha=0.5, s=18)
            front = curve["frontier"]
            ax.plot([p.interactivity for p in front], [p.throughput_per_gpu for p in front], "-o", color=color,
                    label=f"{name} ({len(points)} point{'s' if len(points) != 1 else ''})", markersize=4)
        ax.set_xlabel("P90 interactivity (tokens/s/user)")
        ax.set_ylabel("total throughput per GPU (tokens/s)")
        ax.set_title(title or "throughput against interactivity")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(path)
    finally:
        plt.close(fig)
    return Path(path)


def plot_microbench(rows: list[dict[str, Any]], path: Path) -> Path:
    """On's gain per microbenchmark case (`inspection.microbench_rows`), one bar each, 1 marked; the path."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.0, 0.28 * len(rows) + 1.4), dpi=120)
    try:
        names = [f"{r['optimization']}: {r['case']} ({r['quantity']})" for r in rows]
        gains = [r["gain"] for r in rows]
        colors = ["tab:green" if g >= 1 else "tab:red" for g in gains]
        ax.barh(range(len(rows)), gains, color=colors)
        ax.axvline(1.0, color="black", linewidth=0.8)
        ax.set_yticks(range(len(rows)), names, fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel("on's gain over off (x)")
        fig.tight_layout()
        fig.savefig(path)
    finally:
        plt.close(fig)
    return Path(path)
