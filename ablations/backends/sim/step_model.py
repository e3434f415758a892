"""A step's time from a few sums over its requests: the engine's fast path, fitted exactly to the cost model.

`cost.py` is linear in a step's features (README.md, "The fast path"): whether the step runs at all, per kind
of request part (prefill chunk; decode or verification) whether any is present, their count, and the sums of q,
c, q·c and q² (q new tokens, c cached before them), and the experts a step touches, E(T). So each kernel class's
FLOPs, bytes, launches and collective payload are a dot product with those features. `StepModel` fits the
coefficients once from the exact cost model on probe steps, refuses a fit that does not reproduce it, and then
prices a step, or many at once, with a few small matrix products: what `timing.step_time(step_costs(...))`
gives, for a fraction of the time.
"""

from __future__ import annotations

import bisect
import copy
import math
import random
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from ablations.backends.sim.collectives import algorithm_figures, choose, rules, seconds_per_gather_byte
from ablations.backends.sim.cost import (
    STOCK,
    Cost,
    Mechanisms,
    Parallel,
    Seq,
    SimModel,
    expected_experts,
    mtp_costs,
    step_costs,
)
from ablations.backends.sim.graphs import EAGER, Graphs, kernel_seconds
from ablations.backends.sim.timing import (
    StepTime,
    efficiency,
    host_seconds,
    kernel_class,
    peak_flops,
    step_time,
)
from ablations.hardware import HOST_FIGURES, HardwareConfig

# The features of a list of Seqs: whether there are any, the expected experts touched, then per kind (prefill; decode
# and verify; decode or verification in a step that also prefills: kda_overlap packs those verifications, and the
# fused KDA decode runs only without them) its presence, count, and sums of q, c, q·c, q².
FEATURES = ("step", "experts", "prefill", "n_prefill", "q_prefill", "c_prefill", "qc_prefill", "qq_prefill",
            "decode", "n_decode", "q_decode", "c_decode", "qc_decode", "qq_decode",
            "mixed", "n_mixed", "q_mixed", "c_mixed", "qc_mixed", "qq_mixed")
MIXED = 14
TOKEN_FEATURES = (FEATURES.index("q_prefill"), FEATURES.index("q_decode"))   # the tokens a step schedules
REQUEST_FEATURES = (FEATURES.index("n_prefill"), FEATURES.index("n_decode"))  # the requests it schedules
DECODE_FEATURE = FEATURES.index("n_decode")                                   # its decodes and verifications
NUM_FEATURES = len(FEATURES)
FIELDS = ("flops", "bytes", "kernels", "comm_bytes", "collectives", "gather_bytes", "gathers")
Q_PREFILL, Q_DECODE, PREFILL = FEATURES.index("q_prefill"), FEATURES.index("q_decode"), FEATURES.index("prefill")
FIT_RTOL = 1e-6


def features(m: SimModel, seqs: Sequence[Seq]) -> np.ndarray:
    """The feature vector of a step holding `seqs` (zeros for none)."""
    x = [0.0] * NUM_FEATURES
    tokens = 0
    mixed = any(s.kind == "prefill" for s in seqs)
    for s in seqs:
        q, c = s.new_tokens, s.context
        for base in (2 if s.kind == "prefill" else 8, MIXED if mixed and s.kind != "prefill" else None):
            if base is None:
                continue
            x[base] = 1.0
            x[base + 1] += 1
            x[base + 2] += q
            x[base + 3] += c
            x[base + 4] += q * c
            x[base + 5] += q * q
        tokens += q
    if tokens:
        x[0] = 1.0
        x[1] = expected_experts(m.spec.num_experts, m.spec.experts_per_token, tokens, m.routing_skew)
    return np.array(x)


def draft_seqs(seqs: Sequence[Seq]) -> list[Seq]:
    """What each later MTP pass runs: one token per request of the step, prefill chunks included, after the tokens
    this step computed (vLLM's drafter runs its later passes over every row of the batch)."""
    return [Seq(1, s.context + s.new_tokens, "decode") for s in seqs]


def exact_costs(m: SimModel, p: Parallel, seqs: Sequence[Seq], num_drafts: int,
                mech: Mechanisms = STOCK) -> dict[str, Cost]:
    """The reference: the target pass over `seqs` and, with `num_drafts` K > 0, the MTP's first pass over the same
    tokens and K - 1 more over one token per request (`draft_seqs`; their costs named "later_<name>"),
    with the toggles' `mech`anisms. Each name is a pass of its own (`timing.step_time`)."""
    seqs = list(seqs)
    out = step_costs(m, p, seqs, mech)
    if num_drafts and seqs:
        out.update(mtp_costs(m, p, seqs, mech))
        if num_drafts > 1:
            for name, cost in mtp_costs(m, p, draft_seqs(seqs), mech).items():
                out[f"later_{name}"] = Cost()
                out[f"later_{name}"].add(cost, num_drafts - 1)
    return out


def _by_pass(costs: dict[str, Cost], names: Sequence[str]) -> np.ndarray:
    """[pass, field] totals of a step's costs, one row per cost name in `names` (each name a pass of its own)."""
    out = np.zeros((len(names), len(FIELDS)))
    for name, cost in costs.items():
        out[names.index(name)] = (cost.flops, cost.bytes, cost.kernels, cost.comm_bytes, cost.collectives,
                                  cost.gather_bytes, cost.gathers)
    return out


def probe_steps(seed: int, count: int, kind: str = "verify") -> list[list[Seq]]:
    """Steps of every shape the engine makes: prefill only, decode rows of `kind` ("decode", or "verify" of 1 to
    9 tokens) only, prefill beside them; short and long contexts. A step's decode rows are all of one kind, as in
    the engine, whose steps verify K drafts (K > 0) or decode (K = 0)."""
    if kind not in ("decode", "verify"):
        raise ValueError(f"probe_steps: kind {kind!r}; valid: decode, verify")
    rng = random.Random(seed)
    steps = []
    for i in range(count):
        seqs = []
        for _ in range(rng.randint(0 if i % 3 else 1, 3)):
            seqs.append(Seq(rng.randint(1, 4096), rng.choice((0, rng.randint(1, 200_000))), "prefill"))
        for _ in range(rng.randint(0 if i % 3 != 1 else 1, 6)):
            q = rng.randint(1, 9) if kind == "verify" else 1
            seqs.append(Seq(q, rng.randint(0, 300_000), kind))
        steps.append(seqs or [Seq(1, 0, kind)])
    return steps


def fit(fn, m: SimModel, seed: int = 0, kind: str = "verify") -> tuple[list[str], np.ndarray]:
    """The passes (cost names) of `fn`'s steps and coefficients [feature, pass, field] with features(seqs) ·
    coefficients == _by_pass(fn(seqs)), fitted on probe steps whose decode rows are of `kind` and checked on
    others; a cost not linear in the features is a ValueError naming it."""
    train, check = probe_steps(seed, 4 * NUM_FEATURES, kind), probe_steps(seed + 1, NUM_FEATURES, kind)
    train_costs = [fn(s) for s in train]
    names = sorted({name for costs in train_costs for name in costs})
    x = np.stack([features(m, s) for s in train])
    y = np.stack([_by_pass(c, names).ravel() for c in train_costs])
    scale = np.abs(x).max(axis=0)
    scale[scale == 0] = 1.0
    coef, *_ = np.linalg.lstsq(x / scale, y, rcond=None)
    column = np.maximum(np.abs(y).max(axis=0), 1.0)
    coef = coef / scale[:, None]
    for seqs in check:
        want = _by_pass(fn(seqs), names).ravel()
        got = features(m, seqs) @ coef
        bad = np.abs(got - want) > FIT_RTOL * np.abs(want) + 1e-9 * column     # zeros: the column's roundoff
        if bad.any():
            k = int(np.argmax(bad))
            raise ValueError(f"step model: {names[k // len(FIELDS)]}.{FIELDS[k % len(FIELDS)]} is not linear "
                             f"in the step features ({got[k]:.6g} fitted, {want[k]:.6g} exact)")
    return names, coef.reshape(NUM_FEATURES, len(names), len(FIELDS))


MAX_TEMPLATES = 4096      # step shapes whose feature row a model keeps (`StepModel._template`)


class StepModel:
    """Seconds per step of a model on a node with `num_drafts` MTP drafts per decoding request (0: none), the
    toggles' kernel classes (`classes`) and cost `mech`anisms, launched as vLLM's `graphs` settings say:
    `time(seqs)` for one step, `times(rows)` for a batch of feature rows (`batch_features`). With
    `mech.latent_up_tier` (moe_dedup tiered) it holds the passes' coefficients of both MoE tails and prices each
    pass with the one its own tokens pick: the target pass and the MTP's first by the step's tokens, each later MTP
    pass by its requests. Its all-reduces are priced apart from the dot products: the algorithm vLLM picks, and so
    the seconds, depend on each one's payload (`collectives.allreduce_seconds`)."""

    def __init__(self, m: SimModel, p: Parallel, hw: HardwareConfig, num_drafts: int, *,
                 classes: dict[str, str] | None = None, mech: Mechanisms = STOCK, graphs: Graphs = EAGER) -> None:
        if isinstance(num_drafts, bool) or not isinstance(num_drafts, int) or num_drafts < 0:
            raise ValueError(f"num_drafts: invalid value {num_drafts!r}; valid: an integer >= 0")
        step_time({}, hw, p)                                # the node must be modelled
        self.model, self.parallel, self.hw, self.num_drafts = m, p, hw, num_drafts
        self.classes, self.mech, self.graphs = dict(classes or {}), mech, graphs
        self.tier = mech.latent_up_tier
        untiered = replace(mech, latent_up_tier=None)
        both = self._fit(untiered)
        self._flops_s, self._bytes_s, self._roof_flops, self._roof_bytes = self._kernel_terms(both)
        # the shortest each pass's kernels take (timing.pass_times): the same passes and kernels in both MoE tails
        self._floor = both[:, :, 2] * hw.kernel_floor_us * 1e-6 if hw.kernel_floor_us else None
        if self.tier is not None:       # the same passes, launches and collectives; the sharded tail's FLOPs and bytes
            self._high = self._kernel_terms(self._fit(replace(untiered, sharded_latent_up=True)))
            self._later = np.array([n.startswith("later_") for n in self.names])
        gather_latency, gather_byte = seconds_per_gather_byte(p.tp, hw)
        gathers = both[:, :, 5].sum(1) * gather_byte + both[:, :, 6].sum(1) * gather_latency
        # launches per mode: full graph, piecewise, eager (graphs.py), each plus the collectives' linear part
        self._launch = {mode: both[:, :, 2] @ np.array([kernel_seconds(n, mode, hw) for n in self.names]) + gathers
                        for mode in ("full", "piecewise", "eager")}
        for mode, vector in self._launch.items():
            vector[FEATURES.index("step")] += graphs.replays(mode, num_drafts) * hw.graph_launch_us * 1e-6
        self._allreduces = self._allreduce_groups(untiered)
        self._segments = self._comm_segments() if p.tp > 1 else []
        self._host(hw)
    def _fit(self, mech: Mechanisms) -> np.ndarray:
        """[2 · features, passes, FIELDS]: one matrix, block diagonal: [step features, MTP pass features] x [target
        passes, later passes], the later passes weighing K - 1 each; sets `names`."""
        m, p, num_drafts = self.model, self.parallel, self.num_drafts
        names, target = fit(lambda seqs: exact_costs(m, p, seqs, min(num_drafts, 1), mech), m,
                            kind="verify" if num_drafts else "decode")
        later = max(num_drafts - 1, 0)
        # the K - 1 later MTP passes: passes of their own ("later_<name>", as exact_costs names them)
        draft_names, drafts = (fit(lambda seqs: mtp_costs(m, p, seqs, mech), m, kind="decode") if later
                               else ([], None))
        self.names = names + [f"later_{n}" for n in draft_names]
        both = np.zeros((2 * NUM_FEATURES, len(self.names), len(FIELDS)))
        both[:NUM_FEATURES, :len(names)] = target
        if later:
            both[NUM_FEATURES:, len(names):] = later * drafts
        return both

    def _kernel_terms(self, both: np.ndarray) -> tuple[np.ndarray, ...]:
        """Seconds per feature of each pass's FLOPs and bytes at its class's efficiency, and the physical bound's:
        every FLOP at peak or every byte at full bandwidth (timing.roofline_s)."""
        hw, precisions = self.hw, self.model.precisions
        kinds = [kernel_class(n, {**hw.stock_classes, **self.classes}) for n in self.names]
        eff = np.array([efficiency(hw, k) for k in kinds])
        peak = np.array([peak_flops(hw, k, precisions) for k in kinds])
        bandwidth = hw.bandwidth_tb_s * 1e12
        return (both[:, :, 0] / (peak * eff), both[:, :, 1] / (bandwidth * eff), both[:, :, 0] @ (1 / peak),
                both[:, :, 1].sum(1) / bandwidth)

    def _allreduce_groups(self, mech: Mechanisms) -> list[tuple[int, float, float]]:
        """[(tokens feature, all-reduces per step, payload bytes per token)]: the step's all-reduces by the tokens
        that size them (the step's, for the target and the MTP's first pass; a later pass's, one per request) and
        by their width, summed over the passes that share both (read off the exact model: a pass's all-reduces
        do not depend on the step's shape)."""
        m, p, k = self.model, self.parallel, self.num_drafts
        one = [Seq(2, 0, "verify")] if k else [Seq(1, 0, "decode")]
        passes = [(Q_DECODE, exact_costs(m, p, one, min(k, 1), mech), 1.0)]
        if k > 1:
            passes.append((NUM_FEATURES + Q_DECODE, mtp_costs(m, p, [Seq(1, 0, "decode")], mech), k - 1.0))
        tokens = one[0].new_tokens
        groups: dict[tuple[int, float], float] = {}
        for feature, costs, times in passes:
            for cost in costs.values():
                if cost.collectives:
                    width = round(cost.comm_bytes / cost.collectives / (tokens if feature < NUM_FEATURES else 1), 6)
                    groups[feature, width] = groups.get((feature, width), 0.0) + cost.collectives * times
        return [(feature, count, width) for (feature, width), count in sorted(groups.items())]

    def _comm_segments(self) -> list[tuple[int, np.ndarray, np.ndarray, np.ndarray]]:
        """Per tokens feature, the all-reduces' seconds as a piecewise-linear function of the tokens: (feature,
        breaks, intercepts, slopes), segment i covering breaks[i - 1] <= tokens < breaks[i] (an algorithm's payload
        limit, in tokens of each width), where every group keeps one algorithm."""
        hw, tp, out = self.hw, self.parallel.tp, []
        for feature in sorted({f for f, _, _ in self._allreduces}):
            groups = [(count, width) for f, count, width in self._allreduces if f == feature]
            breaks = sorted({rule.max_bytes / width for _, width in groups for rule in rules(hw, tp)
                             if math.isfinite(rule.max_bytes)})
            edges = [0.0, *breaks]
            intercepts, slopes = [], []
            for i, low in enumerate(edges):
                tokens = (low + edges[i + 1]) / 2 if i + 1 < len(edges) else 2 * low + 1
                a = b = 0.0
                for count, width in groups:
                    latency, busbw = algorithm_figures(hw, choose(hw, tp, width * tokens))
                    a += count * latency
                    b += count * 2 * (tp - 1) / tp * width / busbw
                intercepts.append(a)
                slopes.append(b)
            out.append((feature, np.array(breaks), np.array(intercepts), np.array(slopes)))
        return out

    def comm_times(self, rows: np.ndarray) -> np.ndarray:
        """[steps]: seconds of the steps' all-reduces, each with the algorithm vLLM picks for its payload."""
        out = np.zeros(rows.shape[0])
        for feature, breaks, intercepts, slopes in self._segments:
            tokens = rows[:, feature] + (rows[:, Q_PREFILL] if feature < NUM_FEATURES else 0.0)
            i = np.searchsorted(breaks, tokens, side="right")
            out += np.where(tokens > 0, intercepts[i] + slopes[i] * tokens, 0.0)
        return out

    def launch_modes(self, rows: np.ndarray) -> np.ndarray:
        """[steps]: how each step launches (graphs.Graphs.step_mode): 0 full graph, 1 piecewise, 2 eager."""
        g = self.graphs
        if g.mode == "none":
            return np.full(rows.shape[0], 2)
        modes = np.where(rows[:, PREFILL] > 0, 2 if g.mode == "full_decode_only" else 1,
                         1 if g.mode == "piecewise" else 0)
        modes[rows[:, Q_PREFILL] + rows[:, Q_DECODE] > g.max_tokens] = 2
        return modes

    def _host(self, hw: HardwareConfig) -> None:
        # the host's work: per step, per token the step schedules (its prefill and its decode tokens), per
        # request (its prefill chunks and its decodes) and per decode
        self.host_s = host_seconds(hw, 0)
        self.first_step_s = hw.host_first_step_us * 1e-6
        fixed = np.zeros(2 * NUM_FEATURES)
        fixed[list(TOKEN_FEATURES)] += host_seconds(hw, 1) - self.host_s
        fixed[list(REQUEST_FEATURES)] += host_seconds(hw, 0, 1) - self.host_s
        fixed[DECODE_FEATURE] += host_seconds(hw, 0, 0, 1) - self.host_s
        # [mode, feature]: the host's and the launches' (and gathers') seconds per feature, by launch mode
        self._fixed = np.stack([self._launch[mode] + fixed for mode in ("full", "piecewise", "eager")])
        # `price`'s one product: [features, passes (FLOPs, bytes, floors) + launch modes + the roofline's two]
        parts = [self._flops_s, self._bytes_s, *([self._floor] if self._floor is not None else []), self._fixed.T,
                 self._roof_flops[:, None], self._roof_bytes[:, None]]
        self._stack = np.ascontiguousarray(np.hstack(parts))
        self._templates: dict[tuple, np.ndarray] = {}

    def with_host(self, hw: HardwareConfig) -> StepModel:
        """This model with `hw`'s host overheads (the rest of `hw` unread): a fit of them re-prices nothing else."""
        other = copy.copy(self)
        sources = {**{k: v for k, v in self.hw.sources.items() if k not in HOST_FIGURES},
                   **{k: v for k, v in hw.sources.items() if k in HOST_FIGURES}}
        ranges = {**{k: v for k, v in self.hw.ranges.items() if k not in HOST_FIGURES},
                  **{k: v for k, v in hw.ranges.items() if k in HOST_FIGURES}}
        other.hw = replace(self.hw, **{k: getattr(hw, k) for k in HOST_FIGURES}, sources=sources, ranges=ranges)
        other._host(other.hw)       # and `price`'s product
        return other

    def features(self, seqs: Sequence[Seq]) -> np.ndarray:
        """The step's feature row: its `features`, then those of each later MTP pass."""
        return np.concatenate((features(self.model, seqs), features(self.model, draft_seqs(seqs))))

    def batch_features(self, chunks: Sequence[tuple[int, float | np.ndarray]], num_decodes: int,
                       decode_context: np.ndarray, tokens_per_decode: int) -> np.ndarray:
        """Rows [steps, 2 · features] of steps holding the prefill `chunks` ((new tokens, cached tokens before
        them: a number, or one per step)) and `num_decodes` decoding requests of `tokens_per_decode` tokens each
        (1 + drafts) whose contexts sum to each of `decode_context` [steps]: `features` of the step, then of each
        later MTP pass (`draft_seqs`), built from the sums alone, as the engine keeps them."""
        n, q = num_decodes, tokens_per_decode
        c = np.asarray(decode_context, dtype=float)
        rows = np.tile(self._template(tuple(new for new, _ in chunks), n, q), (c.size, 1))
        for new, cached in chunks:
            rows[:, 5] += cached
            rows[:, 6] += new * cached
            rows[:, NUM_FEATURES + 11] += cached + new
        if n:
            rows[:, 11] = c
            rows[:, 12] = q * c
            if chunks:
                rows[:, MIXED + 3] = c
                rows[:, MIXED + 4] = q * c
            rows[:, NUM_FEATURES + 11] += c + n * q
        rows[:, NUM_FEATURES + 12] = rows[:, NUM_FEATURES + 11]
        return rows

    def _template(self, news: tuple[int, ...], n: int, q: int) -> np.ndarray:
        """The feature row of a step of prefill chunks of `news` tokens and `n` decodes of `q` tokens before any
        context: what depends on the step's shape alone (its experts among it), kept per shape."""
        key = (news, n, q)
        row = self._templates.get(key)
        if row is not None:
            return row
        head = [0.0] * NUM_FEATURES
        tokens = n * q
        for new in news:
            head[2] = 1.0
            head[3] += 1
            head[4] += new
            head[7] += new * new
            tokens += new
        if tokens:
            head[0], head[1] = 1.0, self._experts(tokens)
        draft = [0.0] * NUM_FEATURES
        if n:
            head[8:14] = (1.0, n, n * q, 0.0, 0.0, n * q * q)
            if news:                                        # decodes or verifications beside a prefill
                head[MIXED:MIXED + 6] = (1.0, n, n * q, 0.0, 0.0, n * q * q)
        requests = n + len(news)                            # each later MTP pass: one token per request
        if requests:
            draft[:2] = (1.0, self._experts(requests))
            draft[8:14] = (1.0, requests, requests, 0.0, 0.0, requests)
        if len(self._templates) >= MAX_TEMPLATES:
            self._templates.clear()
        row = self._templates[key] = np.array(head + draft)
        return row

    def _experts(self, tokens: int) -> float:
        return expected_experts(self.model.spec.num_experts, self.model.spec.experts_per_token, tokens,
                                self.model.routing_skew)

    def times(self, rows: np.ndarray) -> np.ndarray:
        """Seconds of the steps whose feature rows (`batch_features`, or `features` of the step and of its later
        MTP passes side by side) are `rows`: per pass max(FLOPs / (peak·eff), bytes / (bandwidth·eff), kernels ·
        kernel_floor_us), then launches, all-reduces, host."""
        kernels = np.maximum(rows @ self._flops_s, rows @ self._bytes_s)
        if self.tier is not None:
            flops_s, bytes_s = self._high[:2]
            kernels = np.where(self._sharded(rows), np.maximum(rows @ flops_s, rows @ bytes_s), kernels)
        if self._floor is not None:
            kernels = np.maximum(kernels, rows @ self._floor)
        fixed = (rows @ self._fixed.T)[np.arange(rows.shape[0]), self.launch_modes(rows)]
        return kernels.sum(axis=-1) + fixed + self.comm_times(rows) + self.host_s

    def price(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(`times(rows)`, `rooflines(rows)`) from one product of the rows with every pass's terms, what the engine
        prices its steps with (equal to them to rounding, tested); tiered, the two."""
        if self.tier is not None:
            return self.times(rows), self.rooflines(rows)
        out = rows @ self._stack
        p = len(self.names)
        kernels = np.maximum(out[:, :p], out[:, p:2 * p])
        at = 2 * p
        if self._floor is not None:
            kernels = np.maximum(kernels, out[:, at:at + p])
            at += p
        fixed = out[np.arange(rows.shape[0]), at + self.launch_modes(rows)]
        times = kernels.sum(axis=-1) + fixed + self.comm_times(rows) + self.host_s
        return times, np.maximum(out[:, at + 3], out[:, at + 4])

    def _sharded(self, rows: np.ndarray) -> np.ndarray:
        """[steps, passes]: which passes run the sharded tail (tiered): the target's and the MTP's first by the
        step's tokens, the later MTP passes by their own (one per request)."""
        draft = rows[:, NUM_FEATURES + TOKEN_FEATURES[1]] > self.tier
        return np.where(self._later, draft[:, None], self._step_sharded(rows)[:, None])

    def _step_sharded(self, rows: np.ndarray) -> np.ndarray:
        """[steps]: whether each step's own tokens are above the tier."""
        return rows[:, list(TOKEN_FEATURES)].sum(axis=1) > self.tier

    def rooflines(self, rows: np.ndarray) -> np.ndarray:
        """The steps' physical lower bounds (`timing.roofline_s` of their costs): no step is ever faster (tiered:
        the sharded tail's where the step's tokens pick it, a bound for its later passes too)."""
        bound = np.maximum(rows @ self._roof_flops, rows @ self._roof_bytes)
        if self.tier is None:
            return bound
        roof_flops, roof_bytes = self._high[2:]
        return np.where(self._step_sharded(rows), np.maximum(rows @ roof_flops, rows @ roof_bytes), bound)

    def time(self, seqs: Sequence[Seq]) -> float:
        """Seconds of one step holding `seqs`."""
        return float(self.times(self.features(seqs)[None])[0])

    def roofline(self, seqs: Sequence[Seq]) -> float:
        """One step's physical lower bound."""
        return float(self.rooflines(self.features(seqs)[None])[0])

    def exact_time(self, seqs: Sequence[Seq]) -> float:
        """The same from the exact cost model (`exact_costs` through `timing.step_time`): the reference."""
        return self.exact_step(seqs).total_s

    def exact_step(self, seqs: Sequence[Seq]) -> StepTime:
        """The step's time by part from the exact cost model (`timing.step_time`)."""
        tokens = sum(q.new_tokens for q in seqs)
        mode = self.graphs.step_mode(tokens, any(q.kind == "prefill" for q in seqs))
        return step_time(exact_costs(self.model, self.parallel, seqs, self.num_drafts, self.mech), self.hw,
                         self.parallel, self.classes, tokens, len(seqs), sum(q.kind != "prefill" for q in seqs),
                         launch=(mode, self.graphs.replays(mode, self.num_drafts) if seqs else 0),
                         precisions=self.model.precisions)


Schedule = tuple[tuple[int, int, int], ...]


def one_k(k: int) -> Schedule:
    """One K at every batch size, in vLLM's form: the range [1, 1], whose K vLLM keeps past it."""
    return ((1, 1, k),)


class DraftSteps:
    """The step model of each draft length K a cell runs and the K each batch size gets: vLLM's lookup of
    `num_speculative_tokens_per_batch_size`, inclusive batch-size ranges [(lo, hi, K), ...] from 1 as draft_length
    hands them over (its setting's `draft_schedule`, checked there), or one K everywhere (`fixed`). `max_k`, the
    largest, is vLLM's `num_speculative_tokens` (no speculation configured when it is 0:
    `opts/draft_length/vllm.py`)."""

    def __init__(self, models: dict[int, StepModel], schedule: Sequence[Sequence[int]]) -> None:
        self.schedule: Schedule = tuple((lo, hi, k) for lo, hi, k in schedule)
        if not self.schedule:
            raise ValueError("DraftSteps: an empty schedule; valid: [(lo, hi, K), ...] from batch size 1")
        ks = sorted({k for _, _, k in self.schedule})
        missing = [k for k in ks if k not in models or models[k].num_drafts != k]
        if missing:
            raise ValueError(f"DraftSteps: no step model of K = {missing[0]} for the schedule {self.schedule}")
        self.models = {k: models[k] for k in ks}
        self.max_k = ks[-1]
        self._his = [hi for _, hi, _ in self.schedule]

    @classmethod
    def fixed(cls, model: StepModel) -> DraftSteps:
        """One model's K at every batch size."""
        return cls({model.num_drafts: model}, one_k(model.num_drafts))

    @property
    def mech(self) -> Mechanisms:
        return next(iter(self.models.values())).mech

    def k(self, batch: int) -> int:
        """The K a step of `batch` running requests verifies; past the schedule's last range, its K."""
        return self.schedule[min(bisect.bisect_left(self._his, batch), len(self._his) - 1)][2]


class DecodeSeconds:
    """c(b, K), the seconds of a step verifying K drafts for each of b requests at `context` cached tokens each,
    from `models` (one per K): what draft_length's chooser weighs, as a user would measure it on the node. A
    fractional b lies on the line between the integers around it."""

    def __init__(self, models: dict[int, StepModel], context: float) -> None:
        self.models, self.context = models, context

    def _at(self, batch: int, k: int) -> float:
        model = self.models[k]
        rows = model.batch_features([], batch, np.array([batch * self.context]), 1 + k)
        return float(model.times(rows)[0])

    def seconds(self, batch: float, k: int) -> float:
        if k not in self.models:
            raise ValueError(f"K = {k}: no step model (have {sorted(self.models)})")
        lo = max(int(batch), 1)
        low = self._at(lo, k)
        return low if batch <= lo else low + (batch - lo) * (self._at(lo + 1, k) - low)
