"""The attribution's plots: the bars (Shapley value per toggle with its interval, add-one-in and leave-one-out
beside it), the interactions' heatmap, and the first-order indices of the assumed figures (matplotlib, Agg)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ablations.plots import pyplot


def plot_attribution(out: dict[str, Any], bars_path: Path, heatmap_path: Path) -> list[Path]:
    """Write the bars (Shapley value per toggle, its interval over the draws of the assumed figures, else its
    bootstrap interval or sampling error, add-one-in and
    leave-one-out beside it) and, when there are interactions, their heatmap; the paths written."""
    plt = pyplot()
    players = out["players"]
    written = []
    fig, ax = plt.subplots(figsize=(max(5.0, 1.3 * len(players) + 2), 4.2), dpi=120)
    try:
        series = [("shapley", "Shapley", "tab:blue"), ("add_one_in", "alone", "tab:gray"),
                  ("leave_one_out", "last in", "tab:orange")]
        shown = [(key, name, color) for key, name, color in series if out.get(key)]
        width = 0.8 / max(1, len(shown))
        for k, (key, name, color) in enumerate(shown):
            xs = [i + (k - (len(shown) - 1) / 2) * width for i in range(len(players))]
            ys = [out[key][p] for p in players]
            yerr = None
            draws = (out.get("draws") or {}).get("intervals")
            if key == "shapley" and draws:       # 5-95% over the joint draws of the assumed figures
                yerr = [[max(ys[i] - draws[p]["low"], 0.0) for i, p in enumerate(players)],
                        [max(draws[p]["high"] - ys[i], 0.0) for i, p in enumerate(players)]]
                name = f"Shapley (5-95% over {out['draws']['complete']} draws)"
            elif key == "shapley" and out.get("shapley_interval"):
                yerr = [[ys[i] - out["shapley_interval"][p][0] for i, p in enumerate(players)],
                        [out["shapley_interval"][p][1] - ys[i] for i, p in enumerate(players)]]
            elif key == "shapley" and out.get("shapley_error"):
                yerr = [out["shapley_error"][p] for p in players]
            ax.bar(xs, ys, width=width, color=color, label=name, yerr=yerr, capsize=3)
        ax.axhline(0, color="black", linewidth=0.8)
        ax.set_xticks(range(len(players)), players, rotation=20)
        ax.set_ylabel(out["metric"])
        ax.set_title(f"{out['metric']}: all off {_fmt(out['all_off'])} -> all on {_fmt(out['all_on'])}")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(bars_path)
        written.append(Path(bars_path))
    finally:
        plt.close(fig)
    pairs = out.get("interactions") or {}
    if pairs:
        index = {p: i for i, p in enumerate(players)}
        grid = [[0.0] * len(players) for _ in players]
        for name, value in pairs.items():
            a, b = name.split("+")
            grid[index[a]][index[b]] = grid[index[b]][index[a]] = value
        fig, ax = plt.subplots(figsize=(1.0 * len(players) + 2.5, 1.0 * len(players) + 1.5), dpi=120)
        try:
            bound = max(abs(v) for row in grid for v in row) or 1.0
            image = ax.imshow(grid, cmap="RdBu", vmin=-bound, vmax=bound)
            ax.set_xticks(range(len(players)), players, rotation=30)
            ax.set_yticks(range(len(players)), players)
            for i in range(len(players)):
                for j in range(len(players)):
                    if i != j:
                        ax.text(j, i, f"{grid[i][j]:.3g}", ha="center", va="center", fontsize=8)
            fig.colorbar(image, ax=ax, label=f"interaction ({out['metric']})")
            ax.set_title("pairwise interactions")
            fig.tight_layout()
            fig.savefig(heatmap_path)
            written.append(Path(heatmap_path))
        finally:
            plt.close(fig)
    return written


def plot_first_order(out: dict[str, Any], path: Path) -> Path | None:
    """Write the heatmap of which assumption matters (each toggle's first-order index rho^2 per drawn figure,
    `draws.first_order`); None without draws."""
    indices = (out.get("draws") or {}).get("first_order")
    if not indices:
        return None
    plt = pyplot()
    players = list(indices)
    figures = sorted({k for by in indices.values() for k in by})
    grid = [[indices[p].get(f, 0.0) for f in figures] for p in players]
    fig, ax = plt.subplots(figsize=(0.55 * len(figures) + 3.5, 0.5 * len(players) + 2.5), dpi=120)
    try:
        image = ax.imshow(grid, cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
        ax.set_xticks(range(len(figures)), figures, rotation=60, ha="right", fontsize=8)
        ax.set_yticks(range(len(players)), players)
        for i, row in enumerate(grid):
            for j, value in enumerate(row):
                ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=7,
                        color="black" if value > 0.5 else "white")
        fig.colorbar(image, ax=ax, label="first-order index rho^2")
        ax.set_title(f"which assumption moves each Shapley value ({out['draws']['complete']} draws)")
        fig.tight_layout()
        fig.savefig(path)
    finally:
        plt.close(fig)
    return Path(path)


def _fmt(value) -> str:
    return "n/a" if value is None else f"{value:.4g}"
