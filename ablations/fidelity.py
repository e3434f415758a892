"""`python -m ablations.fidelity`: the simulator's prediction of the tiny K3 on vLLM-CPU against vLLM-CPU itself.

The cells are the vLLM-CPU main job's (`experiment=main_vllm_cpu`: the first 8 requests of `agentx_small`, every
session starting at once, answers cut to 16 tokens), with the prompts uncut (`VLLM_OVERRIDES`): all off (repeated,
for the run-to-run noise), each wired toggle alone, all on. vLLM-CPU runs each as a fresh in-process engine, every
session live at once, or with `--serve` as a serving cell (`backend.mode=serve`: a fresh server per cell, the
client's closed loop at each of `backend.concurrencies` live sessions over the first 16 requests, each point
compared on its own); a finished cell is kept and reused on the next run, as in a sweep. The simulator replays the
same cut trace for the same toggle vector on `model=k3_tiny`, `hardware=cpu` (the calibrated profile), fp32, one
device, the engine's step budget, sequence limit and cache size. The host's work is fitted, not predicted: per
engine step, per scheduled token, per scheduled request and per scheduled decode or verification
(`host_overhead_us`, `host_us_per_token`, `host_us_per_request`, `host_us_per_decode`), and once in the first step
(`host_first_step_us`), fitted on the steps vLLM-CPU ran in the all-off cells (`fit_host_steps`: each step's
recorded seconds less the simulator's kernel time for what it scheduled, `backends/vllm/steps.py`); every cell's
metrics, all off's included, are predictions.

Reported per cell: the relative error of total throughput, TTFT p50, P90 interactivity and prefix hit rate; per
toggle and metric:
the measured effect against all off, the noise (the all-off repeats' range), and whether the simulator moves the
metric the same way, judged where the measured effect is beyond the noise. With `--paired` every toggle cell runs
between two all-off runs (off, A, off, B, ..., off) and its effect is its relative change against their mean, so
that a machine whose speed drifts slowly moves both alike; the noise is then the largest relative change from one
all-off run to the next (`paired_effects`).
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import OmegaConf

from ablations.__main__ import run as run_cell
from ablations.backends.sim.cell import replay, sim_setup
from ablations.backends.sim.config import SimBackendConfig
from ablations.backends.sim.cost import Seq
from ablations.backends.vllm.cell import first_requests
from ablations.backends.vllm.serve_cell import capped_trace
from ablations.backends.vllm.steps import step_seqs
from ablations.cells import config_hash, finished
from ablations.config import apply_cell, compose_config, players_of, to_app
from ablations.experiment import ALL_OFF, label
from ablations.hardware import HOST_FIGURES, HardwareConfig
from ablations.metrics import RequestRecord, cell_metrics
from ablations.plots import _pyplot
from ablations.workload.config import load_workload

log = logging.getLogger("ablations")
VLLM_EXPERIMENT = "experiment=main_vllm_cpu"
# Prompts uncut: 4,096 tokens hold agentx_small's longest prompt (3,926) and answer, so that a later turn extends its
# previous one as in the trace (cut at main_vllm_cpu's 512 tokens, a later turn would repeat its predecessor's prompt).
VLLM_OVERRIDES = ("backend.max_model_len=4096", "backend.max_prompt_tokens=4080")
# A serving point replays 16 requests, not 8: at 8 (a point at one session 13-16 s) the machine's swings from one
# cell to the next (16-35%) hid every toggle's effect but the prefix hits.
SERVE_OVERRIDES = ("backend.mode=serve", "backend.num_requests=16")
SIM_MODEL = "k3_tiny"
METRICS = ("total_throughput", "ttft_p50_s", "interactivity_p90", "prefix_hit_rate")
Schedule = tuple[tuple[int, int, int], ...]
SIM_NONE = 1e-3    # a simulated effect under 0.1% of all off's value moves nothing: it agrees with no measured move
FITTED = ("fitted by python -m ablations.fidelity on vLLM-CPU's all-off steps: each step's seconds less the "
          "simulator's kernel time for what it scheduled, least squares on [1, tokens, requests scheduled]")


def ran_schedule(result: dict[str, Any]) -> Schedule:
    """The K per batch-size range a vLLM cell's engine ran (`num_speculative_tokens_per_batch_size`: draft_length
    on's pick), or () when it ran one K."""
    spec = result["cell"]["engine_args"].get("speculative_config") or {}
    return tuple(tuple(e) for e in spec.get("num_speculative_tokens_per_batch_size") or ())


def vllm_cells(players: tuple[str, ...], repeats: int, toggle_repeats: int = 1, paired: bool = False
               ) -> list[tuple[str, int]]:
    """(cell label, repeat) of every vLLM cell in run order: each toggle alone and all on, with all off `repeats`
    times spread over the run (first, between, last), so that its range also holds the machine's drift; each
    toggle cell's further repeats (`toggle_repeats` runs each in all, their mean compared) before the last all off.
    `paired`: an all-off run before every toggle run and after the last (`repeats` unused)."""
    others = list(dict.fromkeys([(p, 0) for p in players] + [(label(players, players), 0)]))
    if paired:
        order: list[tuple[str, int]] = []
        for r in range(toggle_repeats):
            for cell, _ in others:
                order += [(ALL_OFF, len(order) // 2), (cell, r)]
        return [*order, (ALL_OFF, len(order) // 2)]
    gaps = max(repeats - 1, 1)
    cells = []
    for r in range(repeats):
        cells.append((ALL_OFF, r))
        cells += others[r * len(others) // gaps:(r + 1) * len(others) // gaps] if r < gaps else []
    return cells[:-1] + [(cell, r) for r in range(1, toggle_repeats) for cell, _ in others] + cells[-1:]


def _cell_config(cell: str, repeat: int, overrides: tuple[str, ...] = ()):
    # ablation.repeats only bounds the repeat: at repeat + 1, a cell's config (and hash) is the same in every run
    # order, so that a longer run (more repeats, --paired) reuses the cells it shares with a shorter one
    cfg = compose_config([VLLM_EXPERIMENT, *VLLM_OVERRIDES, f"ablation.cell={cell}", f"ablation.repeat={repeat}",
                          f"ablation.repeats={repeat + 1}", *overrides])
    return apply_cell(cfg)


def run_vllm_cell(cell: str, repeat: int, root: Path, overrides: tuple[str, ...] = ()) -> dict[str, Any]:
    """The vLLM-CPU cell's result: read back from `root/vllm/<cell>.r<repeat>` when it finished there for the same
    config, else run (an engine start, the replay, the stop) and written there."""
    cfg = _cell_config(cell, repeat, overrides)
    config = OmegaConf.to_container(cfg, resolve=True)
    out_dir = root / "vllm" / f"{cell}.r{repeat}"
    done = finished(out_dir, config_hash(config))
    if done is not None:
        log.info("fidelity: %s (repeat %d) finished before: %s", cell, repeat, out_dir)
        return done
    return run_cell(to_app(cfg), out_dir, config, players_of(cfg))


class SimCells:
    """The simulator's side: the cut trace of the vLLM cells, replayed on k3_tiny for a toggle vector with the
    host overhead given."""

    def __init__(self, overrides: tuple[str, ...] = ()) -> None:
        cfg = _cell_config(ALL_OFF, 0, overrides)
        self.app = to_app(cfg)
        self.players = players_of(cfg)
        vllm = self.app.backend
        # the requests the vLLM cells replay (both modes cut them so)
        self.trace = capped_trace(first_requests(load_workload(self.app.workload), vllm.num_requests),
                                  vllm.max_prompt_tokens, vllm.max_tokens)
        roots = len({r.session for r in self.trace.requests if r.parent_session is None}) or len(self.trace.requests)
        # a serving cell's points, each from an empty cache; an in-process cell replays every session at once
        self.serve = vllm.mode == "serve"
        self.concurrencies = list(vllm.concurrencies) if self.serve else [roots]
        self.backend = SimBackendConfig(tp=1, kv_dtype="fp32", concurrency=self.concurrencies, workers=1,
                                        max_num_batched_tokens=vllm.max_num_batched_tokens,
                                        max_num_seqs=vllm.max_num_seqs, cache_gb=vllm.kv_cache_gib * 2 ** 30 / 1e9,
                                        seed=vllm.seed)
        self.hardware = self.app.hardware
        self.overrides = overrides
        self._setups: dict[tuple[str, Host, Schedule], Any] = {}
        if self.app.workload.start != "zero":
            raise ValueError(f"workload.start: {self.app.workload.start!r}; the simulator starts every session at "
                             "0 (valid: zero)")

    def vector(self, cell: str, schedule: Schedule = ()) -> dict[str, Any]:
        """The toggle configs of cell `cell`; with `schedule`, draft_length on runs that explicit schedule (the one
        the vLLM cell ran) instead of choosing its own."""
        toggles = to_app(_cell_config(cell, 0, self.overrides)).toggles()
        drafts = toggles["draft_length"]
        if schedule and drafts.mode == "on":
            toggles["draft_length"] = replace(drafts, schedule=schedule, max_k=max(1, *(k for *_, k in schedule)))
        return toggles

    def hardware_with(self, host: Host) -> HardwareConfig:
        """The cpu profile with `host`'s overheads, their source the fit."""
        return replace(self.hardware, host_overhead_us=host.per_step_us, host_us_per_token=host.per_token_us,
                       host_us_per_request=host.per_request_us, host_us_per_decode=host.per_decode_us,
                       host_first_step_us=host.first_step_us,
                       sources={**self.hardware.sources, **dict.fromkeys(HOST_FIGURES, FITTED)})

    def metrics(self, cell: str, host: Host, schedule: Schedule = (), concurrency: int | None = None
                ) -> dict[str, float]:
        """The simulated cell's metrics over every request (`ablations.metrics.cell_metrics`) at `concurrency` live
        sessions (default: the first of `concurrencies`); `schedule`: as in `vector`."""
        setup, records = self._replay(cell, host, schedule, concurrency)
        return cell_metrics(records, setup.num_gpus)

    def records(self, cell: str, host: Host, schedule: Schedule = (), concurrency: int | None = None
                ) -> list[RequestRecord]:
        """The simulated cell's per-request records."""
        return self._replay(cell, host, schedule, concurrency)[1]

    def _replay(self, cell: str, host: Host, schedule: Schedule, concurrency: int | None
                ) -> tuple[Any, list[RequestRecord]]:
        key = (cell, host, schedule)      # one setup per vector and host, whatever the concurrency
        if key not in self._setups:
            self._setups[key] = sim_setup(self.backend, SIM_MODEL, self.hardware_with(host),
                                          self.vector(cell, schedule), self.trace)
        setup = self._setups[key]
        concurrency = self.concurrencies[0] if concurrency is None else concurrency
        return setup, replay(setup, self.trace, concurrency, self.backend.seed)[0]

    def kernel_seconds(self) -> Callable[[list[list[int]]], float]:
        """The simulator's time without any host cost (all off's step models) for a step vLLM-CPU recorded: its
        requests as `steps.step_seqs` reads them."""
        setup = sim_setup(self.backend, SIM_MODEL, self.hardware, self.vector(ALL_OFF), self.trace)
        bare = self.hardware_with(Host(0.0))
        models = {k: m.with_host(bare) for k, m in setup.steps.models.items()}

        def seconds(requests: list[list[int]]) -> float:
            drafts = max(r[3] for r in requests)
            model = models.get(drafts, models[max(models)])
            return model.time([Seq(*seq) for seq in step_seqs(requests)])

        return seconds


@dataclass(frozen=True)
class Host:
    """The host's work per engine step, per scheduled token, per scheduled request and per scheduled decode or
    verification, and once in the first step (µs)."""

    per_step_us: float
    per_token_us: float = 0.0
    per_request_us: float = 0.0
    per_decode_us: float = 0.0
    first_step_us: float = 0.0


def _nonnegative_fit(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares of y on the columns of x with every coefficient >= 0: the best fit over the subsets of
    columns whose own least squares is nonnegative (exact; 2^columns subsets, so for a few columns)."""
    best, best_err = np.zeros(x.shape[1]), float(y @ y)
    for mask in range(1, 2 ** x.shape[1]):
        cols = [j for j in range(x.shape[1]) if mask >> j & 1]
        coef = np.linalg.lstsq(x[:, cols], y, rcond=None)[0]
        if (coef < 0).any():
            continue
        left = y - x[:, cols] @ coef
        if float(left @ left) < best_err:
            best, best_err = np.zeros(x.shape[1]), float(left @ left)
            best[cols] = coef
    return best


def _host_row(requests: list[list[int]]) -> list[float]:
    """A recorded step's terms of the host fit: 1, tokens scheduled, requests scheduled, decodes and verifications
    scheduled."""
    decodes = sum(kind != "prefill" for *_, kind in step_seqs(requests))
    return [1.0, sum(r[0] for r in requests), len(requests), decodes]


def fit_host_steps(runs: list[list[dict[str, Any]]], kernel_seconds: Callable[[list[list[int]]], float]
                   ) -> dict[str, Any]:
    """The host overheads from vLLM-CPU's own steps (`steps.read_steps` records of each run): least squares of each
    step's seconds less `kernel_seconds` of what it scheduled, on [1, tokens scheduled, requests scheduled, decodes
    and verifications scheduled], every coefficient >= 0; the cost per step also takes the median gap from one
    step's end to the next one's start (the engine's loop outside the step). A run's first step is left out of the
    fit: it carries the engine's one-time initialisation (seconds on vLLM-CPU), the mean of whose excess over the
    fit is the first-step cost. Returns the Host and what the fit saw: steps, the fraction of the residual's
    variance the fit explains, the mean residual left in steps with and without a prefill chunk."""
    rows, left_s, gaps, firsts = [], [], [], []
    for steps in runs:
        if not steps:
            continue
        head = steps[0]["requests"]
        firsts.append((_host_row(head),
                       steps[0]["end"] - steps[0]["start"] - kernel_seconds(head)))
        for step, after in zip(steps[1:], [*steps[2:], None], strict=True):
            requests = step["requests"]
            rows.append(_host_row(requests))
            left_s.append(step["end"] - step["start"] - kernel_seconds(requests))
            if after is not None and after["start"] >= step["end"]:
                gaps.append(after["start"] - step["end"])
    if len(rows) < 2:
        raise ValueError(f"fidelity: {len(rows)} recorded all-off step(s); the host fit needs 2 or more")
    x, y = np.array(rows), np.array(left_s)
    coef = _nonnegative_fit(x, y)
    left = y - x @ coef
    gap = statistics.median(gaps) if gaps else 0.0
    prefills = x[:, 3] < x[:, 2]                            # fewer decodes than requests: a prefill chunk
    by_kind = {name: left[prefills == flag] for name, flag in (("with_prefill", True),
                                                                        ("decode_only", False))}
    first = max(statistics.mean(s - float(np.dot(coef, r)) for r, s in firsts), 0.0)
    per_step, per_token, per_request, per_decode = coef * 1e6
    spread = float(((y - y.mean()) ** 2).sum())
    return {"host": Host(per_step + gap * 1e6, per_token, per_request, per_decode, first * 1e6), "steps": len(rows),
            "gap_us": gap * 1e6, "first_step_s": first,
            "explained": 1 - float(left @ left) / spread if spread else 1.0,
            "residual_ms": {k: float(v.mean()) * 1e3 if v.size else math.nan for k, v in by_kind.items()}}


def _sign(x: float, noise: float) -> int:
    return 0 if abs(x) <= noise else (1 if x > 0 else -1)


def _relative(x: float, base: float) -> float:
    if base:
        return x / base - 1
    return 0.0 if x == base else math.nan


def by_cell(sequence: list[tuple[str, dict[str, float]]]) -> dict[str, list[dict[str, float]]]:
    """Runs in order as each cell's runs (cells in the order of their first run)."""
    out: dict[str, list[dict[str, float]]] = {}
    for cell, metrics in sequence:
        out.setdefault(cell, []).append(metrics)
    return out


def paired_effects(sequence: list[tuple[str, dict[str, float]]]
                   ) -> tuple[dict[str, dict[str, float]], dict[str, float]]:
    """From vLLM cells in run order, all off alternating with the toggle cells: per toggle cell and metric, the mean
    over its runs of each run's relative change against the mean of the all-off runs either side of it; and per
    metric the noise, the largest relative change from one all-off run to the next (two cells apart, as a toggle
    run's two neighbours are)."""
    effects: dict[str, list[dict[str, float]]] = {}
    for i, (cell, metrics) in enumerate(sequence):
        if cell == ALL_OFF:
            continue
        sides = [sequence[j] for j in (i - 1, i + 1) if 0 <= j < len(sequence)]
        if len(sides) != 2 or any(side != ALL_OFF for side, _ in sides):
            raise ValueError(f"fidelity: {cell} (run {i + 1} of {len(sequence)}) lacks an all-off run on both sides; "
                             "a paired run alternates all off with the toggle cells")
        effects.setdefault(cell, []).append(
            {m: _relative(metrics[m], statistics.mean(s[m] for _, s in sides)) for m in METRICS})
    offs = [metrics for cell, metrics in sequence if cell == ALL_OFF]
    noise = {}
    for m in METRICS:
        steps = [abs(_relative(b[m], a[m])) for a, b in itertools.pairwise(offs)]
        noise[m] = max((x for x in steps if not math.isnan(x)), default=math.nan)
    return {cell: {m: statistics.mean(r[m] for r in runs) for m in METRICS} for cell, runs in effects.items()}, noise


def compare(measured: dict[str, list[dict[str, float]]], predicted: dict[str, dict[str, float]],
            players: tuple[str, ...], sequence: list[tuple[str, dict[str, float]]] | None = None
            ) -> dict[str, Any]:
    """Per cell, the error of each metric; per toggle and metric, the measured and predicted effect against all off,
    the noise (all off's range over its repeats) and whether the directions agree (None: within the noise; a
    simulated effect under SIM_NONE of all off's value is no move, so it agrees with none).
    `sequence` (the runs in order, paired): effects and noise relative, as `paired_effects` gives them."""
    if sequence is None:
        paired = None
        base = {m: statistics.mean(r[m] for r in measured[ALL_OFF]) for m in METRICS}
        noise = {m: max(r[m] for r in measured[ALL_OFF]) - min(r[m] for r in measured[ALL_OFF]) for m in METRICS}
    else:
        paired, noise = paired_effects(sequence)
    cells = []
    for cell, runs in measured.items():
        vllm = {m: statistics.mean(r[m] for r in runs) for m in METRICS}
        sim = predicted[cell]
        cells.append({"cell": cell, "runs": len(runs), "vllm": vllm, "sim": {m: sim[m] for m in METRICS},
                      "vllm_range": {m: [min(r[m] for r in runs), max(r[m] for r in runs)] for m in METRICS},
                      "error": {m: sim[m] / vllm[m] - 1 if vllm[m] else math.nan for m in METRICS}})
    toggles = []
    on_cells = [c for c in measured if c != ALL_OFF]
    for cell in on_cells:
        for m in METRICS:
            if paired is None:
                effect = statistics.mean(r[m] for r in measured[cell]) - base[m]
                sim_effect = predicted[cell][m] - predicted[ALL_OFF][m]
            else:
                effect, sim_effect = paired[cell][m], _relative(predicted[cell][m], predicted[ALL_OFF][m])
            beyond = abs(effect) > noise[m]
            sim_none = SIM_NONE * (1.0 if paired is not None else abs(predicted[ALL_OFF][m]))
            toggles.append({"cell": cell, "metric": m, "vllm_effect": effect, "sim_effect": sim_effect,
                            "noise": noise[m], "beyond_noise": beyond,
                            "agree": (_sign(effect, 0) == _sign(sim_effect, sim_none)) if beyond else None})
    return {"players": list(players), "noise": noise, "cells": cells, "toggles": toggles,
            "relative": paired is not None}


def compare_points(measured: dict[int, dict[str, list[dict[str, float]]]],
                   predicted: dict[int, dict[str, dict[str, float]]], players: tuple[str, ...],
                   sequences: dict[int, list[tuple[str, dict[str, float]]]] | None = None) -> dict[str, Any]:
    """`compare` at each concurrency (keys: live sessions), against that concurrency's own all off and noise; every
    row and the noise carry their concurrency. `sequences`: each concurrency's runs in order (paired)."""
    out: dict[str, Any] = {"players": list(players), "noise": [], "cells": [], "toggles": [],
                           "relative": sequences is not None}
    for concurrency in measured:
        one = compare(measured[concurrency], predicted[concurrency], players,
                      None if sequences is None else sequences[concurrency])
        out["noise"].append({"concurrency": concurrency, **one["noise"]})
        out["cells"] += [{"concurrency": concurrency, **row} for row in one["cells"]]
        out["toggles"] += [{"concurrency": concurrency, **row} for row in one["toggles"]]
    return out


def host_line(host: dict[str, float]) -> str:
    """The fitted host costs in words."""
    return (f"{host['per_step_us']:.0f} us per step, {host['per_token_us']:.0f} us per token, "
            f"{host['per_request_us']:.0f} us per request, {host.get('per_decode_us', 0.0):.0f} us per decode")


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
    plt = _pyplot()
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


def cell_points(result: dict[str, Any], concurrencies: list[int]) -> dict[int, dict[str, float]]:
    """A vLLM cell's metrics per concurrency: a serving cell's points (in `concurrencies`' order), an in-process
    cell's one replay at the only concurrency."""
    cell = result["cell"]
    if cell.get("mode") != "serve":
        return {concurrencies[0]: result["metrics"]}
    points = {p["concurrency"]: p["metrics"] for p in cell["point_details"]}
    if list(points) != concurrencies:
        raise ValueError(f"fidelity: a serving cell ran concurrencies {list(points)}; expected {concurrencies}")
    return points


def predict(sim: SimCells, host: Host, cells: dict[int, list[str]], schedules: dict[str, Schedule]
            ) -> dict[int, dict[str, dict[str, float]]]:
    """The simulator's metrics of `cells[concurrency]` at each concurrency, in `sim.concurrencies`' order; the host's
    first-step cost goes to the first only (a server that is not warmed up, backend.warmup_requests=0, pays its
    one-time start-up there)."""
    return {c: {cell: sim.metrics(cell, host if i == 0 else replace(host, first_step_us=0.0), schedules.get(cell, ()),
                                  c)
                for cell in cells[c]}
            for i, c in enumerate(sim.concurrencies)}


def run(root: Path, repeats: int = 3, overrides: tuple[str, ...] = (),
        progress: Callable[[str], None] | None = print, toggle_repeats: int = 1, paired: bool = False
        ) -> dict[str, Any]:
    """Every vLLM cell (kept under `root/vllm`), the simulator's prediction of each at each concurrency, the
    comparison (`paired`: as `vllm_cells` and `paired_effects` say); writes `root/fidelity.json` and
    `root/fidelity.png` and returns the comparison."""
    say = progress or (lambda _line: None)
    sim = SimCells(overrides)
    wanted = vllm_cells(sim.players, repeats, toggle_repeats, paired)
    sequences: dict[int, list[tuple[str, dict[str, float]]]] = {c: [] for c in sim.concurrencies}
    schedules: dict[str, Schedule] = {}
    off_steps: list[list[dict[str, Any]]] = []
    for n, (cell, repeat) in enumerate(wanted, 1):
        start = time.perf_counter()
        result = run_vllm_cell(cell, repeat, root, overrides)
        points = cell_points(result, sim.concurrencies)
        for concurrency, metrics in points.items():
            sequences[concurrency].append((cell, {m: metrics[m] for m in METRICS}))
        schedules[cell] = ran_schedule(result)
        if cell == ALL_OFF:
            if not result["cell"].get("steps"):
                raise ValueError(f"fidelity: {root / 'vllm' / f'{cell}.r{repeat}'}: no recorded steps (a cell run "
                                 "before steps were recorded); move it aside to run it again")
            off_steps.append(result["cell"]["steps"])
        say(f"[{n}/{len(wanted)} vLLM cells] {cell} (repeat {repeat}): "
            + ", ".join(f"{m['total_throughput']:.1f} tokens/s at {c} live" for c, m in points.items())
            + f" ({time.perf_counter() - start:.0f} s)")
    fitted = fit_host_steps(off_steps, sim.kernel_seconds())
    host = fitted["host"]
    say(f"host fitted on all off steps: {host_line(asdict(host))}")
    measured = {c: by_cell(sequence) for c, sequence in sequences.items()}
    predicted = predict(sim, host, {c: list(cells) for c, cells in measured.items()}, schedules)
    out = {"host": asdict(host), "host_fit": {k: v for k, v in fitted.items() if k != "host"},
           "hardware": asdict(sim.hardware_with(host)), "mode": sim.app.backend.mode,
           "trace_requests": len(sim.trace.requests), "order": [list(w) for w in wanted],
           **compare_points(measured, predicted, sim.players, sequences if paired else None)}
    root.mkdir(parents=True, exist_ok=True)
    (root / "fidelity.json").write_text(json.dumps(out, indent=1) + "\n")
    plot(out, root / "fidelity.png")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ablations.fidelity", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None,
                        help="folder (default: outputs/fidelity, outputs/fidelity_serve with --serve)")
    parser.add_argument("--repeats", type=int, default=3, help="all-off repeats, the noise (default: 3)")
    parser.add_argument("--toggle-repeats", type=int, default=1,
                        help="runs of each toggle cell, their mean compared (default: 1)")
    parser.add_argument("--paired", action="store_true",
                        help="an all-off run before every toggle run and after the last, each toggle judged against "
                             "the two beside it (relative changes); --repeats unused (default folders: "
                             "outputs/fidelity_paired, outputs/fidelity_serve_paired)")
    parser.add_argument("--serve", action="store_true",
                        help="serving cells (backend.mode=serve: a server per cell, the client's closed loop at each "
                             "of backend.concurrencies over the first 16 requests) instead of in-process replays")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for every vLLM cell, e.g. backend.num_requests=4")
    args = parser.parse_args(argv)
    args.out = args.out or Path("outputs/fidelity" + ("_serve" if args.serve else "") + ("_paired" if args.paired
                                                                                        else ""))
    logging.basicConfig(level=logging.WARNING)
    try:
        if args.repeats < 2:
            raise ValueError(f"--repeats: {args.repeats}; valid: 2 or more (the noise is their range)")
        if args.toggle_repeats < 1:
            raise ValueError(f"--toggle-repeats: {args.toggle_repeats}; valid: 1 or more")
        out = run(args.out, args.repeats, (*(SERVE_OVERRIDES if args.serve else ()), *args.overrides),
                  progress=lambda line: print(line, file=sys.stderr, flush=True), toggle_repeats=args.toggle_repeats,
                  paired=args.paired)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(table(out))
    print(f"written: {args.out / 'fidelity.json'}, {args.out / 'fidelity.png'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
