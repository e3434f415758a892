"""The order in which free blocks are reused: vLLM's LRU queue (off) and the interface every policy keeps.

vLLM's free queue (`BlockPool.free_blocks`, block_pool.py:774-803): a freed block without a hash (never
matchable) goes to the front, a freed cached block to the back; a hit takes a block out wherever it is;
allocation pops from the front, evicting the block's hash if it has one. A policy only changes which cached
block goes first: blocks without a hash always go before any cached one.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable


class LruFreeList:
    """vLLM's free queue: front = next to reuse."""

    def __init__(self, block_ids: Iterable[int] = ()) -> None:
        self._queue: OrderedDict[int, None] = OrderedDict.fromkeys(block_ids)

    def __len__(self) -> int:
        return len(self._queue)

    def __contains__(self, block_id: int) -> bool:
        return block_id in self._queue

    def append(self, block_id: int) -> None:
        """A cached block freed: reused last."""
        self._queue[block_id] = None

    def append_many(self, block_ids: list[int]) -> None:
        """Cached blocks freed, in this order: reused last."""
        queue = self._queue
        for block_id in block_ids:
            queue[block_id] = None

    def prepend(self, block_ids: list[int]) -> None:
        """Blocks without a hash freed: reused first, in the given order."""
        for block_id in reversed(block_ids):
            self._queue[block_id] = None
            self._queue.move_to_end(block_id, last=False)

    def remove(self, block_id: int) -> None:
        del self._queue[block_id]

    def remove_many(self, block_ids: list[int]) -> None:
        """`remove` for each block (in C: this runs for every block of every hit)."""
        deque(map(self._queue.__delitem__, block_ids), 0)

    def pop(self) -> int:
        return self._queue.popitem(last=False)[0]

    def order(self) -> list[int]:
        """Block ids, next to reuse first."""
        return list(self._queue)

    def note_use(self, block_id: int, session: str | None) -> None:
        """A request of `session` holds `block_id` (LRU ignores it)."""

    def note_uses(self, block_ids: list[int], session: str | None) -> None:
        """A request of `session` holds `block_ids` (LRU ignores it)."""

    def note_admit(self, session: str | None, now_s: float, index: int, parent: str | None = None) -> None:
        """Request `index` of `session` starts at `now_s` (LRU ignores it)."""

    def note_finish(self, session: str | None, now_s: float, index: int) -> None:
        """Request `index` of `session` finished at `now_s` (LRU ignores it)."""


class RankedFreeList:
    """The shared part of a policy's free list: blocks without a hash at the front, reused first and in the
    order given; cached blocks in `_entry` (block -> the ranking its subclass keeps, lowest reused first)."""

    def __init__(self) -> None:
        self._plain: OrderedDict[int, None] = OrderedDict()
        self._entry: dict[int, tuple] = {}

    def __len__(self) -> int:
        return len(self._plain) + len(self._entry)

    def __contains__(self, block_id: int) -> bool:
        return block_id in self._plain or block_id in self._entry

    def prepend(self, block_ids: list[int]) -> None:
        """Blocks without a hash freed: reused first, in the given order."""
        for block_id in reversed(block_ids):
            self._plain[block_id] = None
            self._plain.move_to_end(block_id, last=False)

    def append_many(self, block_ids: list[int]) -> None:
        """Cached blocks freed, in this order."""
        for block_id in block_ids:
            self.append(block_id)

    def remove_many(self, block_ids: list[int]) -> None:
        """`remove` for each block."""
        for block_id in block_ids:
            self.remove(block_id)

    def note_uses(self, block_ids: list[int], session: str | None) -> None:
        """A request of `session` holds `block_ids`."""
        for block_id in block_ids:
            self.note_use(block_id, session)

    def _pop_plain(self) -> int | None:
        return self._plain.popitem(last=False)[0] if self._plain else None
