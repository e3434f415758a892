"""AgentX-like agentic sessions: shared system prompt, growing contexts, sub-agents, think times.

Each session is a context that only grows: turn n's prompt is turn n-1's prompt + its answer + a new tool
result. The context is cut into blocks; a block gets a fresh hash id when it fills, so every prompt built
on the same context shares its full blocks. A prompt's partial last block gets a fresh id of its own:
it is never shared (the next turn fills that block with different tokens). See README.md.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace
from statistics import NormalDist
from typing import Any

import numpy as np

from ablations.workload.schedule import ClosedLoopSchedule, simulate
from ablations.workload.trace import Request, Trace
from opts.base import check_known_fields

FORK_POINTS = ("first_prompt", "spawn_point")


@dataclass(frozen=True)
class LogNormal:
    """A log-normal draw, `median * exp(sigma * Z)`, clipped to [low, high]; mean (unclipped) median*e^(σ²/2)."""

    median: float
    sigma: float
    low: float
    high: float

    def __post_init__(self) -> None:
        if not self.median > 0:
            raise ValueError(f"LogNormal.median: {self.median!r} is not > 0")
        if not self.sigma >= 0:
            raise ValueError(f"LogNormal.sigma: {self.sigma!r} is not >= 0")
        if not 0 <= self.low <= self.median <= self.high:
            raise ValueError(f"LogNormal: need 0 <= low <= median <= high, got low={self.low!r}, "
                             f"median={self.median!r}, high={self.high!r}")

    def sample(self, rng: np.random.Generator) -> float:
        return float(np.clip(self.median * math.exp(self.sigma * rng.standard_normal()), self.low, self.high))

    def quantile(self, u: float) -> float:
        z = NormalDist().inv_cdf(min(max(u, 1e-12), 1 - 1e-12))
        return float(np.clip(self.median * math.exp(self.sigma * z), self.low, self.high))

    def tokens(self, rng: np.random.Generator) -> int:
        return max(1, round(self.sample(rng)))


@dataclass(frozen=True)
class GeneratorConfig:
    """Shape of a generated agentic workload. Token counts are tokens; times are seconds.

    A root session starts from the shared system prompt plus a `first_message`, and grows to a drawn
    `final_context` (its last prompt's length) at a drawn pace of `growth` tokens per turn (answer plus
    tool result); its turn count follows, within [`min_turns`, `max_turns`]. Both draws are quasi-random
    (a randomly shifted 2-D Halton sequence), so the sessions, and every prefix of them, spread over the
    two distributions evenly whatever the seed. A turn's tool result keeps the session on pace, times a
    mean-one log-normal factor of spread `tool_noise_sigma`, at least `min_tool_result`. A root session
    spawns sub-agents at `subagent_probability` of its non-final turns (the count rounded at random, so
    its mean is exact; the turns drawn without replacement), 1..`max_subagents` at a time; each forks
    the parent at `subagent_fork` ("first_prompt": the parent's first prompt, system prompt and first
    message, as a coding agent's sub-agent starts fresh with the project context; "spawn_point":
    everything up to and including the spawning answer), adds a `subagent_task` and runs
    `subagent_turns` turns with `subagent_tool_result` tool results; their final answers are the
    parent's next tool result. Root sessions start over [0, `ramp_s`]. `nominal_*` only set the written
    timestamps: a closed-loop replay served at those rates with no queueing. README.md has the math.
    """

    num_sessions: int
    block_size: int
    system_prompt_tokens: int
    first_message: LogNormal
    final_context: LogNormal
    growth: LogNormal
    min_turns: int
    max_turns: int
    output: LogNormal
    tool_noise_sigma: float
    min_tool_result: int
    think_s: LogNormal
    subagent_probability: float
    max_subagents: int
    subagent_turns: LogNormal
    subagent_task: LogNormal
    subagent_tool_result: LogNormal
    subagent_fork: str
    max_context_tokens: int
    ramp_s: float
    nominal_decode_tok_s: float
    nominal_prefill_tok_s: float

    def __post_init__(self) -> None:
        for name in ("num_sessions", "block_size", "system_prompt_tokens", "min_turns", "max_turns",
                     "min_tool_result", "max_subagents", "max_context_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"GeneratorConfig.{name}: {value!r} is not an integer >= 1")
        if self.max_turns < self.min_turns:
            raise ValueError(f"GeneratorConfig.max_turns: {self.max_turns} is below min_turns {self.min_turns}")
        if self.subagent_fork not in FORK_POINTS:
            raise ValueError(f"GeneratorConfig.subagent_fork: invalid value {self.subagent_fork!r}; valid choices: "
                             f"{', '.join(FORK_POINTS)}")
        if not 0 <= self.subagent_probability <= 1:
            raise ValueError(f"GeneratorConfig.subagent_probability: {self.subagent_probability!r} is not in [0, 1]")
        for name in ("ramp_s", "tool_noise_sigma"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"GeneratorConfig.{name}: {getattr(self, name)!r} is not >= 0")
        for name in ("nominal_decode_tok_s", "nominal_prefill_tok_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"GeneratorConfig.{name}: {getattr(self, name)!r} is not > 0")
        if self.subagent_turns.low < 1:
            raise ValueError(f"GeneratorConfig.subagent_turns.low: {self.subagent_turns.low!r} is not >= 1")
        longest_first = self.system_prompt_tokens + self.first_message.high + self.output.high
        if longest_first > self.max_context_tokens:
            raise ValueError(f"GeneratorConfig.max_context_tokens: {self.max_context_tokens} cannot hold the "
                             f"longest first turn (system + first_message.high + output.high = {longest_first:g})")

    def with_overrides(self, **values: Any) -> GeneratorConfig:
        """A copy with some fields replaced (unknown names are an error naming the valid ones)."""
        check_known_fields(GeneratorConfig, values)
        return replace(self, **values)


class _Context:
    """A growing token stream: hash ids of its full blocks, and how many tokens sit in the partial block."""

    __slots__ = ("block_size", "full", "ids", "tail")

    def __init__(self, ids: itertools.count, block_size: int, full: list[int] | None = None, tail: int = 0):
        self.ids = ids
        self.block_size = block_size
        self.full = [] if full is None else full
        self.tail = tail

    @property
    def length(self) -> int:
        return len(self.full) * self.block_size + self.tail

    def extend(self, num_tokens: int) -> None:
        total = self.tail + num_tokens
        self.full.extend(itertools.islice(self.ids, total // self.block_size))
        self.tail = total % self.block_size

    def prompt_ids(self) -> tuple[int, ...]:
        return (*self.full, next(self.ids)) if self.tail else tuple(self.full)

    def fork(self) -> _Context:
        return _Context(self.ids, self.block_size, list(self.full), self.tail)


@dataclass
class _Turn:
    request: Request
    new_tokens: int


@dataclass(frozen=True)
class _Plan:
    """A session's shape: how many turns, the context it grows to (0: a sub-agent, whose tool results are
    drawn instead), and the turns that spawn sub-agents."""

    num_turns: int
    final_context: int
    spawn_turns: frozenset[int]

    @property
    def is_root(self) -> bool:
        return self.final_context > 0


class _SessionBuilder:
    def __init__(self, config: GeneratorConfig, rng: np.random.Generator):
        self.config = config
        self.rng = rng
        self.turns: list[_Turn] = []

    def _tool_result(self, plan: _Plan, context: _Context, turn: int, output: int) -> int:
        c = self.config
        if not plan.is_root:
            return c.subagent_tool_result.tokens(self.rng)
        remaining_turns = plan.num_turns - 1 - turn
        pace = (plan.final_context - context.length) / remaining_turns + output
        noise = math.exp(c.tool_noise_sigma * self.rng.standard_normal() - c.tool_noise_sigma ** 2 / 2)
        return max(c.min_tool_result, round(pace * noise) - output)

    def run(self, session: str, context: _Context, new_tokens: int, plan: _Plan, start_ms: float,
            parent: tuple[str, int] | None) -> int:
        """Append a session's turns; returns its final answer's length. The first turn always fits
        (the config and the spawn check make room for it)."""
        c = self.config
        output = 0
        num_subagents = 0
        first_prompt = context.fork()
        for turn in range(plan.num_turns):
            output = c.output.tokens(self.rng)
            if context.length + output > c.max_context_tokens:
                break
            think_ms = 0.0 if turn == 0 and parent is None else round(c.think_s.sample(self.rng) * 1000)
            self.turns.append(_Turn(Request(
                timestamp_ms=start_ms if turn == 0 and parent is None else 0.0,
                input_length=context.length, output_length=output, hash_ids=context.prompt_ids(),
                session=session, turn=turn, think_ms=think_ms,
                parent_session=None if parent is None else parent[0],
                parent_turn=None if parent is None else parent[1]), new_tokens))
            context.extend(output)
            if turn == plan.num_turns - 1:
                break
            room = c.max_context_tokens - context.length - c.subagent_task.high - c.output.high
            if turn in plan.spawn_turns and room >= 0:
                result = 0
                for _ in range(int(self.rng.integers(1, c.max_subagents + 1))):
                    at_spawn = c.subagent_fork == "spawn_point"
                    child = (context if at_spawn else first_prompt).fork()
                    task = c.subagent_task.tokens(self.rng)
                    child.extend(task)
                    child_plan = _Plan(round(c.subagent_turns.sample(self.rng)), 0, frozenset())
                    result += self.run(f"{session}.a{num_subagents}", child, task + (output if at_spawn else 0),
                                       child_plan, 0.0, (session, turn))
                    num_subagents += 1
            else:
                result = self._tool_result(plan, context, turn, output)
            context.extend(result)
            new_tokens = result + output
        return output


def _radical_inverse(k: int, base: int) -> float:
    """k's digits in `base` mirrored behind the point: the van der Corput sequence (k = 0, 1, 2, ...)."""
    value, scale = 0.0, 1.0 / base
    while k:
        k, digit = divmod(k, base)
        value += digit * scale
        scale /= base
    return value


def _spread(dist: LogNormal, n: int, base: int, rng: np.random.Generator) -> list[float]:
    """n draws of `dist` at a randomly shifted Halton sequence: any first m of them cover [0, 1) evenly."""
    shift = rng.random()
    return [dist.quantile((_radical_inverse(k + 1, base) + shift) % 1.0) for k in range(n)]


def generate(config: GeneratorConfig, seed: int = 0) -> Trace:
    """A seeded, deterministic AgentX-like trace in the session form, in arrival order."""
    c = config
    rng = np.random.default_rng(seed)
    session_rngs = [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(c.num_sessions)]
    finals = _spread(c.final_context, c.num_sessions, 2, rng)
    paces = _spread(c.growth, c.num_sessions, 3, rng)
    starts_ms = [round((k + rng.random()) / c.num_sessions * c.ramp_s * 1000) for k in range(c.num_sessions)]
    ids = itertools.count()
    system = _Context(ids, c.block_size)
    system.extend(c.system_prompt_tokens)
    turns: list[_Turn] = []
    for k in range(c.num_sessions):
        builder = _SessionBuilder(c, session_rngs[k])
        context = system.fork()
        first = c.first_message.tokens(session_rngs[k])
        context.extend(first)
        final = min(max(round(finals[k]), context.length), c.max_context_tokens - round(c.output.high))
        num_turns = min(max(round((final - context.length) / paces[k]) + 1, c.min_turns), c.max_turns)
        expected = c.subagent_probability * (num_turns - 1)
        num_spawns = int(expected + session_rngs[k].random())
        spawn_turns = frozenset(session_rngs[k].choice(num_turns - 1, size=num_spawns, replace=False).tolist())
        builder.run(f"s{k:04d}", context, first, _Plan(num_turns, final, spawn_turns), starts_ms[k], None)
        turns.extend(builder.turns)
    draft = Trace(tuple(t.request for t in turns), c.block_size)
    service = [t.new_tokens / c.nominal_prefill_tok_s + t.request.output_length / c.nominal_decode_tok_s
               for t in turns]
    times = simulate(ClosedLoopSchedule(draft), service.__getitem__)
    stamped = [replace(t.request, timestamp_ms=round(ready * 1000)) for t, (ready, _) in zip(turns, times, strict=True)]
    order = sorted(range(len(stamped)), key=lambda i: stamped[i].timestamp_ms)
    return Trace(tuple(stamped[i] for i in order), c.block_size)
