"""Hand-made streams for the cache_retention tests: a toy geometry (B = 4 tokens, one attention group, one
state group, one byte per pool block), requests named from their tokens, and a free list that records what it
pops."""

from __future__ import annotations

from opts.k3.cache.geometry import CacheGeometry
from opts.k3.cache.stream import CacheRequest

TOY = CacheGeometry(name="toy", block_size=4, block_bytes=1, num_attn_groups=1, num_state_groups=1, state_bytes=1,
                    latent_bytes_per_token=1)
_IDS: dict[tuple[str, ...], int] = {}


def tokens(name: str, num_tokens: int) -> list[str]:
    return [f"{name}{i}" for i in range(num_tokens)]


def chunk_ids(content: list[str], num_tokens: int, chunk_size: int = 4) -> tuple[int, ...]:
    """Ids of the chunks over the first `num_tokens` tokens of `content`; chunk k is named by content[:(k+1)*chunk]
    (a session's full content, so a turn's partial last chunk has the name the next turn gives it)."""
    return tuple(_IDS.setdefault(tuple(content[:start + chunk_size]), len(_IDS))
                 for start in range(0, num_tokens, chunk_size))


def request(arrival_s: float, finish_s: float, content: list[str], num_prompt: int, num_output: int,
            session: str | None = None, continues: int | None = None, chunk_size: int = 4,
            parent: str | None = None) -> CacheRequest:
    """A request whose prompt is content[:num_prompt], answered by content[num_prompt:num_prompt + num_output]."""
    return CacheRequest(arrival_s, finish_s, num_prompt, num_output,
                        chunk_ids(content, num_prompt + num_output, chunk_size), session, continues, parent)


def recording(base: type) -> type:
    """`base` (a free-list class) that records every pop as (time, block id, name of the evicted block or None)."""

    class Recording(base):
        def bind(self, pool) -> None:
            self.pool, self.pops, self.time_s = pool, [], 0.0
            if hasattr(super(), "bind"):
                super().bind(pool)

        def pop(self) -> int:
            block_id = super().pop()
            self.pops.append((self.time_s, block_id, self.pool.key_of.get(block_id)))
            return block_id

        def note_admit(self, session, now_s, index, *parent) -> None:
            self.time_s = now_s
            super().note_admit(session, now_s, index, *parent)

    return Recording
