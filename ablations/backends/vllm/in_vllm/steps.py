"""Per-step records of vLLM's scheduler: when each engine step started and ended, and what it scheduled.

When `K3_ABLATE_COUNTER_DIR` is set, the scheduler's process (the engine core) appends one JSON line per step that
scheduled tokens to `<dir>/<pid>.steps.jsonl`: `start` (`Scheduler.schedule` called) and `end` (its
`update_from_output` returned), seconds on the process's monotonic clock, and per scheduled request `[tokens
scheduled, tokens computed before, prompt tokens, draft tokens]` — the step's composition, as the simulator's
`Seq`s describe one (`step_seqs`). A step is matched to its output by the scheduler output object, so steps that
overlap (async scheduling) are timed each from its own schedule to its own update. `read_steps(dir)` returns
every process's records in start order. The fidelity check fits the simulator's host cost on them
(`ablations/fidelity/`).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from ablations.backends.vllm.in_vllm.counters import counter_dir
from ablations.backends.vllm.in_vllm.patches import Patch

STEPS_SUFFIX = ".steps.jsonl"
SCHEDULER = "vllm.v1.core.sched.scheduler:Scheduler"
WHY = "records each engine step's start, end and scheduled requests (K3_ABLATE_COUNTER_DIR/<pid>.steps.jsonl)"

_pending: dict[int, tuple[float, list[list[int]]]] = {}


def _requests(scheduler: Any, output: Any) -> list[list[int]]:
    rows = []
    for req_id, scheduled in output.num_scheduled_tokens.items():
        request = scheduler.requests[req_id]
        drafts = len(output.scheduled_spec_decode_tokens.get(req_id, ()))
        # schedule() has advanced num_computed_tokens by what it scheduled (Scheduler._update_after_schedule)
        rows.append([scheduled, request.num_computed_tokens - scheduled, request.num_prompt_tokens, drafts])
    return rows


def _timed_schedule(base: Any) -> Any:
    def schedule(self: Any, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        output = base(self, *args, **kwargs)
        if output.total_num_scheduled_tokens and counter_dir() is not None:
            _pending[id(output)] = (start, _requests(self, output))
        return output

    schedule.__wrapped__ = base  # type: ignore[attr-defined]
    return schedule


def _timed_update(base: Any) -> Any:
    def update_from_output(self: Any, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        result = base(self, scheduler_output, *args, **kwargs)
        entry = _pending.pop(id(scheduler_output), None)
        directory = counter_dir()
        if entry is not None and directory is not None:
            start, requests = entry
            line = json.dumps({"start": start, "end": time.perf_counter(), "requests": requests})
            directory.mkdir(parents=True, exist_ok=True)
            with open(directory / f"{os.getpid()}{STEPS_SUFFIX}", "a") as f:
                f.write(line + "\n")
        return result

    update_from_output.__wrapped__ = base  # type: ignore[attr-defined]
    return update_from_output


STEP_PATCHES = [Patch(f"{SCHEDULER}.schedule", _timed_schedule, WHY),
                Patch(f"{SCHEDULER}.update_from_output", _timed_update, WHY)]


def read_steps(directory: str | Path) -> list[dict[str, Any]]:
    """Every step record written into `directory`, in start order (times relative to the first start)."""
    steps = [json.loads(line) for path in sorted(Path(directory).glob(f"*{STEPS_SUFFIX}"))
             for line in path.read_text().splitlines() if line]
    steps.sort(key=lambda s: s["start"])
    t0 = steps[0]["start"] if steps else 0.0
    return [{**s, "start": s["start"] - t0, "end": s["end"] - t0} for s in steps]


def step_seqs(requests: list[list[int]]) -> list[tuple[int, int, str]]:
    """A recorded step's requests as (new tokens, context, kind) for the simulator's `Seq`: a request still short of
    its prompt is a prefill chunk, one with drafts a verification, else a decode."""
    out = []
    for scheduled, before, prompt, drafts in requests:
        kind = "prefill" if before < prompt else "verify" if drafts else "decode"
        out.append((scheduled, before, kind))
    return out
