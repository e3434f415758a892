"""evict inside vLLM: the block pool's free queue runs `evict.SessionFreeList`'s order.

`SessionFreeQueue` keeps the interface of vLLM's `FreeKVCacheBlockQueue` (what `BlockPool` calls: popleft,
popleft_n, remove, append, append_n, prepend_n, num_free_blocks, get_all_free_blocks) over the policy, so
vLLM's own free_blocks/touch/get_new_blocks decide what is freed, hit and allocated, and only the order of
reuse changes. The session of a request (and a sub-agent's parent session) travels in its
`SamplingParams.extra_args["k3_session"]` (`["k3_parent"]`)
(`Request.sampling_params.extra_args`); the queue learns it while the KV-cache manager allocates for that
request. "now" is `extra_args["k3_time"]` (a replay's trace clock, seconds) when a request carries it, else
seconds of wall clock since the pool was built.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from opts.cache_retention.evict import SessionFreeList

SESSION_KEY = "k3_session"
PARENT_KEY = "k3_parent"
TIME_KEY = "k3_time"


class SessionFreeQueue:
    """vLLM's free-block queue, reused in session-aware order."""

    def __init__(self, blocks: list[Any], idle_s: float) -> None:
        self.policy = SessionFreeList(idle_s)
        self.blocks = {b.block_id: b for b in blocks}
        self.policy.prepend([b.block_id for b in blocks])
        self.session: str | None = None
        self.admitted: dict[str, int] = {}
        self.num_arrived = 0
        self.now_s = 0.0
        self._start = time.monotonic()

    @property
    def num_free_blocks(self) -> int:
        return len(self.policy)

    def popleft(self) -> Any:
        if not len(self.policy):
            raise ValueError("No free blocks available")
        return self.blocks[self.policy.pop()]

    def popleft_n(self, n: int) -> list[Any]:
        return [self.popleft() for _ in range(n)]

    def remove(self, block: Any) -> None:
        self.policy.remove(block.block_id)

    def append(self, block: Any) -> None:
        self.policy.append(block.block_id)

    def append_n(self, blocks: list[Any]) -> None:
        for block in blocks:
            self.policy.append(block.block_id)

    def prepend_n(self, blocks: list[Any]) -> None:
        if blocks:
            self.policy.prepend([b.block_id for b in blocks])

    def get_all_free_blocks(self) -> list[Any]:
        return [self.blocks[i] for i in self.policy.order()]

    def iter_blocks_after(self, cursor: Any) -> Iterator[Any]:
        order = self.get_all_free_blocks()
        start = 0 if cursor is None else next(i for i, b in enumerate(order) if b is cursor) + 1
        yield from order[start:]

    def note_use(self, blocks: list[Any]) -> None:
        for block in blocks:
            if not block.is_null:
                self.policy.note_use(block.block_id, self.session)

    def clock(self, request: Any) -> float:
        """The request's time: its `k3_time`, else wall clock since the pool was built (never going back)."""
        stated = extra_args(request).get(TIME_KEY)
        now = float(stated) if stated is not None else time.monotonic() - self._start
        self.now_s = max(self.now_s, now)
        return self.now_s


def extra_args(request: Any) -> dict[str, Any]:
    params = getattr(request, "sampling_params", None)
    return (getattr(params, "extra_args", None) or {}) if params is not None else {}


def session_of(request: Any) -> str | None:
    """The request's session id (`extra_args["k3_session"]`), or None."""
    session = extra_args(request).get(SESSION_KEY)
    return None if session is None else str(session)


def _queue(pool: Any) -> SessionFreeQueue | None:
    queue = getattr(pool, "free_block_queue", None)
    return queue if isinstance(queue, SessionFreeQueue) else None


def pool_init(idle_s: float) -> Callable[[Callable], Callable]:
    """Wrap `BlockPool.__init__`: the pool's free queue becomes a `SessionFreeQueue` in the same order."""

    def wrap(base: Callable) -> Callable:
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            base(self, *args, **kwargs)
            self.free_block_queue = SessionFreeQueue(self.free_block_queue.get_all_free_blocks(), idle_s)

        return __init__

    return wrap


def get_new_blocks(base: Callable) -> Callable:
    """Wrap `BlockPool.get_new_blocks`: the allocating request's session holds the new blocks."""

    def wrapped(self: Any, num_blocks: int) -> list[Any]:
        blocks = base(self, num_blocks)
        queue = _queue(self)
        if queue is not None:
            queue.note_use(blocks)
        return blocks

    return wrapped


def touch(base: Callable) -> Callable:
    """Wrap `BlockPool.touch`: the hitting request's session holds the blocks it hits."""

    def wrapped(self: Any, blocks: Any) -> None:
        base(self, blocks)
        queue = _queue(self)
        if queue is not None:
            queue.note_use(list(blocks))

    return wrapped


def add_request(base: Callable) -> Callable:
    """Wrap `Scheduler.add_request`: an arriving request (waiting or running) makes its session live."""

    def wrapped(self: Any, request: Any) -> Any:
        result = base(self, request)
        queue = _queue(self.kv_cache_manager.block_pool)
        if queue is not None and request.request_id not in queue.admitted:
            queue.admitted[request.request_id] = queue.num_arrived
            parent = extra_args(request).get(PARENT_KEY)
            queue.policy.note_admit(session_of(request), queue.clock(request), queue.num_arrived,
                                    None if parent is None else str(parent))
            queue.num_arrived += 1
        return result

    return wrapped


def allocate_slots(base: Callable) -> Callable:
    """Wrap `KVCacheManager.allocate_slots`: name the request's session for the pool while it allocates."""

    def wrapped(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        queue = _queue(self.block_pool)
        if queue is None:
            return base(self, request, *args, **kwargs)
        queue.session = session_of(request)
        try:
            return base(self, request, *args, **kwargs)
        finally:
            queue.session = None

    return wrapped


def free_request_blocks(base: Callable) -> Callable:
    """Wrap `Scheduler._free_request_blocks`: the request's session finished one request."""

    def wrapped(self: Any, request: Any) -> None:
        base(self, request)
        queue = _queue(self.kv_cache_manager.block_pool)
        if queue is not None and request.request_id in queue.admitted:
            index = queue.admitted.pop(request.request_id)
            queue.policy.note_finish(session_of(request), queue.clock(request), index)

    return wrapped
