"""`python -m ablations.fidelity`: the simulator's prediction of the tiny K3 on vLLM-CPU against vLLM-CPU itself.

The cells are the vLLM-CPU main job's (`experiment=main_vllm_cpu`: the first 8 requests of `agentx_small`, every
session starting at once, answers cut to 16 tokens), with the prompts uncut (`VLLM_OVERRIDES`): all off (repeated,
for the run-to-run noise),
each wired toggle alone, all on. vLLM-CPU runs each as a fresh in-process engine (a finished cell is kept and
reused on the next run, as in a sweep); the simulator replays the same cut trace for the same toggle vector on
`model=k3_tiny`, `hardware=cpu` (the calibrated profile), fp32, one device, the engine's step budget, sequence
limit and cache size. Two numbers are fitted, not predicted: the host's work per engine step and per scheduled
token (`host_overhead_us`, `host_us_per_token`), fitted on the steps vLLM-CPU ran in the all-off cells
(`fit_host_steps`: each step's recorded seconds less the simulator's kernel time for what it scheduled,
`backends/vllm/steps.py`); every cell's metrics, all off's included, are predictions. Cells run before steps were
recorded fall back to `fit_host`: the host at which the simulated all off meets the measured mean total
throughput and P90 interactivity.

Reported per cell: the relative error of total throughput, TTFT p50, P90 interactivity and prefix hit rate; per
toggle and metric:
the measured effect against all off, the noise (the all-off repeats' range), and whether the simulator moves the
metric the same way, judged where the measured effect is beyond the noise.
"""

from __future__ import annotations

import argparse
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

from omegaconf import OmegaConf

from ablations.__main__ import run as run_cell
from ablations.backends.sim.cell import replay, run_point, sim_setup
from ablations.backends.sim.config import SimBackendConfig
from ablations.backends.sim.cost import Seq
from ablations.backends.sim.step_model import DraftSteps
from ablations.backends.vllm.cell import first_requests
from ablations.backends.vllm.steps import step_seqs
from ablations.cells import config_hash, finished
from ablations.config import apply_cell, compose_config, players_of, to_app
from ablations.experiment import ALL_OFF, label
from ablations.hardware import HardwareConfig
from ablations.metrics import RequestRecord, cell_metrics
from ablations.plots import _pyplot
from ablations.workload.config import load_workload
from ablations.workload.trace import Trace

log = logging.getLogger("ablations")
VLLM_EXPERIMENT = "experiment=main_vllm_cpu"
# Prompts uncut: 4,096 tokens hold agentx_small's longest prompt (3,926) and answer, so that a later turn extends its
# previous one as in the trace (cut at main_vllm_cpu's 512 tokens, a later turn would repeat its predecessor's prompt).
VLLM_OVERRIDES = ("backend.max_model_len=4096", "backend.max_prompt_tokens=4080")
SIM_MODEL = "k3_tiny"
METRICS = ("total_throughput", "ttft_p50_s", "interactivity_p90", "prefix_hit_rate")
GOAL = 0.10                          # the throughput error per cell the simulator aims at
HOST_RANGE_US = (0.0, 1e6)
Schedule = tuple[tuple[int, int, int], ...]
FITTED = ("fitted by python -m ablations.fidelity: k3_tiny's simulated all off meets vLLM-CPU's throughput and P90 "
          "interactivity")
FITTED_STEPS = ("fitted by python -m ablations.fidelity on vLLM-CPU's all-off steps: each step's seconds less the "
                "simulator's kernel time for what it scheduled, least squares on [1, tokens scheduled]")


def ran_schedule(result: dict[str, Any]) -> Schedule:
    """The K per batch-size range a vLLM cell's engine ran (`num_speculative_tokens_per_batch_size`: draft_length
    on's pick), or () when it ran one K."""
    spec = result["cell"]["engine_args"].get("speculative_config") or {}
    return tuple(tuple(e) for e in spec.get("num_speculative_tokens_per_batch_size") or ())


def cut_trace(trace: Trace, num_requests: int, max_prompt_tokens: int, max_tokens: int) -> Trace:
    """The trace the vLLM cell replays: its first `num_requests` requests, each prompt cut to `max_prompt_tokens`
    (its blocks with it) and each answer to `max_tokens`."""
    cut = first_requests(trace, num_requests)
    requests = []
    for r in cut.requests:
        prompt = min(r.input_length, max_prompt_tokens)
        requests.append(replace(r, input_length=prompt, output_length=min(r.output_length, max_tokens),
                                hash_ids=r.hash_ids[:-(-prompt // cut.block_size)]))
    return Trace(tuple(requests), cut.block_size, cut.source)


def vllm_cells(players: tuple[str, ...], repeats: int) -> list[tuple[str, int]]:
    """(cell label, repeat) of every vLLM cell in run order: each toggle alone and all on, with all off `repeats`
    times spread over the run (first, between, last), so that its range also holds the machine's drift."""
    others = list(dict.fromkeys([(p, 0) for p in players] + [(label(players, players), 0)]))
    gaps = max(repeats - 1, 1)
    cells = []
    for r in range(repeats):
        cells.append((ALL_OFF, r))
        cells += others[r * len(others) // gaps:(r + 1) * len(others) // gaps] if r < gaps else []
    return cells


def _cell_config(cell: str, repeat: int, overrides: tuple[str, ...] = (), repeats: int = 1):
    cfg = compose_config([VLLM_EXPERIMENT, *VLLM_OVERRIDES, f"ablation.cell={cell}", f"ablation.repeat={repeat}",
                          f"ablation.repeats={max(repeats, repeat + 1)}", *overrides])
    return apply_cell(cfg)


def run_vllm_cell(cell: str, repeat: int, root: Path, overrides: tuple[str, ...] = (), repeats: int = 1
                  ) -> dict[str, Any]:
    """The vLLM-CPU cell's result: read back from `root/vllm/<cell>.r<repeat>` when it finished there for the same
    config, else run (an engine start, the replay, the stop) and written there."""
    cfg = _cell_config(cell, repeat, overrides, repeats)
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
        self.trace = cut_trace(load_workload(self.app.workload), vllm.num_requests, vllm.max_prompt_tokens,
                               vllm.max_tokens)
        roots = len({r.session for r in self.trace.requests if r.parent_session is None}) or len(self.trace.requests)
        self.backend = SimBackendConfig(tp=1, kv_dtype="fp32", concurrency=[roots], workers=1,
                                        max_num_batched_tokens=vllm.max_num_batched_tokens,
                                        max_num_seqs=vllm.max_num_seqs, cache_gb=vllm.kv_cache_gib * 2 ** 30 / 1e9,
                                        seed=vllm.seed)
        self.hardware = self.app.hardware
        self.overrides = overrides
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

    def hardware_with(self, host: Host, source: str = FITTED) -> HardwareConfig:
        """The cpu profile with `host`'s overheads, their source the fit."""
        fitted = ("host_overhead_us", "host_us_per_token", "host_first_step_us")
        return replace(self.hardware, host_overhead_us=host.per_step_us, host_us_per_token=host.per_token_us,
                       host_first_step_us=host.first_step_us,
                       sources={**self.hardware.sources, **dict.fromkeys(fitted, source)})

    def metrics(self, cell: str, host: Host, schedule: Schedule = ()) -> dict[str, float]:
        """The simulated cell's metrics over every request (`ablations.metrics.cell_metrics`); `schedule`: as in
        `vector`."""
        setup, records = self._replay(cell, host, schedule)
        return cell_metrics(records, setup.num_gpus)

    def records(self, cell: str, host: Host, schedule: Schedule = ()) -> list[RequestRecord]:
        """The simulated cell's per-request records."""
        return self._replay(cell, host, schedule)[1]

    def _replay(self, cell: str, host: Host, schedule: Schedule) -> tuple[Any, list[RequestRecord]]:
        setup = sim_setup(self.backend, SIM_MODEL, self.hardware_with(host), self.vector(cell, schedule), self.trace)
        return setup, replay(setup, self.trace, self.backend.concurrency[0], self.backend.seed)[0]

    def kernel_seconds(self) -> Callable[[list[list[int]]], float]:
        """The simulator's time without any host cost (all off's step models) for a step vLLM-CPU recorded: its
        requests as `steps.step_seqs` reads them."""
        setup = sim_setup(self.backend, SIM_MODEL, self.hardware, self.vector(ALL_OFF), self.trace)
        bare = self.hardware_with(Host(0.0, 0.0))
        models = {k: m.with_host(bare) for k, m in setup.steps.models.items()}

        def seconds(requests: list[list[int]]) -> float:
            drafts = max(r[3] for r in requests)
            model = models.get(drafts, models[max(models)])
            return model.time([Seq(*seq) for seq in step_seqs(requests)])

        return seconds

    def all_off(self) -> Callable[[Host], dict[str, float]]:
        """`metrics` of all off for any host overheads, its step models built once (all off's draft length is
        fixed: no choice depends on the host)."""
        setup = sim_setup(self.backend, SIM_MODEL, self.hardware, self.vector(ALL_OFF), self.trace)

        def metrics(host: Host) -> dict[str, float]:
            hw = self.hardware_with(host)
            steps = DraftSteps({k: m.with_host(hw) for k, m in setup.steps.models.items()}, setup.steps.schedule)
            hosted = replace(setup, steps=steps, hardware=hw)
            return run_point(hosted, self.trace, self.backend.concurrency[0], self.backend.seed)["metrics"]

        return metrics


@dataclass(frozen=True)
class Host:
    """The host's work per engine step and per scheduled token, and once in the first step (µs); `matched`: whether
    the fit met its targets."""

    per_step_us: float
    per_token_us: float = 0.0
    matched: bool = True
    first_step_us: float = 0.0


def _bisect(f: Callable[[float], float], lo: float, hi: float, iterations: int = 30) -> float:
    """The root of `f` (above 0 at lo, below at hi) in [lo, hi]."""
    for _ in range(iterations):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if f(mid) > 0 else (lo, mid)
    return (lo + hi) / 2


def fit_host(metrics: Callable[[Host], dict[str, float]], throughput: float, interactivity: float) -> Host:
    """The host overheads at which all off's simulated total throughput is `throughput` and its P90 interactivity
    `interactivity`: for each cost per token, the cost per step that meets the throughput (bisection); among
    those, the cost per token that meets the interactivity (bisection: a dearer token and a cheaper step make the
    small decode steps faster). Where no cost per token meets the interactivity, the nearer end, `matched` False;
    a throughput no host cost gives is a ValueError naming both."""
    def tput(step_us: float, token_us: float) -> float:
        return metrics(Host(step_us, token_us))["total_throughput"]

    lo, hi = HOST_RANGE_US
    fastest, slowest = tput(lo, 0.0), tput(hi, 0.0)
    if not slowest <= throughput <= fastest:
        raise ValueError(f"fidelity: measured all-off throughput {throughput:.1f} tokens/s is outside what the "
                         f"simulator gives for a host overhead of {lo:g}-{hi:g} us per step "
                         f"({slowest:.1f}-{fastest:.1f})")
    token_max = _bisect(lambda b: tput(0.0, b) - throughput, 0.0, hi)

    def hosted(token_us: float) -> Host:
        return Host(_bisect(lambda a: tput(a, token_us) - throughput, 0.0, hi), token_us)

    def gap(host: Host) -> float:
        return metrics(host)["interactivity_p90"] - interactivity

    ends = (hosted(0.0), Host(0.0, token_max))
    low, high = gap(ends[0]), gap(ends[1])
    if (low > 0) == (high > 0):
        return replace(ends[0] if abs(low) <= abs(high) else ends[1], matched=False)
    sign = 1 if high > 0 else -1
    return hosted(_bisect(lambda b: -sign * gap(hosted(b)), 0.0, token_max, iterations=20))


def fit_host_steps(runs: list[list[dict[str, Any]]], kernel_seconds: Callable[[list[list[int]]], float]
                   ) -> dict[str, Any]:
    """The host overheads from vLLM-CPU's own steps (`steps.read_steps` records of each run): least squares of each
    step's seconds less `kernel_seconds` of what it scheduled, on [1, tokens scheduled], a negative coefficient
    clipped to 0 and the other refitted; the cost per step also takes the median gap from one step's end to the
    next one's start (the engine's loop outside the step). A run's first step is left out of the fit: it carries
    the engine's one-time initialisation (seconds on vLLM-CPU), the mean of whose excess over the fit is the
    first-step cost. Returns the Host and what the fit saw: steps, the fraction of the residual's variance the fit
    explains, the mean residual left in steps with and without a prefill chunk."""
    rows, gaps, firsts = [], [], []
    for steps in runs:
        if not steps:
            continue
        firsts.append((sum(r[0] for r in steps[0]["requests"]),
                       steps[0]["end"] - steps[0]["start"] - kernel_seconds(steps[0]["requests"])))
        for step, after in zip(steps[1:], [*steps[2:], None], strict=True):
            tokens = sum(r[0] for r in step["requests"])
            prefill = any(kind == "prefill" for _, _, kind in step_seqs(step["requests"]))
            rows.append((tokens, step["end"] - step["start"] - kernel_seconds(step["requests"]), prefill))
            if after is not None and after["start"] >= step["end"]:
                gaps.append(after["start"] - step["end"])
    if len(rows) < 2:
        raise ValueError(f"fidelity: {len(rows)} recorded all-off step(s); the host fit needs 2 or more")
    x = [r[0] for r in rows]
    y = [r[1] for r in rows]
    mx, my = statistics.mean(x), statistics.mean(y)
    sxx = sum((a - mx) ** 2 for a in x)
    b = sum((a - mx) * (c - my) for a, c in zip(x, y, strict=True)) / sxx if sxx else 0.0
    a = my - b * mx
    if b < 0:
        a, b = my, 0.0
    elif a < 0:
        a, b = 0.0, sum(p * q for p, q in zip(x, y, strict=True)) / sum(p * p for p in x)
    left = [c - a - b * p for p, c in zip(x, y, strict=True)]
    syy = sum((c - my) ** 2 for c in y)
    gap = statistics.median(gaps) if gaps else 0.0
    by_kind = {name: [res for res, r in zip(left, rows, strict=True) if r[2] == flag]
               for name, flag in (("with_prefill", True), ("decode_only", False))}
    first = max(statistics.mean(left_s - a - b * tokens for tokens, left_s in firsts), 0.0)
    return {"host": Host((a + gap) * 1e6, b * 1e6, first_step_us=first * 1e6), "steps": len(rows),
            "gap_us": gap * 1e6, "first_step_s": first,
            "explained": 1 - sum(v * v for v in left) / syy if syy else 1.0,
            "residual_ms": {k: statistics.mean(v) * 1e3 if v else math.nan for k, v in by_kind.items()}}


def _sign(x: float, noise: float) -> int:
    return 0 if abs(x) <= noise else (1 if x > 0 else -1)


def compare(measured: dict[str, list[dict[str, float]]], predicted: dict[str, dict[str, float]],
            players: tuple[str, ...]) -> dict[str, Any]:
    """Per cell, the error of each metric; per toggle and metric, the measured and predicted effect against all off,
    the noise (all off's range over its repeats) and whether the directions agree (None: within the noise)."""
    base = {m: statistics.mean(r[m] for r in measured[ALL_OFF]) for m in METRICS}
    noise = {m: max(r[m] for r in measured[ALL_OFF]) - min(r[m] for r in measured[ALL_OFF]) for m in METRICS}
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
            effect = statistics.mean(r[m] for r in measured[cell]) - base[m]
            sim_effect = predicted[cell][m] - predicted[ALL_OFF][m]
            beyond = abs(effect) > noise[m]
            toggles.append({"cell": cell, "metric": m, "vllm_effect": effect, "sim_effect": sim_effect,
                            "noise": noise[m], "beyond_noise": beyond,
                            "agree": (_sign(effect, 0) == _sign(sim_effect, 0)) if beyond else None})
    return {"players": list(players), "noise": noise, "cells": cells, "toggles": toggles}


def _short(cell: str) -> str:
    return "all_on" if cell.count("+") > 1 else cell


def table(out: dict[str, Any]) -> str:
    """The comparison as text: a row per cell, then a row per toggle and metric."""
    host, fit = out["host"], out.get("host_fit") or {}
    lines = [f"host fitted on all off: {host['per_step_us']:.0f} us per step, {host['per_token_us']:.0f} us per "
             f"token{'' if host['matched'] else ' (interactivity not met)'}"]
    if fit:
        left = fit["residual_ms"]
        lines.append(f"  on {fit['steps']} recorded steps (gap between steps {fit['gap_us']:.0f} us): explains "
                     f"{fit['explained']:.0%} of their variance; mean residual {left['with_prefill']:.1f} ms in steps "
                     f"with a prefill chunk, {left['decode_only']:.1f} ms in the others")
    lines += [f"{'cell':<40}{'tokens/s vLLM':>14}{'sim':>9}{'err':>8}{'TTFT p50 vLLM':>15}{'sim':>8}{'err':>8}"
             f"{'P90 tok/s/user':>16}{'sim':>8}{'err':>8}{'hit rate':>10}{'sim':>7}"]
    for c in out["cells"]:
        v, s, e = c["vllm"], c["sim"], c["error"]
        name = f"{c['cell']} (mean of {c['runs']})" if c["runs"] > 1 else c["cell"]
        lines.append(f"{_short(name):<40}"
                     f"{v['total_throughput']:>14.1f}{s['total_throughput']:>9.1f}{e['total_throughput']:>8.1%}"
                     f"{v['ttft_p50_s']:>15.3f}{s['ttft_p50_s']:>8.3f}{e['ttft_p50_s']:>8.1%}"
                     f"{v['interactivity_p90']:>16.2f}{s['interactivity_p90']:>8.2f}{e['interactivity_p90']:>8.1%}"
                     f"{v['prefix_hit_rate']:>10.3f}{s['prefix_hit_rate']:>7.3f}")
    lines.append(f"{'toggle cell':<40}{'metric':<20}{'vLLM effect':>12}{'noise':>10}{'sim effect':>12}  direction")
    for t in out["toggles"]:
        verdict = "within noise" if t["agree"] is None else ("agrees" if t["agree"] else "DISAGREES")
        lines.append(f"{_short(t['cell']):<40}{t['metric']:<20}{t['vllm_effect']:>12.3g}{t['noise']:>10.3g}"
                     f"{t['sim_effect']:>12.3g}  {verdict}")
    return "\n".join(lines)


def plot(out: dict[str, Any], path: Path) -> Path:
    """Measured against predicted total throughput per cell, as paired bars."""
    plt = _pyplot()
    cells = out["cells"]
    fig, ax = plt.subplots(figsize=(7.5, 4.2), dpi=120)
    try:
        xs = range(len(cells))
        mean = [c["vllm"]["total_throughput"] for c in cells]
        low, high = zip(*(c["vllm_range"]["total_throughput"] for c in cells), strict=True)
        ax.bar([x - 0.2 for x in xs], mean, 0.4, label="vLLM-CPU (all off: mean, range of its repeats)",
               yerr=[[m - lo for m, lo in zip(mean, low, strict=True)], [hi - m for m, hi in zip(mean, high,
                                                                                                  strict=True)]],
               capsize=3)
        ax.bar([x + 0.2 for x in xs], [c["sim"]["total_throughput"] for c in cells], 0.4, label="simulator")
        ax.set_xticks(list(xs), [c["cell"].replace("+", "+\n") for c in cells], fontsize=6)
        ax.set_ylabel("total throughput (tokens/s)")
        host = out["host"]
        ax.set_title(f"k3_tiny on vLLM-CPU vs the simulator (host fitted on all off: {host['per_step_us']:.0f} us "
                     f"per step, {host['per_token_us']:.0f} us per token)", fontsize=8)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(path)
    finally:
        plt.close(fig)
    return Path(path)


def run(root: Path, repeats: int = 3, overrides: tuple[str, ...] = (),
        progress: Callable[[str], None] | None = print) -> dict[str, Any]:
    """Every vLLM cell (kept under `root/vllm`), the simulator's prediction of each, the comparison; writes
    `root/fidelity.json` and `root/fidelity.png` and returns the comparison."""
    say = progress or (lambda _line: None)
    sim = SimCells(overrides)
    wanted = vllm_cells(sim.players, repeats)
    measured: dict[str, list[dict[str, float]]] = {}
    schedules: dict[str, Schedule] = {}
    off_steps: list[list[dict[str, Any]]] = []
    for k, (cell, repeat) in enumerate(wanted, 1):
        start = time.perf_counter()
        result = run_vllm_cell(cell, repeat, root, overrides, repeats)
        measured.setdefault(cell, []).append({m: result["metrics"][m] for m in METRICS})
        schedules[cell] = ran_schedule(result)
        if cell == ALL_OFF:
            off_steps.append(result["cell"].get("steps", []))
        say(f"[{k}/{len(wanted)} vLLM cells] {cell} (repeat {repeat}): "
            f"{result['metrics']['total_throughput']:.1f} tokens/s ({time.perf_counter() - start:.0f} s)")
    target = {m: statistics.mean(r[m] for r in measured[ALL_OFF]) for m in METRICS}
    if all(off_steps):
        fitted = fit_host_steps(off_steps, sim.kernel_seconds())
        host = fitted["host"]
    else:                                 # cells run before steps were recorded: fit on all off's metrics
        fitted, host = {}, fit_host(sim.all_off(), target["total_throughput"], target["interactivity_p90"])
    unmet = "" if host.matched else " (the interactivity not met: the nearer end)"
    say(f"host fitted on all off{' steps' if fitted else ''}: {host.per_step_us:.0f} us per step, "
        f"{host.per_token_us:.0f} us per token{unmet}")
    predicted = {cell: sim.metrics(cell, host, schedules[cell]) for cell in measured}
    out = {"host": asdict(host), "host_fit": {k: v for k, v in fitted.items() if k != "host"},
           "hardware": asdict(sim.hardware_with(host, FITTED_STEPS if fitted else FITTED)),
           "trace_requests": len(sim.trace.requests), **compare(measured, predicted, sim.players)}
    root.mkdir(parents=True, exist_ok=True)
    (root / "fidelity.json").write_text(json.dumps(out, indent=1) + "\n")
    plot(out, root / "fidelity.png")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ablations.fidelity", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("outputs/fidelity"), help="folder (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=3, help="all-off repeats, the noise (default: 3)")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for every vLLM cell, e.g. backend.num_requests=4")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    try:
        if args.repeats < 2:
            raise ValueError(f"--repeats: {args.repeats}; valid: 2 or more (the noise is their range)")
        out = run(args.out, args.repeats, tuple(args.overrides),
                  progress=lambda line: print(line, file=sys.stderr, flush=True))
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(table(out))
    print(f"written: {args.out / 'fidelity.json'}, {args.out / 'fidelity.png'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
