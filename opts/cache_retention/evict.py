"""evict: session-aware reuse order of free cached blocks.

A block remembers the sessions whose requests held it. A session is live while one of its requests waits or
runs (or one of its sub-agents does: a parent waits for them) and for `idle_s` after the last one finished
(its think time); after that it is idle. The next cached block to
reuse is the one with the fewest live sessions among its holders, least recently freed first among equals:
blocks of finished or idle sessions go first, a live session's context stays through its think time, and a
prefix shared with sub-agents stays while any of them is live. Blocks without a hash still go before any
cached block, as in vLLM. Every decision uses only what has happened up to that moment.
"""

from __future__ import annotations

import heapq

from opts.k3.cache.free_list import RankedFreeList


class SessionFreeList(RankedFreeList):
    """Free blocks, reused fewest-live-holders first, then least recently freed."""

    def __init__(self, idle_s: float) -> None:
        if not idle_s > 0:
            raise ValueError(f"idle_s: invalid value {idle_s!r}; valid: seconds > 0")
        super().__init__()
        self.idle_s = idle_s
        self.now_s = 0.0
        self._heap: list[tuple[int, int, int]] = []
        self._seq = 0
        self._holders: dict[int, set[str]] = {}
        self._free_held: dict[str, set[int]] = {}
        self._running: dict[str, int] = {}
        self._live: set[str] = set()
        self._deadlines: list[tuple[float, str]] = []
        self._last_finish: dict[str, float] = {}
        self._counted: set = set()
        self._parent: dict[str, str] = {}

    @property
    def num_open_requests(self) -> int:
        """Requests admitted and not finished yet (what the list remembers per request)."""
        return len(self._counted)

    def num_live_holders(self, block_id: int) -> int:
        holders = self._holders.get(block_id)
        return len(self._live.intersection(holders)) if holders else 0

    def append(self, block_id: int) -> None:
        self._seq += 1
        self._push(block_id, self._seq)
        for s in self._holders.get(block_id, ()):
            self._free_held.setdefault(s, set()).add(block_id)

    def append_many(self, block_ids: list[int]) -> None:
        """`append` for each block in order (inlined: this runs for every block a request frees)."""
        holders_of, live, entry, heap, free_held = self._holders, self._live, self._entry, self._heap, self._free_held
        seq = self._seq
        push = heapq.heappush
        for block_id in block_ids:
            seq += 1
            holders = holders_of.get(block_id)
            if holders:
                num_live = 0
                for s in holders:
                    if s in live:
                        num_live += 1
                    held = free_held.get(s)
                    if held is None:
                        free_held[s] = held = set()
                    held.add(block_id)
            else:
                num_live = 0
            entry[block_id] = (num_live, seq)
            push(heap, (num_live, seq, block_id))
        self._seq = seq

    def note_uses(self, block_ids: list[int], session: str | None) -> None:
        """`note_use` for each block."""
        holders_of = self._holders
        for block_id in block_ids:
            holders = holders_of.get(block_id)
            if holders is None:
                holders_of[block_id] = holders = set()
            if session is not None:
                holders.add(session)

    def _push(self, block_id: int, seq: int) -> None:
        live = self.num_live_holders(block_id)
        self._entry[block_id] = (live, seq)
        heapq.heappush(self._heap, (live, seq, block_id))

    def remove(self, block_id: int) -> None:
        if block_id in self._plain:
            del self._plain[block_id]
            return
        del self._entry[block_id]
        for s in self._holders.get(block_id, ()):
            self._free_held[s].discard(block_id)

    def pop(self) -> int:
        if self._plain:
            block_id = self._plain.popitem(last=False)[0]
            self._holders.pop(block_id, None)
            return block_id
        if self._deadlines and self._deadlines[0][0] <= self.now_s:
            self._expire()
        if len(self._heap) > 2 * len(self._entry) + 64:
            self._compact()
        heap, entries, pop = self._heap, self._entry, heapq.heappop
        while True:
            live, seq, block_id = pop(heap)
            if entries.get(block_id) == (live, seq):
                del entries[block_id]
                holders = self._holders.pop(block_id, None)
                if holders:
                    free_held = self._free_held
                    for s in holders:
                        free_held[s].discard(block_id)
                return block_id

    def _compact(self) -> None:
        """The heap rebuilt from the live entries alone. A block a hit takes out of the list (`remove`) or whose
        ranking changes (`_set_live`) leaves its old entry behind, which `pop` would skip: a request's hit leaves
        one per block, and at K3's 290-block prompts they outnumber the free blocks. Pops find the same blocks."""
        self._heap = [(live, seq, block_id) for block_id, (live, seq) in self._entry.items()]
        heapq.heapify(self._heap)

    def order(self) -> list[int]:
        """Block ids, next to reuse first (at the current time)."""
        self._expire()
        cached = sorted(self._entry, key=lambda b: self._entry[b])
        return list(self._plain) + cached

    def note_use(self, block_id: int, session: str | None) -> None:
        """A request of `session` holds `block_id` (a fresh allocation forgets earlier holders)."""
        holders = self._holders.setdefault(block_id, set())
        if session is not None:
            holders.add(session)

    def note_admit(self, session: str | None, now_s: float, index: int, parent: str | None = None) -> None:
        """Request `index` of `session` (a sub-agent of `parent`) arrived: waiting or running, it keeps its
        session and the session's ancestors live. Counted once per request."""
        self._advance(now_s)
        if session is None or index in self._counted:
            return
        self._counted.add(index)
        if parent is not None:
            self._parent[session] = parent
        for s in self._lineage(session):
            self._running[s] = self._running.get(s, 0) + 1
            if s not in self._live:
                self._set_live(s, True)

    def note_finish(self, session: str | None, now_s: float, index: int) -> None:
        """Request `index` of `session` finished at `now_s`: the session is idle `idle_s` after its last one."""
        self._advance(now_s)
        if session is None or index not in self._counted:
            return
        self._counted.discard(index)
        for s in self._lineage(session):
            self._running[s] -= 1
            if self._running[s] == 0:
                self._last_finish[s] = now_s
                heapq.heappush(self._deadlines, (now_s + self.idle_s, s))

    def _lineage(self, session: str) -> list[str]:
        chain = [session]
        while chain[-1] in self._parent and len(chain) <= len(self._parent):
            chain.append(self._parent[chain[-1]])
        return chain

    def _advance(self, now_s: float) -> None:
        self.now_s = max(self.now_s, now_s)
        self._expire()

    def _expire(self) -> None:
        while self._deadlines and self._deadlines[0][0] <= self.now_s:
            deadline, session = heapq.heappop(self._deadlines)
            if (self._running.get(session, 0) == 0 and session in self._live
                    and self._last_finish.get(session, -1.0) + self.idle_s == deadline):
                self._set_live(session, False)

    def _set_live(self, session: str, is_live: bool) -> None:
        if is_live:
            self._live.add(session)
        else:
            self._live.discard(session)
        for block_id in self._free_held.get(session, ()):
            self._push(block_id, self._entry[block_id][1])
