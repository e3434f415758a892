"""vLLM's per-batch-size draft lengths, `num_speculative_tokens_per_batch_size`: inclusive batch-size ranges
[(lo, hi, K), ...], the first starting at 1; past the last range vLLM keeps its K (`v1/spec_decode/dynamic/utils.py`).
"""

from __future__ import annotations

from collections.abc import Sequence

from opts.draft_length.acceptance import check_k
from opts.draft_length.cost import check_batch

# The largest default max_num_seqs of vLLM 0.32 (GPUs with >= 70 GiB): the last bucket reaches it.
MAX_NUM_SEQS = 1024
# The chooser's buckets are powers of two up to here; the last one runs to max_num_seqs.
MAX_BATCH_SIZE = 256

Schedule = tuple[tuple[int, int, int], ...]


def check_schedule(schedule: Sequence[Sequence[int]], name: str = "schedule") -> Schedule:
    """`schedule` as a tuple of (lo, hi, K), else a ValueError naming the bad entry: integers, the first lo 1,
    each lo the previous hi + 1, hi >= lo, K >= 0 (what vLLM accepts, without its gaps)."""
    if isinstance(schedule, str) or not isinstance(schedule, Sequence) or not schedule:
        raise ValueError(f"{name}: invalid value {schedule!r}; valid: a non-empty list of [lo, hi, K]")
    out, previous_hi = [], 0
    for i, entry in enumerate(schedule):
        if (isinstance(entry, str) or not isinstance(entry, Sequence) or len(entry) != 3
                or any(isinstance(v, bool) or not isinstance(v, int) for v in entry)):
            raise ValueError(f"{name}[{i}]: invalid value {entry!r}; valid: [lo, hi, K] integers")
        lo, hi, k = entry
        if lo != previous_hi + 1 or hi < lo or k < 0:
            raise ValueError(f"{name}[{i}]: invalid value {list(entry)!r}; valid: lo = {previous_hi + 1} (ranges "
                             "start at batch size 1 and follow each other), hi >= lo, K >= 0")
        out.append((lo, hi, k))
        previous_hi = hi
    return tuple(out)


def merge_schedule(schedule: Sequence[Sequence[int]]) -> Schedule:
    """Adjacent ranges with the same K joined into one."""
    out: list[tuple[int, int, int]] = []
    for lo, hi, k in check_schedule(schedule):
        if out and out[-1][2] == k:
            out[-1] = (out[-1][0], hi, k)
        else:
            out.append((lo, hi, k))
    return tuple(out)


def buckets(max_batch_size: int = MAX_BATCH_SIZE, max_num_seqs: int = MAX_NUM_SEQS) -> tuple[tuple[int, int], ...]:
    """Power-of-two batch-size buckets [1, 1], [2, 3], [4, 7], ...; the last starts at the largest power of two
    <= `max_batch_size` and runs to `max_num_seqs`."""
    check_batch(max_batch_size, "max_batch_size")
    check_batch(max_num_seqs, "max_num_seqs")
    if max_num_seqs < max_batch_size:
        raise ValueError(f"max_num_seqs: invalid value {max_num_seqs!r}; valid: >= max_batch_size "
                         f"({max_batch_size})")
    out, lo = [], 1
    while 2 * lo <= max_batch_size:
        out.append((lo, 2 * lo - 1))
        lo *= 2
    out.append((lo, max_num_seqs))
    return tuple(out)


def k_for_batch(schedule: Sequence[Sequence[int]], batch: int) -> int:
    """The K vLLM runs at `batch` sequences: its range's, or past the last range the last K."""
    check_batch(batch)
    entries = check_schedule(schedule)
    return next((k for lo, hi, k in entries if lo <= batch <= hi), entries[-1][2])


def fixed_schedule(k: int, max_num_seqs: int = MAX_NUM_SEQS) -> Schedule:
    """One K at every batch size."""
    check_k(k)
    check_batch(max_num_seqs, "max_num_seqs")
    return ((1, max_num_seqs, k),)
