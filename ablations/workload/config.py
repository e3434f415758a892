"""The `workload` Hydra group's typed schema, and turning one of its nodes into a trace and a schedule."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from ablations.workload.fixed import FixedLengths, fixed_trace
from ablations.workload.generate import GeneratorConfig, LogNormal, generate
from ablations.workload.io import read_trace
from ablations.workload.paths import file_problem, resolve_path
from ablations.workload.presets import PRESETS, preset
from ablations.workload.schedule import START_MODES, ClosedLoopSchedule, OpenLoopSchedule, Schedule
from ablations.workload.trace import Trace
from opts.base import check_known_fields

SCHEDULES = ("closed", "open")
SCHEMA_NAME = "workload_schema"


@dataclass
class WorkloadConfig:
    """One workload: a generated preset (`preset`), a trace file (`path`) or fixed lengths (`fixed`: a mapping of
    `FixedLengths`' input_length, output_length, num_requests and optionally block_size: InferenceX's random
    prompts, each request its own session), and how to replay it.

    `path` is absolute, relative to the working directory, or `pkg://<package>/<file>` (the vendored traces:
    `pkg://ablations.workload/traces/<name>.jsonl.gz`, which resolves from any working directory).
    `generator` overrides fields of the preset's GeneratorConfig (a log-normal field takes a mapping of
    median/sigma/low/high). `num_sessions` keeps the first N root sessions with their sub-agents.
    `block_size` is for a file that does not record one (Mooncake's is 512). `schedule` is "closed"
    (needs sessions) or "open" (timestamps); `start` and `max_live_sessions` shape the closed loop.
    """

    name: str = "agentx"
    preset: str | None = "agentx"
    path: str | None = None
    seed: int = 0
    generator: dict[str, Any] = field(default_factory=dict)
    fixed: dict[str, Any] | None = None
    num_sessions: int | None = None
    block_size: int | None = None
    schedule: str = "closed"
    start: str = "trace"
    max_live_sessions: int | None = None
    time_scale: float = 1.0

    def __post_init__(self) -> None:
        given = [name for name in ("preset", "path", "fixed") if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError(f"WorkloadConfig: give exactly one of preset, path and fixed (got preset={self.preset!r}, "
                             f"path={self.path!r}, fixed={self.fixed!r}); a trace file or fixed lengths need preset "
                             "null")
        if self.fixed is not None:
            if not isinstance(self.fixed, dict):
                names = ", ".join(f.name for f in fields(FixedLengths))
                raise ValueError(f"WorkloadConfig.fixed: expected a mapping of {names}, got {self.fixed!r}")
            check_known_fields(FixedLengths, self.fixed, "WorkloadConfig.fixed")
            self.fixed_lengths()
            if self.generator:
                raise ValueError("WorkloadConfig.generator: overrides apply to a preset, not to fixed lengths")
        if self.preset is not None and self.preset not in PRESETS:
            raise ValueError(f"WorkloadConfig.preset: invalid value {self.preset!r}; valid choices: "
                             f"{', '.join(PRESETS)}")
        if self.path is not None:
            problem = file_problem(self.resolved_path)
            if problem:
                raise ValueError(f"WorkloadConfig.path: {self.path!r}: {problem}")
            if self.generator:
                raise ValueError("WorkloadConfig.generator: overrides apply to a preset, not to a trace file")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"WorkloadConfig.schedule: invalid value {self.schedule!r}; valid choices: "
                             f"{', '.join(SCHEDULES)}")
        if self.start not in START_MODES:
            raise ValueError(f"WorkloadConfig.start: invalid value {self.start!r}; valid choices: "
                             f"{', '.join(START_MODES)}")
        for name in ("num_sessions", "block_size", "max_live_sessions"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"WorkloadConfig.{name}: {value!r} is not an integer >= 1 or null")
        if not self.time_scale > 0:
            raise ValueError(f"WorkloadConfig.time_scale: {self.time_scale!r} is not > 0")

    @property
    def resolved_path(self) -> Path | None:
        """The file `path` names, or None for a preset."""
        if self.path is None:
            return None
        try:
            return resolve_path(self.path)
        except ValueError as err:
            raise ValueError(f"WorkloadConfig.path: {err}") from None

    def fixed_lengths(self) -> FixedLengths:
        """The `fixed` mapping as FixedLengths (a missing or bad field is a ValueError naming it)."""
        missing = [n for n in ("input_length", "output_length", "num_requests") if n not in self.fixed]
        if missing:
            raise ValueError(f"WorkloadConfig.fixed: missing {', '.join(missing)}")
        try:
            return FixedLengths(**self.fixed)
        except ValueError as err:
            raise ValueError(f"WorkloadConfig.fixed: {err}") from None

    def generator_config(self) -> GeneratorConfig:
        """The preset's generator config with `generator` overrides applied."""
        base = preset(self.preset)
        values: dict[str, Any] = {}
        for name, value in self.generator.items():
            current = getattr(base, name, None)
            if isinstance(current, LogNormal):
                if not isinstance(value, dict):
                    raise ValueError(f"WorkloadConfig.generator.{name}: expected a mapping of "
                                     f"{', '.join(f.name for f in fields(LogNormal))}, got {value!r}")
                check_known_fields(LogNormal, value, f"WorkloadConfig.generator.{name}")
                value = LogNormal(**{**current.__dict__, **value})
            values[name] = value
        return base.with_overrides(**values)


def _as_config(cfg: Any) -> WorkloadConfig:
    if isinstance(cfg, WorkloadConfig):
        return cfg
    from omegaconf import DictConfig, OmegaConf

    if isinstance(cfg, DictConfig):
        cfg = OmegaConf.to_container(cfg, resolve=True)
    if not isinstance(cfg, dict):
        raise TypeError(f"workload config: expected a WorkloadConfig or a mapping, got {type(cfg).__name__}")
    check_known_fields(WorkloadConfig, cfg)
    return WorkloadConfig(**cfg)


def load_workload(cfg: Any) -> Trace:
    """The trace a workload config names: its preset generated with its seed, or its file read."""
    cfg = _as_config(cfg)
    if cfg.fixed is not None:
        trace = fixed_trace(cfg.fixed_lengths())
    elif cfg.preset is not None:
        trace = generate(cfg.generator_config(), seed=cfg.seed)
        if cfg.block_size is not None and cfg.block_size != trace.block_size:
            raise ValueError(f"WorkloadConfig.block_size: {cfg.block_size} contradicts preset {cfg.preset!r}'s "
                             f"block size {trace.block_size}; set generator.block_size instead")
    else:
        trace = read_trace(cfg.resolved_path, block_size=cfg.block_size)
    if cfg.num_sessions is not None:
        trace = trace.head_sessions(cfg.num_sessions)
    return trace


def build_schedule(cfg: Any, trace: Trace) -> Schedule:
    """The replay schedule the config asks for, over `trace`."""
    cfg = _as_config(cfg)
    if cfg.schedule == "open":
        return OpenLoopSchedule(trace, time_scale=cfg.time_scale)
    return ClosedLoopSchedule(trace, start=cfg.start, max_live_sessions=cfg.max_live_sessions)


def register_configs(cs: Any) -> None:
    """Store the schema in Hydra's ConfigStore as the top-level config `workload_schema`, outside the group so
    it is no workload option; each `conf/workload/*.yaml` extends it with `/workload_schema@_here_`."""
    cs.store(name=SCHEMA_NAME, node=WorkloadConfig)
