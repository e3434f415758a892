"""The hit rate against capacity plot of one sweep (matplotlib, Agg: no display needed)."""

from __future__ import annotations

from pathlib import Path

from opts.cache_retention.bench.sweep import SweepResult

STYLE = {"off": ("tab:gray", "o", "-"), "evict": ("tab:blue", "s", "-"), "resume": ("tab:orange", "^", "-"),
         "on": ("tab:green", "D", "-"), "belady": ("tab:purple", "x", "--")}


def plot_sweep(result: SweepResult, path: str | Path) -> Path:
    """Write `result`'s hit rate per policy against capacity (fraction of the working set; GB on the top axis),
    the unbounded cache as a horizontal line, to the PNG `path`; returns the path."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    path = Path(path)
    working_gb = result.working_set_blocks * result.block_bytes / 1e9
    fig, ax = plt.subplots(figsize=(7.5, 4.8), dpi=120)
    try:
        for policy in result.policies:
            points = [(f, h) for f, h in zip(result.fractions, result.hit_rates(policy), strict=True) if h is not None]
            if points:
                color, marker, line = STYLE[policy]
                ax.plot(*zip(*points, strict=True), marker=marker, linestyle=line, color=color, label=policy)
        ax.axhline(result.unbounded["hit_rate"], color="black", linestyle=":",
                   label=f"unbounded ({result.unbounded['hit_rate']:.3f})")
        infeasible = [f for f in result.fractions if not result.row(result.policies[0], f)["feasible"]]
        if infeasible:
            ax.axvspan(0, max(infeasible), color="tab:red", alpha=0.08, label="infeasible")
        ax.set_xlim(0, max(result.fractions) * 1.03)
        ax.set_ylim(0, 1.02)
        ax.set_xlabel(f"capacity, fraction of the working set ({result.working_set_blocks} blocks, "
                      f"{working_gb:.1f} GB)")
        ax.set_ylabel("hit rate (prompt tokens from cache / prompt tokens)")
        ax.set_title(f"{result.scenario} at {result.geometry}: {result.num_requests} requests")
        top = ax.secondary_xaxis("top", functions=(lambda f: f * working_gb, lambda gb: gb / working_gb))
        top.set_xlabel("capacity, GB")
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right", fontsize="small")
        fig.tight_layout()
        fig.savefig(path)
    finally:
        plt.close(fig)
    return path
