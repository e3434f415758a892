"""The trace model: requests (arrival, lengths, block hash ids) grouped into sessions of turns.

A request's prompt is `input_length` tokens cut into blocks of `block_size`; `hash_ids[i]` names the
content of block i *and everything before it*, so two prompts share their first k blocks exactly when
their first k hash ids are equal. The last block may be partial.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

DEFAULT_BLOCK_SIZE = 512


class TraceError(ValueError):
    """A trace that breaks the model; the message names the file, line and field where known."""


def where(source: str | None, line: int | None) -> str:
    """`file:line: ` prefix for an error message (empty parts left out)."""
    if source is None:
        return "" if line is None else f"line {line}: "
    return f"{source}: " if line is None else f"{source}:{line}: "


def num_blocks(num_tokens: int, block_size: int) -> int:
    """Blocks needed to hold `num_tokens` tokens (the last one may be partial)."""
    return math.ceil(num_tokens / block_size)


@dataclass(frozen=True)
class Request:
    """One request. `timestamp_ms` is the arrival in ms since the trace start (Mooncake's `timestamp`).

    Session fields are None for a trace without sessions. `think_ms` is the gap between the request's
    dependencies finishing (previous turn, sub-agents it waited for, or the parent's spawning turn) and
    its release in a closed-loop replay. `parent_session`/`parent_turn` are set on every turn of a
    sub-agent session: the parent turn whose finish releases the sub-agent's first turn.
    """

    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]
    session: str | None = None
    turn: int | None = None
    think_ms: float = 0.0
    parent_session: str | None = None
    parent_turn: int | None = None
    line: int | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.hash_ids, tuple):
            object.__setattr__(self, "hash_ids", tuple(self.hash_ids))
        if not all(type(h) is int for h in self.hash_ids):
            bad = next(h for h in self.hash_ids if type(h) is not int)
            raise TraceError(f"field 'hash_ids': {bad!r} is not an integer")
        for name in ("input_length", "output_length"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise TraceError(f"field {name!r}: {value!r} is not an integer >= 1")
        for name, label in (("timestamp_ms", "timestamp"), ("think_ms", "think_ms")):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
                raise TraceError(f"field {label!r}: {value!r} is not a number >= 0")
        if self.session is not None and not isinstance(self.session, str):
            raise TraceError(f"field 'session': {self.session!r} is not a string")
        if (self.session is None) != (self.turn is None):
            raise TraceError("fields 'session' and 'turn' must be given together")
        if self.turn is not None and (isinstance(self.turn, bool) or not isinstance(self.turn, int)
                                      or self.turn < 0):
            raise TraceError(f"field 'turn': {self.turn!r} is not an integer >= 0")
        if (self.parent_session is None) != (self.parent_turn is None):
            raise TraceError(
                "fields 'parent_session' and 'parent_turn' must be given together")
        if self.parent_session is not None and not isinstance(self.parent_session, str):
            raise TraceError(f"field 'parent_session': {self.parent_session!r} is not a string")
        if self.parent_turn is not None and (isinstance(self.parent_turn, bool)
                                             or not isinstance(self.parent_turn, int) or self.parent_turn < 0):
            raise TraceError(f"field 'parent_turn': {self.parent_turn!r} is not an integer >= 0")
        if self.parent_session is not None and self.session is None:
            raise TraceError("field 'parent_session' needs 'session' and 'turn'")

    @property
    def parent(self) -> tuple[str, int] | None:
        return None if self.parent_session is None else (self.parent_session, self.parent_turn)


@dataclass(frozen=True)
class Session:
    """One agent's conversation: its requests in turn order (indices into `Trace.requests`)."""

    session_id: str
    request_ids: tuple[int, ...]
    parent: tuple[str, int] | None

    @property
    def num_turns(self) -> int:
        return len(self.request_ids)

    @property
    def is_subagent(self) -> bool:
        return self.parent is not None


@dataclass(frozen=True)
class Trace:
    """Requests in arrival (file) order, one block size, and where they came from.

    Validates that every request's hash ids cover exactly its input (len == ceil(input_length /
    block_size)), and that sessions are well formed: turns 0..n-1 each once, sub-agent parents exist
    and are consistent on every row, no session is its own ancestor.
    """

    requests: tuple[Request, ...]
    block_size: int = DEFAULT_BLOCK_SIZE
    source: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.requests, tuple):
            object.__setattr__(self, "requests", tuple(self.requests))
        if isinstance(self.block_size, bool) or not isinstance(self.block_size, int) or self.block_size < 1:
            raise TraceError(f"{where(self.source, None)}block_size: {self.block_size!r} is not an integer >= 1")
        for request in self.requests:
            need = num_blocks(request.input_length, self.block_size)
            if len(request.hash_ids) != need:
                raise TraceError(
                    f"{where(self.source, request.line)}field 'hash_ids': {len(request.hash_ids)} ids, but "
                    f"input_length {request.input_length} at block_size {self.block_size} needs exactly "
                    f"{need} (ceil({request.input_length}/{self.block_size}))")
        has_session = [r.session is not None for r in self.requests]
        if any(has_session) and not all(has_session):
            first = self.requests[has_session.index(False)]
            raise TraceError(f"{where(self.source, first.line)}field 'session' missing; other rows of this "
                             "trace have sessions, so every row needs 'session' and 'turn'")
        if all(has_session) and self.requests:
            _ = self.sessions

    @property
    def has_sessions(self) -> bool:
        return bool(self.requests) and self.requests[0].session is not None

    @cached_property
    def sessions(self) -> dict[str, Session]:
        """Session id -> Session, in order of first appearance. Empty when the trace has no sessions."""
        if not self.has_sessions:
            return {}
        turns: dict[str, dict[int, int]] = {}
        parents: dict[str, tuple[tuple[str, int] | None, Request]] = {}
        for index, request in enumerate(self.requests):
            by_turn = turns.setdefault(request.session, {})
            if request.turn in by_turn:
                other = self.requests[by_turn[request.turn]]
                raise TraceError(f"{where(self.source, request.line)}field 'turn': session {request.session!r} "
                                 f"turn {request.turn} appears twice (also line {other.line})")
            by_turn[request.turn] = index
            known = parents.setdefault(request.session, (request.parent, request))
            if known[0] != request.parent:
                raise TraceError(
                    f"{where(self.source, request.line)}field 'parent_session'/'parent_turn': {request.parent!r} "
                    f"differs from {known[0]!r} on line {known[1].line} of the same session {request.session!r}")
        sessions = {}
        for session_id, by_turn in turns.items():
            missing = sorted(set(range(len(by_turn))) - set(by_turn))
            if missing:
                request = self.requests[by_turn[max(by_turn)]]
                raise TraceError(f"{where(self.source, request.line)}field 'turn': session {session_id!r} has "
                                 f"turns up to {max(by_turn)} but lacks turn(s) {missing[:5]}")
            ids = tuple(by_turn[t] for t in range(len(by_turn)))
            sessions[session_id] = Session(session_id, ids, parents[session_id][0])
        for session in sessions.values():
            self._check_parent(session, sessions)
        return sessions

    def _check_parent(self, session: Session, sessions: dict[str, Session]) -> None:
        seen = {session.session_id}
        current = session
        while current.parent is not None:
            parent_id, parent_turn = current.parent
            line = self.requests[current.request_ids[0]].line
            parent = sessions.get(parent_id)
            if parent is None:
                raise TraceError(f"{where(self.source, line)}field 'parent_session': {parent_id!r} is not a "
                                 "session of this trace")
            if not 0 <= parent_turn < parent.num_turns:
                raise TraceError(f"{where(self.source, line)}field 'parent_turn': {parent_turn} is not a turn "
                                 f"of session {parent_id!r} (it has {parent.num_turns})")
            if parent_id in seen:
                raise TraceError(f"{where(self.source, line)}field 'parent_session': session "
                                 f"{session.session_id!r} is its own ancestor")
            seen.add(parent_id)
            current = parent

    @property
    def root_sessions(self) -> list[Session]:
        return [s for s in self.sessions.values() if s.parent is None]

    def subagents_of(self) -> dict[tuple[str, int], list[str]]:
        """(parent session, turn) -> the sub-agent sessions that turn spawns."""
        children: dict[tuple[str, int], list[str]] = {}
        for session in self.sessions.values():
            if session.parent is not None:
                children.setdefault(session.parent, []).append(session.session_id)
        return children

    @cached_property
    def roots(self) -> dict[str, str]:
        """Session id -> the root session it descends from (itself for a root)."""
        roots: dict[str, str] = {}
        for session in self.sessions.values():
            chain = [session]
            while chain[-1].parent is not None and chain[-1].session_id not in roots:
                chain.append(self.sessions[chain[-1].parent[0]])
            root = roots.get(chain[-1].session_id, chain[-1].session_id)
            for member in chain:
                roots[member.session_id] = root
        return roots

    def head_sessions(self, num_sessions: int) -> Trace:
        """The first `num_sessions` root sessions (in order of first appearance) with all their sub-agents."""
        if not self.has_sessions:
            raise TraceError(f"{where(self.source, None)}head_sessions needs a trace with sessions")
        roots = [s.session_id for s in self.root_sessions]
        if not 1 <= num_sessions <= len(roots):
            raise TraceError(f"num_sessions: {num_sessions} is not in 1..{len(roots)} (the root sessions)")
        keep = set(roots[:num_sessions])
        kept = [r for r in self.requests if self.roots[r.session] in keep]
        return Trace(tuple(kept), self.block_size, self.source)

    def arrival_order(self) -> list[int]:
        """Request indices sorted by timestamp (stable: file order breaks ties)."""
        return sorted(range(len(self.requests)), key=lambda i: self.requests[i].timestamp_ms)


def shared_prefix_blocks(a: Sequence[int], b: Sequence[int]) -> int:
    """Number of leading hash ids two prompts share."""
    count = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        count += 1
    return count

