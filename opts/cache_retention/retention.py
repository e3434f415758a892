"""The toggle applied to the pool model: `run(stream, geometry, num_blocks, config)` for any mode.

off = `naive.run_off`; evict swaps the free list for `evict.SessionFreeList`; resume keeps each turn's end
(`pool.HybridPool.finish`); on = both.
"""

from __future__ import annotations

from opts.cache_retention.config import CacheRetentionConfig
from opts.cache_retention.evict import SessionFreeList
from opts.k3.cache import CacheStats, Resume, replay
from opts.k3.cache.free_list import LruFreeList
from opts.k3.cache.geometry import CacheGeometry
from opts.k3.cache.stream import CacheStream

NO_SESSIONS = "no session ids in the stream: session-aware retention runs as off"


def resume_for(config: CacheRetentionConfig) -> Resume | None:
    """Where `config` resumes a turn, or None (no resume)."""
    if not config.is_resume:
        return None
    return Resume(at_prompt_tail=config.resume_from == "prompt_tail", unit=config.resume_unit)


def free_list_for(config: CacheRetentionConfig):
    """The free-block order `config` runs."""
    return SessionFreeList(config.idle_s) if config.is_evict else LruFreeList()


def run(stream: CacheStream, geometry: CacheGeometry, num_blocks: int, config: CacheRetentionConfig, *,
        keys: list[list] | None = None) -> CacheStats:
    """Hit statistics of `config`'s policy on `stream` with a pool of `num_blocks` blocks (`keys`: the
    stream's `pool.stream_keys`, when several runs share them)."""
    if config.mode != "off" and not stream.has_sessions:
        stats = replay(stream, geometry, num_blocks, LruFreeList(), resume=None, keys=keys)
        stats.info["fallback"] = NO_SESSIONS
        return stats
    return replay(stream, geometry, num_blocks, free_list_for(config), resume=resume_for(config), keys=keys)
