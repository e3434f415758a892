"""Resume points in the hybrid pool: where a later request can start from a cached KDA state past its block hit.
Two kinds: a prompt tail (vLLM's `prefix_match_unit`: a copy of the state at a prompt's tail and the block holding
it, matched by content) and a turn's end (cache_retention's resume: a finished turn's state and partial last block,
for its session's next turn). Part of `HybridPool` (`pool.py`), over the block store (`blocks.py`)."""

from __future__ import annotations

from dataclasses import dataclass

from opts.k3.cache.blocks import RESUME_BLOCK, RESUME_STATE, BlockStore, Running
from opts.k3.cache.stream import CacheRequest, own_key, prefix_key


@dataclass(frozen=True)
class Resume:
    """Where a turn can be resumed: after its last computed token (`turn_end`, unit 1) or at its prompt's
    end rounded down to `unit` tokens (`prompt_tail`, cached at prefill, what vLLM's prefix_match_unit does)."""

    at_prompt_tail: bool = False
    unit: int = 1

    def point(self, request: CacheRequest, speculative: bool = False) -> int:
        """Tokens of `request` a later turn can resume from (`speculative`: MTP configured, a prompt tail one
        unit earlier: vLLM's `get_mamba_prefill_checkpoint_position`)."""
        if not self.at_prompt_tail:
            return request.num_processed_tokens
        if speculative:
            return max(request.num_prompt_tokens // self.unit * self.unit - self.unit, 0)
        return (request.num_prompt_tokens - 1) // self.unit * self.unit


def checkpoints(num_prompt_tokens: int, block_size: int, speculative: bool) -> tuple[int, ...]:
    """Where a prefill caches its KDA state besides a junction (vLLM's `replay_boundaries`): the prompt's last
    full block before its last token; with MTP one block earlier, at both a resend's and an extension's."""
    resend = (num_prompt_tokens - 1) // block_size * block_size
    if not speculative:
        return (resend,) if resend else ()
    extension = num_prompt_tokens // block_size * block_size
    return tuple(sorted({p - block_size for p in (resend, extension) if p > block_size}))


class Tails(BlockStore):
    """The resume points a pool keeps (`resume`: None keeps none) and the KDA checkpoints of a prefill."""

    def _init_tails(self, resume: Resume | None, chunk_size: int, speculative: bool) -> None:
        self.resume = resume
        self.chunk_size = chunk_size
        self.speculative = speculative
        self.num_resumes = 0
        self.checkpoint_bytes = 0

    def _resume_points(self, request: CacheRequest, previous: CacheRequest | None, hit: int) -> list[int]:
        """Where `request` may resume past `hit`, deepest first: at a prompt tail, wherever any request's tail is
        cached (vLLM's prefix_match_unit lookup is by content: a sub-agent's first turn resumes from its parent's
        tail; with MTP at least a unit before the prompt's last whole unit); at a turn's end, where the session's
        previous turn ended."""
        if self.resume is None:
            return []
        if not self.resume.at_prompt_tail:
            point = self.resume.point(previous, self.speculative) if previous is not None else 0
            return [point] if point > hit else []
        unit, prompt = self.resume.unit, request.num_prompt_tokens
        top = prompt // unit * unit - unit if self.speculative else prompt - 1
        return sorted((p for p in self.tails if hit < p <= top), reverse=True)

    def _prompt_tail(self, request: CacheRequest) -> int | None:
        """prompt_tail: where the request keeps its tail (a copy of its state; its partial block named in place)
        for any later request whose prompt starts with it; None without resume at the prompt tail or a session, or
        where a block checkpoint holds it."""
        if self.resume is None or not self.resume.at_prompt_tail or request.session is None:
            return None
        point = self.resume.point(request, self.speculative)
        last = max(checkpoints(request.num_prompt_tokens, self.block_size, self.speculative), default=0)
        return point if point > last else None

    def _keep_prompt_tail(self, run: Running, request: CacheRequest) -> int | None:
        """prompt_tail: a copy of the state at the prompt's tail, cached, and the block holding the tail named there
        in place (a second name when it has one); the tail's position, or None when it keeps none (`_prompt_tail`)."""
        point = self._prompt_tail(request)
        if point is None:
            return None
        key = prefix_key(request, point, self.chunk_size)
        copies = [self._alloc(run.session) for _ in range(self.geometry.num_state_groups)]
        for i, bid in enumerate(copies):
            self._hash(bid, (RESUME_STATE, i, key), point)
            run.states.append((bid, (RESUME_STATE, i, key)))
        self._free(copies)
        if point % self.block_size:
            for i, blocks in enumerate(run.attn):
                bid, name = blocks[point // self.block_size], (RESUME_BLOCK, i, key)
                if bid in self.key_of:
                    self.version += 1
                    self.extra.setdefault(bid, []).append(name)
                    self.cached.setdefault(name, []).append(bid)
                else:
                    self._hash(bid, name, point)
        self.checkpoint_bytes += self.geometry.state_bytes
        return point

    def _keep_turn_end(self, index: int, run: Running, request: CacheRequest) -> None:
        """turn_end: a finishing turn's final state and partial last block named under the turn's end, for the
        session's next turn (cache_retention's resume; vLLM has no such point)."""
        processed = request.num_processed_tokens
        if self.resume is not None and not self.resume.at_prompt_tail and request.session is not None:
            covered = len(request.chunk_ids) * self.chunk_size >= processed
            key = prefix_key(request, processed, self.chunk_size) if covered else own_key(index, processed)
            for i, bid in enumerate(run.state):
                self._hash(bid, (RESUME_STATE, i, key), processed)
            if processed % self.block_size:
                for i, blocks in enumerate(run.attn):
                    self._hash(blocks[-1], (RESUME_BLOCK, i, key), processed)
            self.checkpoint_bytes += self.geometry.state_bytes
