"""Off, the reference path: what vLLM runs with a plain `speculative_config`, the same K at every batch size."""

from __future__ import annotations

from opts.draft_length.config import DraftLengthConfig
from opts.draft_length.schedule import MAX_NUM_SEQS, Schedule, fixed_schedule


def off_schedule(config: DraftLengthConfig, max_num_seqs: int = MAX_NUM_SEQS) -> Schedule:
    """Off: `config.k` drafts at every batch size."""
    return fixed_schedule(config.k, max_num_seqs)
