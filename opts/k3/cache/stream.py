"""What the cache sees of a workload: requests with times, content ids, sessions and turn continuations.

A request's tokens (prompt, then output) are named in chunks of `chunk_size` tokens: `chunk_ids[k]` names
the content of chunk k *and everything before it* (the trace's hash ids), so two requests hold the same
first n tokens exactly when they agree on the chunk holding token n-1. That is how a cache block of any
size B is named: by the chunk holding its last token and the offset of its end in that chunk, the pair packed
into one int (`name`): the replay looks names up millions of times, and a dict hashes an int about twice as fast
as a pair.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

PrefixKey = int


@dataclass(frozen=True)
class CacheRequest:
    """One request. `continues`: index of the earlier request whose whole sequence (prompt and output) this
    prompt starts with (a session's previous turn), else None. `parent`: for a sub-agent's request, the session
    that spawned it. Times in seconds since the stream start."""

    arrival_s: float
    finish_s: float
    num_prompt_tokens: int
    num_output_tokens: int
    chunk_ids: tuple[int, ...]
    session: str | None = None
    continues: int | None = None
    parent: str | None = None

    @property
    def num_processed_tokens(self) -> int:
        """Tokens whose KV and state the engine computes: the last sampled token is never fed back."""
        return self.num_prompt_tokens + self.num_output_tokens - 1


@dataclass(frozen=True)
class CacheStream:
    """Requests in admission (arrival) order; every request's `chunk_ids` cover its prompt."""

    requests: tuple[CacheRequest, ...]
    chunk_size: int
    source: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.requests, tuple):
            object.__setattr__(self, "requests", tuple(self.requests))
        if isinstance(self.chunk_size, bool) or not isinstance(self.chunk_size, int) or self.chunk_size < 1:
            raise ValueError(f"{self._where(None)}chunk_size: invalid value {self.chunk_size!r}; valid: an "
                             "integer >= 1")
        last = -math.inf
        for i, r in enumerate(self.requests):
            if r.num_prompt_tokens < 1 or r.num_output_tokens < 1:
                raise ValueError(f"{self._where(i)}prompt and output need >= 1 token, got {r.num_prompt_tokens} "
                                 f"and {r.num_output_tokens}")
            if r.chunk_ids and min(r.chunk_ids) < 0:
                raise ValueError(f"{self._where(i)}chunk_ids: {min(r.chunk_ids)} is negative; valid: ids >= 0")
            if len(r.chunk_ids) * self.chunk_size < r.num_prompt_tokens:
                raise ValueError(f"{self._where(i)}chunk_ids: {len(r.chunk_ids)} chunks of {self.chunk_size} "
                                 f"do not cover the {r.num_prompt_tokens}-token prompt")
            if not (r.arrival_s >= last and r.finish_s >= r.arrival_s):
                raise ValueError(f"{self._where(i)}times: arrival {r.arrival_s} s, finish {r.finish_s} s; requests "
                                 "must be in arrival order and finish after they arrive")
            last = r.arrival_s
            if r.continues is not None and not 0 <= r.continues < i:
                raise ValueError(f"{self._where(i)}continues: {r.continues!r} is not an earlier request")

    def _where(self, index: int | None) -> str:
        head = f"{self.source}: " if self.source else ""
        return head if index is None else f"{head}request {index}: "

    @property
    def has_sessions(self) -> bool:
        return any(r.session is not None for r in self.requests)


def name(chunk_id: int, offset: int, chunk_size: int) -> PrefixKey:
    """The name of the content up to `offset` (1..chunk_size) tokens into chunk `chunk_id` (>= 0): one int per
    pair, none negative (pool.own_key's names are)."""
    return chunk_id * (chunk_size + 1) + offset


def prefix_key(request: CacheRequest, num_tokens: int, chunk_size: int) -> PrefixKey:
    """The name of the request's first `num_tokens` tokens (> 0)."""
    chunk = (num_tokens - 1) // chunk_size
    return name(request.chunk_ids[chunk], num_tokens - chunk * chunk_size, chunk_size)


def block_keys(request: CacheRequest, num_tokens: int, block_size: int, chunk_size: int) -> list[PrefixKey]:
    """Names of the full `block_size`-token blocks among the request's first `num_tokens` tokens (`name`,
    inlined: this runs for every block of every request)."""
    ids, stride = request.chunk_ids, chunk_size + 1
    keys = []
    for end in range(block_size, num_tokens + 1, block_size):
        chunk = (end - 1) // chunk_size
        keys.append(ids[chunk] * stride + end - chunk * chunk_size)
    return keys
def own_key(index: int, position: int) -> int:
    """The name of content only request `index` holds (past its chunk ids) at `position` (a block index, or
    the token count of its turn end, < 2**32): negative, so no chunk's name (stream.name) or other request's
    equals it."""
    return -(index << 32) - position - 1


def request_keys(request: CacheRequest, index: int, block_size: int, chunk_size: int) -> list:
    """Names of the request's full blocks over its processed tokens; blocks past its chunk ids are its own."""
    covered = min(request.num_processed_tokens, len(request.chunk_ids) * chunk_size)
    keys: list = block_keys(request, covered, block_size, chunk_size)
    for j in range(len(keys), request.num_processed_tokens // block_size):
        keys.append(own_key(index, j))
    return keys


def stream_keys(stream: CacheStream, block_size: int) -> list[list]:
    """`request_keys` of every request of `stream` (what every replay of it at `block_size` names)."""
    return [request_keys(r, i, block_size, stream.chunk_size) for i, r in enumerate(stream.requests)]
