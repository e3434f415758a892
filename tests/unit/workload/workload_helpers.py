"""Small builders shared by the workload tests (imported by name: pytest puts this folder on sys.path)."""

from __future__ import annotations

import math

from ablations.workload import Request
from ablations.workload.config import REPO_ROOT

TRACES_DIR = (REPO_ROOT / "../shared/data/traces").resolve()
CONVERSATION = TRACES_DIR / "conversation_trace.jsonl"
SYNTHETIC = TRACES_DIR / "synthetic_trace.jsonl"


def row(ts=0, n=10, out=5, block=4, ids=None, **extra) -> dict:
    """A valid timed_trace row: `n` input tokens covered by fresh-looking ids unless `ids` is given."""
    ids = list(range(100, 100 + math.ceil(n / block))) if ids is None else ids
    return {"timestamp": ts, "input_length": n, "output_length": out, "hash_ids": ids, **extra}


def request(session, turn, n, ids, ts=0.0, out=4, think_ms=0.0, parent=None) -> Request:
    return Request(timestamp_ms=ts, input_length=n, output_length=out, hash_ids=tuple(ids), session=session,
                   turn=turn, think_ms=think_ms, parent_session=None if parent is None else parent[0],
                   parent_turn=None if parent is None else parent[1])
