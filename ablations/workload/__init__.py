"""AgentX-style agentic workloads: the trace model, JSONL readers/writers, the generator and its presets,
closed/open-loop schedules and trace statistics. See README.md."""

from ablations.workload.config import WorkloadConfig, build_schedule, load_workload, register_configs
from ablations.workload.generate import GeneratorConfig, LogNormal, generate
from ablations.workload.io import check_order, read_trace, sorted_by_arrival, write_trace
from ablations.workload.presets import PRESETS, preset
from ablations.workload.schedule import ClosedLoopSchedule, OpenLoopSchedule, Release, Schedule, simulate
from ablations.workload.stats import format_stats, per_request_reuse, trace_stats
from ablations.workload.trace import DEFAULT_BLOCK_SIZE, Request, Session, Trace, TraceError

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "PRESETS",
    "ClosedLoopSchedule",
    "GeneratorConfig",
    "LogNormal",
    "OpenLoopSchedule",
    "Release",
    "Request",
    "Schedule",
    "Session",
    "Trace",
    "TraceError",
    "WorkloadConfig",
    "build_schedule",
    "check_order",
    "format_stats",
    "generate",
    "load_workload",
    "per_request_reuse",
    "preset",
    "read_trace",
    "register_configs",
    "simulate",
    "sorted_by_arrival",
    "trace_stats",
    "write_trace",
]
