"""The simulated engine: vLLM v1's scheduler over a modelled node, replaying a workload by its schedule.

Each step, in vLLM's order: every decoding request gets its verification (1 + K tokens, K draft_length's for the
number of requests running) while the token budget lasts (decode first; its blocks grown first, the newest
running request preempted when they run out), then running prefills their next chunk, then waiting requests are
admitted in release order while the budget,
`max_num_seqs` and the cache allow; the step takes `StepModel`'s time. Admission and block allocation go through
`opts.cache_retention`'s hybrid pool (a request's hit is its cached prefix), so cache_retention's modes act
here as in the pool's replays. A verification's accepted drafts are drawn from the acceptance model, seeded per
request. Stretches of steps that differ only in their contexts and one prefill's chunks are priced at once,
exactly as step by step (README.md, "The engine").
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from threadpoolctl import threadpool_limits

from ablations.backends.sim.step_model import DraftSteps, StepModel
from ablations.metrics import RequestRecord, cache_hit_rate
from ablations.workload.cache_stream import continuations
from ablations.workload.schedule import ClosedLoopSchedule, OpenLoopSchedule
from ablations.workload.trace import Trace
from opts.k3.cache import CapacityError, HybridPool, Resume, no_cycle_collection, request_keys
from opts.k3.cache.geometry import CacheGeometry
from opts.k3.cache.stream import CacheRequest


@dataclass(frozen=True)
class SchedulerConfig:
    """vLLM's scheduler limits: tokens per step (`max_num_batched_tokens`, chunked prefill) and requests running
    at once (`max_num_seqs`)."""

    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256

    def __post_init__(self) -> None:
        for name in ("max_num_batched_tokens", "max_num_seqs"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"scheduler.{name}: invalid value {value!r}; valid: an integer >= 1")


@dataclass
class EngineStats:
    """What the engine did: iterations (a step, or a stretch of steps priced at once), steps (how many priced in a
    stretch; how many prefilled beside decodes, and their time), busy time, drafts proposed and accepted,
    preemptions, the smallest ratio of a step's time to its roofline (never below 1), the cache."""

    num_iterations: int = 0
    num_steps: int = 0
    num_stretch_steps: int = 0
    num_mixed_steps: int = 0
    mixed_s: float = 0.0
    num_preemptions: int = 0
    busy_s: float = 0.0
    min_roofline_ratio: float = math.inf
    drafts: int = 0
    accepted: int = 0
    cache: dict = field(default_factory=dict)


@dataclass(eq=False)      # a run is itself: list membership by identity
class _Run:
    rid: int
    request: CacheRequest    # as the pool holds it (after a preemption: its prompt is all it had computed)
    prompt: int
    output: int
    computed: int
    hit: int
    arrival_s: float
    acc: np.ndarray          # drafts each decode step would accept were its K unbounded (the step accepts min(acc, K))
    cum: np.ndarray = None   # tokens emitted after the first, cumulated over decode steps (capped at output - 1)
    steps: int = 0           # decode steps to finish at the K of `k`
    done: int = 0
    k: int = -1              # the K `cum` and `steps` hold from step `done` on
    first_s: float = math.nan

    @property
    def target(self) -> int:
        """Tokens the (re)prefill computes."""
        return self.request.num_prompt_tokens

    def emitted(self, steps: int) -> int:
        """Tokens after the first emitted by this run's first `steps` decode steps."""
        return int(self.cum[steps - 1]) if steps else 0

    def use_k(self, k: int) -> None:
        """Verify `k` drafts per step from now on: the emitted tokens and steps to finish from step `done`."""
        if k == self.k:
            return
        rest = self.output - 1
        base = self.emitted(self.done)
        tail = np.minimum(base + np.cumsum(1 + np.minimum(self.acc[self.done:], k)), rest)
        self.cum = tail if self.cum is None else np.concatenate((self.cum[:self.done], tail))
        self.steps = self.done + (int(np.searchsorted(tail, rest)) + 1 if rest > base else 0)
        self.k = k


def uniforms(seed: int, stream: int, count: int) -> np.ndarray:
    """`count` uniforms in [0, 1) of stream `stream` under `seed`: SplitMix64 of a Weyl sequence (Steele, Lea and
    Flood, 2014), one call per request instead of seeding a generator per request."""
    golden = np.uint64(0x9E3779B97F4A7C15)
    with np.errstate(over="ignore"):
        start = np.uint64((seed * 0x632BE59BD9B4E019 + stream * 0xD1B54A32D192ED03 + 1) % 2**64)
        x = start + golden * np.arange(1, count + 1, dtype=np.uint64)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
    return (x >> np.uint64(11)).astype(np.float64) * 2.0**-53


def accepted_draws(seed: int, rid: int, alphas: Sequence[float], num_steps: int) -> np.ndarray:
    """Accepted drafts per verification for request `rid`: draft j is accepted, given 1..j-1 were, with
    probability alphas[j-1], so at least j are accepted with probability c_j = alphas[0]···alphas[j-1]; one
    uniform u per step gives #{j: u < c_j} (the c_j fall: the number of -c_j below -u). A stream of its own per
    (seed, request): the draws never depend on the batch."""
    if not alphas:
        return np.zeros(num_steps, dtype=np.int64)
    u = uniforms(seed, rid, num_steps)
    return np.searchsorted(-np.cumprod(alphas), -u, side="left").astype(np.int64)


def _schedule(trace: Trace, concurrency: int | None):
    if trace.has_sessions:
        return ClosedLoopSchedule(trace, start="zero", max_live_sessions=concurrency)
    return OpenLoopSchedule(trace)


def simulate(trace: Trace, model: StepModel | DraftSteps, geometry: CacheGeometry, num_blocks: int, free_list, *,
             resume: Resume | None, alphas: Sequence[float] = (), scheduler: SchedulerConfig = SchedulerConfig(),
             concurrency: int | None = None, seed: int = 0, stretches: bool = True,
             keys: list[list] | None = None) -> tuple[list[RequestRecord], EngineStats]:
    """Replay `trace` (closed loop over its sessions, at most `concurrency` live; a trace without sessions at its
    timestamps) through the engine; per-request records in trace order and the engine's stats. `model`: the step
    model of one draft length K, or `DraftSteps` (a model per K and the K of each batch size). `alphas`: the
    conditional acceptance rates of the largest K's drafts (empty without speculation). `keys`:
    `trace_keys(trace, geometry.block_size)`, when several replays of the trace share them. `stretches=False`
    prices every step on its own (the reference the stretches are tested against)."""
    steps = model if isinstance(model, DraftSteps) else DraftSteps.fixed(model)
    k = steps.max_k
    if len(alphas) != k:
        raise ValueError(f"alphas: {len(alphas)} rates for {k} drafts per step")
    q = 1 + k
    if scheduler.max_num_batched_tokens < q:
        raise ValueError(f"scheduler.max_num_batched_tokens: {scheduler.max_num_batched_tokens} is less than one "
                         f"verification ({q} tokens)")
    # the step model's matrices are small ([steps, 2 features] x [2 features, passes]): OpenBLAS's threads spin
    # between them and cost more CPU than they save (README.md, "The engine")
    with no_cycle_collection(), threadpool_limits(1, user_api="blas"):
        engine = _Engine(trace, steps, geometry, num_blocks, free_list, resume, tuple(alphas), scheduler, seed,
                         stretches)
        if keys is not None:
            if len(keys) != len(trace.requests):
                raise ValueError(f"keys: {len(keys)} lists for {len(trace.requests)} requests")
            engine.keys = dict(enumerate(keys))
        return engine.run(_schedule(trace, concurrency))


def prefill_chunk(start: int, target: int, budget: int, block_size: int, max_num_batched_tokens: int,
                  stops: Sequence[int] = ()) -> int:
    """Tokens a prefill at `start` of `target` computes with `budget` tokens left in the step: vLLM's split for a
    hybrid model in "align" mode (`scheduler._mamba_block_aligned_split`). A chunk short of the target ends on a
    block boundary when it crosses one, or when a block fits in a step (then possibly 0: nothing fits); one that
    starts inside a block stops at its end; none runs past a stop."""
    end = min(start + budget, target)
    if end < target:
        aligned = end // block_size * block_size
        if aligned > start or block_size <= max_num_batched_tokens:
            end = aligned
    inside = [s for s in stops if start < s < end]
    if start % block_size:
        inside.append(min((start // block_size + 1) * block_size, end))
    return max(min(inside, default=end) - start, 0)


def cache_requests(trace: Trace) -> list[CacheRequest]:
    """The trace's requests as the pool sees them, in trace order (`continues`: the trace index of the turn a
    request continues); times are the engine's, not these."""
    previous_of, ids = continuations(trace)
    return [CacheRequest(0.0, 0.0, r.input_length, r.output_length, ids[i], r.session, previous_of.get(i),
                         r.parent_session) for i, r in enumerate(trace.requests)]


def trace_keys(trace: Trace, block_size: int) -> list[list]:
    """The pool's block names of every request of `trace` at `block_size` (what every replay of it names)."""
    return [request_keys(r, i, block_size, trace.block_size) for i, r in enumerate(cache_requests(trace))]


class _Engine:
    def __init__(self, trace, steps, geometry, num_blocks, free_list, resume, alphas, scheduler, seed, stretches):
        self.trace, self.steps, self.alphas, self.scheduler, self.seed = trace, steps, alphas, scheduler, seed
        self.stretches = stretches
        self.pool = HybridPool(geometry, num_blocks, free_list, resume=resume, chunk_size=trace.block_size,
                               speculative=steps.max_k > 0, progressive=True)
        self.session_aware = hasattr(free_list, "bind")
        if self.session_aware:
            free_list.bind(self.pool)
        self.requests = cache_requests(trace)
        self.stats = EngineStats()
        self.keys: dict[int, list] = {}

    def _new_run(self, rid: int, hit: int, arrival_s: float, k: int) -> _Run:
        r = self.requests[rid]
        acc = accepted_draws(self.seed, rid, self.alphas, max(r.num_output_tokens - 1, 1))
        run = _Run(rid, r, r.num_prompt_tokens, r.num_output_tokens, hit, hit, arrival_s, acc)
        run.use_k(k)
        return run

    def _keys(self, rid: int) -> list:
        keys = self.keys.get(rid)
        if keys is None:
            keys = self.keys[rid] = request_keys(self.requests[rid], rid, self.pool.block_size, self.pool.chunk_size)
        return keys

    def _admit(self, rid: int, request: CacheRequest, now: float) -> int | None:
        """The pool admits `request` with blocks for its prompt (the rest comes as it decodes), or None."""
        pool = self.pool
        if pool.blocks_needed(request, 0) > pool.num_blocks:
            raise CapacityError(f"{self.trace.source or 'trace'}: request {rid} ({request.num_prompt_tokens} prompt + "
                                f"{request.num_output_tokens} output tokens) needs {pool.blocks_needed(request, 0)} "
                                f"blocks of {pool.block_size} tokens; the pool has {pool.num_blocks}")
        r = self.requests[rid]
        previous = self.requests[r.continues] if r.continues is not None else None
        return pool.admit(rid, request, self._keys(rid), previous, now, upto=request.num_prompt_tokens,
                          readmit=request is not r)

    def _chunk(self, run: _Run, budget: int, start: int | None = None) -> int:
        """`prefill_chunk` of `run` from `start` (default: what it has computed) with `budget` tokens left."""
        return prefill_chunk(run.computed if start is None else start, run.target, budget, self.pool.block_size,
                             self.scheduler.max_num_batched_tokens, self.pool.prefill_stops(run.rid))

    def _hit(self, rid: int, request: CacheRequest) -> int:
        """The cached prefix `request` would get now (nothing allocated)."""
        r = self.requests[rid]
        previous = self.requests[r.continues] if r.continues is not None else None
        return self.pool.find_hit(request, self._keys(rid), previous)[0]

    def _grow(self, run: _Run, upto: int) -> bool:
        return self.pool.grow(run.rid, run.request, self._keys(run.rid), upto)

    def _stretch(self, batch: list[_Run], chunks: list[tuple[_Run, int]], budget_left: int,
                 waiting: bool) -> tuple[int, list[int]]:
        """How many steps from now are alike but for their contexts and one prefill's chunk sizes, and those
        sizes: none of the batch finishes before the last, and either no prefill runs or one prefill runs its
        chunks of the budget the decodes leave, up to its last (a release due cuts the stretch: `_step`). A later
        step's chunk may leave budget only where nothing would take it (no queue, no other prefill), or where it
        leaves what this step's does."""
        steps = min((run.steps - run.done for run in batch), default=math.inf)
        if not chunks:
            return max(int(steps), 1), []
        (run, chunk), *others = chunks
        if others or (budget_left and waiting):
            return 1, [chunk]
        budget = chunk + budget_left
        unclaimed = not waiting and len(self._prefilling) == 1
        sizes, start = [chunk], run.computed + chunk
        while start < run.target and len(sizes) < steps:
            size = self._chunk(run, budget, start)
            if not size or (budget - size != budget_left and not unclaimed):
                break
            sizes.append(size)
            start += size
        return len(sizes), sizes

    @staticmethod
    def _chunk_rows(model: StepModel, run: _Run, sizes: list[int], num_decodes: int, context: np.ndarray,
                    q: int) -> np.ndarray:
        """Feature rows of a stretch's steps whose prefill `run` computes `sizes` (one per step): one
        `batch_features` call per run of equal sizes."""
        parts, start, cached = [], 0, run.computed
        for size, group in itertools.groupby(sizes):
            n = len(list(group))
            parts.append(model.batch_features([(size, cached + size * np.arange(n))], num_decodes,
                                              context[start:start + n], q))
            start, cached = start + n, cached + size * n
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def _grow_stretch(self, batch: list[_Run], steps: int, q: int) -> int:
        """Allocate the blocks the batch's verifications need over steps 1..steps-1 of a stretch, in the order
        step by step would (by step, then batch order); the steps that can run before an allocation fails. A run
        needs `pool.grow` when its tokens (computed + 1 + K) pass a block boundary or reach its last token."""
        size = self.pool.block_size
        events = []
        for pos, run in enumerate(batch):
            processed = run.request.num_processed_tokens
            grown = run.cum[run.done:run.done + steps - 1]      # tokens after step j + 1, less those before
            offset = run.computed + q - run.emitted(run.done)   # upto at step j = offset + grown[j - 1]
            block = self.pool.running[run.rid].next_block
            while True:
                need = min(block * size + 1, processed)             # the next upto that allocates (or ends)
                j = int(np.searchsorted(grown, need - offset))      # first index with offset + grown >= need
                if j >= grown.size or block > processed // size:
                    break
                upto = min(offset + int(grown[j]), processed)
                events.append((j + 1, pos, upto))
                if upto == processed:
                    break
                block = (upto - 1) // size + 1
        for j, pos, upto in sorted(events):
            if not self._grow(batch[pos], upto):
                return j
        return steps

    def run(self, schedule) -> tuple[list[RequestRecord], EngineStats]:
        """Every request of the trace through the engine as `schedule` releases them: per step, releases join the
        queue (`_release`), the step is scheduled (`_schedule_step`: decodes, prefill chunks, admissions) and run
        (`_step`, several alike at once where a stretch allows), and requests finish (`_finish`)."""
        self._workload = schedule
        self._releases = [(rel.ready_s, rel.request_id) for rel in schedule.initial()]
        heapq.heapify(self._releases)
        self._waiting: deque[tuple[int, float]] = deque()
        self._running: list[_Run] = []        # admission order: vLLM preempts from its end
        self._prefilling: list[_Run] = []
        self._decoding: list[_Run] = []
        self._preempted: dict[int, _Run] = {}
        self._records: dict[int, RequestRecord] = {}
        self._now = 0.0
        self._blocked = False         # the waiting head did not fit: nothing changes that before blocks are freed
        while self._releases or self._waiting or self._running:
            self._release()
            if not (self._waiting or self._running):
                self._now = self._releases[0][0]
                continue
            self._step(*self._schedule_step())
        pool = self.pool
        self.stats.cache = {"hit_rate": cache_hit_rate(list(self._records.values())),
                            "num_evictions": pool.num_evictions, "num_resumes": pool.num_resumes,
                            "num_preemptions": pool.num_preemptions}
        return [self._records[i] for i in range(len(self.requests))], self.stats

    def _release(self) -> None:
        """Releases due by now join the queue (a session-aware free order notes their arrival)."""
        releases = self._releases
        while releases and releases[0][0] <= self._now:
            ready, rid = heapq.heappop(releases)
            r = self.requests[rid]
            self.pool.free.note_admit(r.session, ready, rid, r.parent)
            self._waiting.append((rid, ready))

    def _schedule_step(self) -> tuple[list[_Run], list[tuple[_Run, int]], int, int, int]:
        """vLLM v1's order: running decodes first (each growing its blocks, preempting the newest when they run
        out), then running prefills' chunks, then admissions from the queue while budget and sequences last. The
        decode batch, the prefill chunks, the budget left, the step's K and the preemptions before it."""
        sched, running, decoding = self.scheduler, self._running, self._decoding
        budget = sched.max_num_batched_tokens
        batch: list[_Run] = []
        num_preempted = self.stats.num_preemptions
        # vLLM sets the next step's K from the requests it scheduled: those running now
        k = self.steps.k(len(running)) if running else self.steps.k(1)
        q = 1 + k
        for run in list(decoding):
            if budget < q:
                break
            if run not in decoding:         # preempted for an earlier one this step
                continue
            run.use_k(k)
            while not self._grow(run, run.computed + q):
                victim = running[-1]
                if victim in batch:
                    batch.remove(victim)
                    budget += q
                self._preempt(victim)
                if victim is run:
                    break
            if run in decoding:
                batch.append(run)
                budget -= q
        chunks: list[tuple[_Run, int]] = []
        for run in self._prefilling:
            if not budget:
                break
            chunk = self._chunk(run, budget)
            if chunk:
                chunks.append((run, chunk))
                budget -= chunk
        budget = self._admit_waiting(chunks, budget, k, num_preempted)
        return batch, chunks, budget, k, num_preempted

    def _admit_waiting(self, chunks: list[tuple[_Run, int]], budget: int, k: int, num_preempted: int) -> int:
        """Admit from the queue's head while a block-aligned chunk fits the budget and the pool its blocks, each
        admitted request's first chunk added to `chunks`; vLLM admits nothing in a step that preempts. The budget
        left."""
        sched, pool, waiting = self.scheduler, self.pool, self._waiting
        while (waiting and budget and not self._blocked and len(self._running) < sched.max_num_seqs
               and self.stats.num_preemptions == num_preempted):
            rid, ready = waiting[0]
            run = self._preempted.get(rid)
            request = run.request if run else self.requests[rid]
            # a budget of a block or more fits a chunk whatever the hit (`prefill_chunk`): no lookup needed
            if budget < pool.block_size and not prefill_chunk(self._hit(rid, request), request.num_prompt_tokens,
                                                              budget, pool.block_size, sched.max_num_batched_tokens):
                break       # vLLM: no block-aligned chunk fits the budget left; the queue waits a step
            hit = self._admit(rid, request, self._now)
            if hit is None:
                self._blocked = True
                break
            waiting.popleft()
            if run:
                del self._preempted[rid]
                run.computed = hit
            else:
                run = self._new_run(rid, hit, ready, k)
            self._running.append(run)
            self._prefilling.append(run)
            chunk = self._chunk(run, budget)
            chunks.append((run, chunk))
            budget -= chunk
        return budget

    def _step(self, batch: list[_Run], chunks: list[tuple[_Run, int]], budget: int, k: int,
              num_preempted: int) -> None:
        """Run the scheduled step (and the steps alike after it, a stretch) and advance time, the runs and the
        stats; finish the requests that end."""
        if not (batch or chunks):
            if self._running:
                raise RuntimeError(f"sim engine: nothing schedulable at {self._now:.3f} s with {len(self._running)} "
                                   "running")
            rid = self._waiting[0][0]
            r = self.requests[rid]
            raise CapacityError(f"{self.trace.source or 'trace'}: request {rid} ({r.num_prompt_tokens} prompt + "
                                f"{r.num_output_tokens} output tokens) does not fit in the {self.pool.num_blocks} "
                                f"blocks the cached prefixes leave")
        model, q = self.steps.models[k], 1 + k
        # a step that preempted admitted nothing: the next one tries the queue again; one that admitted a request
        # may change the next one's K
        alike = (self.stretches and self.stats.num_preemptions == num_preempted
                 and self.steps.k(len(self._running)) == k)
        steps, sizes = self._stretch(batch, chunks, budget, bool(self._waiting)) if alike else (1, [])
        num_decodes = len(batch)
        base = sum(run.computed for run in batch)
        context = np.full(steps, float(base))
        for run in batch if steps > 1 else ():
            context[1:] += run.cum[run.done:run.done + steps - 1] - run.emitted(run.done)
        if steps > 1 and chunks:     # one prefill's chunks, its context grown by those before
            rows = self._chunk_rows(model, chunks[0][0], sizes, num_decodes, context, q)
        else:
            rows = model.batch_features([(chunk, run.computed) for run, chunk in chunks], num_decodes, context, q)
        # the reference (step by step) prices with the step model's own `times`, the stretches with `price`
        durations, roofs = model.price(rows) if self.stretches else (model.times(rows), model.rooflines(rows))
        # a release due is admitted by the first step after it whose chunk leaves budget
        left = budget or (steps > 1 and chunks and min(sizes) < sizes[0] + budget)
        admissible = left and not self._blocked and len(self._running) < self.scheduler.max_num_seqs
        # a release is admitted at the first step after it; a session-aware free order also notes its arrival
        releases = self._releases
        if steps > 1 and releases and (admissible or self.session_aware):
            starts = self._now + np.concatenate(([0.0], np.cumsum(durations[:-1])))
            steps = max(1, int(np.searchsorted(starts, releases[0][0], side="left")))
        if steps > 1:       # the blocks the stretch's later verifications need, or fewer steps
            steps = max(1, self._grow_stretch(batch, steps, q))
        durations, roofs = durations[:steps], roofs[:steps]
        if not self.stats.num_steps and model.first_step_s:       # the host's one-time work (hardware.py)
            durations = durations.copy()
            durations[0] += model.first_step_s
        self.stats.min_roofline_ratio = min(self.stats.min_roofline_ratio,
                                            float((durations / roofs).min()))
        self._now += float(durations.sum())
        self.stats.num_iterations += 1
        self.stats.num_steps += steps
        self.stats.num_stretch_steps += steps if steps > 1 else 0
        if chunks and batch:
            self.stats.num_mixed_steps += steps
            self.stats.mixed_s += float(durations.sum())
        self.stats.busy_s += float(durations.sum())
        for run in batch:
            before = run.emitted(run.done)
            run.done += steps
            run.computed += run.emitted(run.done) - before
        self.stats.drafts += steps * num_decodes * (q - 1)
        done = [run for run in batch if run.done == run.steps]
        for run, chunk in chunks:
            run.computed += sum(sizes[:steps]) if steps > 1 else chunk
            self.pool.progress(run.rid, run.computed)
            if run.computed == run.target:
                if math.isnan(run.first_s):
                    run.first_s = self._now
                self._prefilling.remove(run)
                if run.done < run.steps:
                    self._decoding.append(run)
                else:
                    done.append(run)
        for run in done:
            if run in self._decoding:
                self._decoding.remove(run)
            self._finish(run, self._now)

    def _finish(self, run: _Run, t: float) -> None:
        """The request ends at `t`: its blocks freed (or kept for a resume), its record written, the requests it
        releases queued."""
        if run.computed != run.request.num_processed_tokens:      # every token computed once, or again after
            raise RuntimeError(f"sim engine: request {run.rid} finished with {run.computed} of its "
                               f"{run.request.num_processed_tokens} tokens computed")
        self.stats.accepted += max(run.output - 1 - run.steps, 0)
        self.pool.finish(run.rid, run.request, t)
        self._running.remove(run)
        self._records[run.rid] = RequestRecord(run.arrival_s, run.first_s, t, run.prompt, run.output, run.hit)
        self._blocked = False
        for rel in self._workload.on_finish(run.rid, t):
            heapq.heappush(self._releases, (rel.ready_s, rel.request_id))

    def _preempt(self, run: _Run) -> None:
        """vLLM's recompute preemption: the blocks freed, back to the head of the queue; admitted again, it
        prefills all it had computed (from what is still cached) and decodes on."""
        self.pool.preempt(run.rid, run.computed)
        self._running.remove(run)
        (self._decoding if run in self._decoding else self._prefilling).remove(run)
        r = self.requests[run.rid]
        target = max(run.computed, run.target)      # a re-prefill preempted again keeps its target
        run.request = dataclasses.replace(r, num_prompt_tokens=target,
                                          num_output_tokens=r.num_processed_tokens + 1 - target)
        self._preempted[run.rid] = run
        self._waiting.appendleft((run.rid, run.arrival_s))
        self.stats.num_preemptions += 1
        self._blocked = False
