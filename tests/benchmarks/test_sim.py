"""The simulator under pytest-benchmark: `agentx` (4,622 requests) at one concurrency (goal: under 3 s) and the
default sweep (every concurrency), its points on every core (goal: under 20 s), Kimi K3 on MI355X with every toggle off.
Times go to `extra_info` and the simulator's README, never into an assertion."""

from __future__ import annotations

import time

import pytest

from ablations.backends.sim.cell import run_point, run_sim_cell, sim_setup
from ablations.backends.sim.config import SimBackendConfig
from ablations.backends.sim.engine import simulate, trace_keys
from ablations.config import compose_app
from ablations.workload import load_workload

CONCURRENCY = 4


def agentx_app():
    return compose_app(["backend=sim", "model=kimi_k3", "hardware=mi355x_x8", "workload=agentx"])


@pytest.mark.slow
def test_agentx_at_one_concurrency(benchmark) -> None:
    app = agentx_app()
    trace = load_workload(app.workload)
    setup = sim_setup(app.backend, app.model.name, app.hardware, app.toggles())
    benchmark.group = "sim"
    point = benchmark.pedantic(lambda: run_point(setup, trace, CONCURRENCY, 0), rounds=1, iterations=1)
    benchmark.extra_info.update({"case": f"agentx_c{CONCURRENCY}", "requests": len(trace.requests),
                                 "wall_s": point["wall_s"], "simulated_s": point["simulated_s"],
                                 "steps": point["engine"]["num_steps"]})
    assert len(trace.requests) > 4000 and point["engine"]["num_steps"] > 100_000


@pytest.mark.heavy
def test_agentx_default_sweep(benchmark) -> None:
    """A default cell's whole sweep (every concurrency of SimBackendConfig)."""
    app = agentx_app()
    trace = load_workload(app.workload)
    start = time.perf_counter()
    benchmark.group = "sim"
    cell = benchmark.pedantic(lambda: run_sim_cell(app.backend, app.model.name, app.hardware, app.toggles(), trace),
                              rounds=1, iterations=1)
    benchmark.extra_info.update({"case": f"agentx_{len(app.backend.concurrency)}_points",
                                 "wall_s": time.perf_counter() - start,
                                 "tput_per_gpu_at_slo": cell["slo"]["tput_per_gpu"]})
    assert len(cell["points"]) == len(app.backend.concurrency) == len(SimBackendConfig().concurrency)


@pytest.mark.heavy
def test_a_default_cell_point_in_stretches_against_step_by_step(benchmark) -> None:
    """The default cell's (`make run`, all off) first point, concurrency 6, CPU seconds with the stretches and
    step by step (the engine before them): the same records, the speed-up in `extra_info`."""
    app = compose_app(["experiment=main"])
    trace = load_workload(app.workload)
    setup = sim_setup(app.backend, app.model.name, app.hardware, app.toggles(), trace)
    keys = trace_keys(trace, setup.geometry.block_size)

    def replay(stretches: bool):
        start = time.process_time()
        out = simulate(trace, setup.steps, setup.geometry, setup.num_blocks, setup.free_list(), resume=setup.resume,
                       alphas=setup.alphas, scheduler=setup.scheduler, concurrency=app.backend.bracket_from,
                       seed=app.backend.seed, keys=keys, stretches=stretches)
        return out, time.process_time() - start

    benchmark.group = "sim"
    (fast, fast_stats), fast_s = benchmark.pedantic(lambda: replay(True), rounds=1, iterations=1)
    (slow, slow_stats), slow_s = replay(False)
    benchmark.extra_info.update({"case": f"main_all_off_c{app.backend.bracket_from}", "stretch_cpu_s": fast_s,
                                 "step_by_step_cpu_s": slow_s, "speedup": slow_s / fast_s,
                                 "steps": fast_stats.num_steps, "stretch_steps": fast_stats.num_stretch_steps,
                                 "iterations": fast_stats.num_iterations})
    assert fast_stats.num_steps == slow_stats.num_steps and len(fast) == len(slow)
    for a, b in zip(fast, slow, strict=True):      # a stretch sums its durations at once: equal to the last bits
        assert (a.input_tokens, a.output_tokens, a.cached_tokens) == (b.input_tokens, b.output_tokens, b.cached_tokens)
        for name in ("arrival_s", "first_token_s", "finish_s"):
            assert getattr(a, name) == pytest.approx(getattr(b, name), rel=1e-9)
