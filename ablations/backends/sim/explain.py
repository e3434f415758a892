"""A step explained: where a simulated step's seconds go on a node (README.md, "The step, explained").

`explain_step` breaks one step of a cell's step model into its kernels by class (and what of them the kernel floor
adds over their roofline), its launches (how the step
launches: a full graph, piecewise or eager), each group of collectives with the algorithm vLLM picks for it, and the
host; the parts add up to the step's time. `batch_independent` is the share of the step a step of no requests would
still take: the step's time less the requests' marginal cost (one request more for a decode step, 1% more tokens for
a prefill chunk), extrapolated to none.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from ablations.backends.sim.collectives import allreduce_seconds, choose, gather_seconds
from ablations.backends.sim.cost import Seq
from ablations.backends.sim.step_model import StepModel, exact_costs
from ablations.backends.sim.timing import pass_times


@dataclass
class Explained:
    """One step's seconds by part (each dict's values sum to that part of `total_s`)."""

    what: str
    total_s: float
    kernels_s: dict[str, float] = field(default_factory=dict)          # by kernel class
    floor_s: dict[str, float] = field(default_factory=dict)            # of it, what the kernel floor adds
    launch: dict[str, Any] = field(default_factory=dict)               # mode, replays, kernels, seconds
    collectives: list[dict[str, Any]] = field(default_factory=list)    # op, algorithm, count, payload, seconds
    host_s: float = 0.0
    batch_independent: float = 0.0

    @property
    def parts_s(self) -> float:
        return (sum(self.kernels_s.values()) + self.launch["seconds"] + sum(c["seconds"] for c in self.collectives)
                + self.host_s)


def explain_step(model: StepModel, seqs: list[Seq], what: str, grown: list[Seq]) -> Explained:
    """`seqs` on `model` by part; `grown`, the same step with a little more work (its marginal cost gives the
    batch-independent share)."""
    m, p, hw = model.model, model.parallel, model.hw
    step = model.exact_step(seqs)
    tokens = sum(q.new_tokens for q in seqs)
    mode = model.graphs.step_mode(tokens, any(q.kind == "prefill" for q in seqs))
    costs = exact_costs(m, p, seqs, model.num_drafts, model.mech)
    parts = pass_times(costs, hw, p, model.classes, mode=mode, precisions=m.precisions)
    out = Explained(what, step.total_s, host_s=step.host_s)
    for part in parts:
        out.kernels_s[part.kernel_class] = out.kernels_s.get(part.kernel_class, 0.0) + part.kernels_s
        out.floor_s[part.kernel_class] = out.floor_s.get(part.kernel_class, 0.0) + part.floor_s
    replays = model.graphs.replays(mode, model.num_drafts)
    out.launch = {"mode": mode, "graph_replays": replays, "kernels": sum(c.kernels for c in costs.values()),
                  "seconds": step.launch_s}
    groups: dict[tuple[str, str, float], list[float]] = defaultdict(lambda: [0.0, 0.0])
    for cost in costs.values():
        if cost.collectives and p.tp > 1:
            payload = cost.comm_bytes / cost.collectives
            key = ("all_reduce", choose(hw, p.tp, payload), payload)
            groups[key][0] += cost.collectives
            groups[key][1] += cost.collectives * float(allreduce_seconds(payload, p.tp, hw))
        if cost.gathers and p.tp > 1:
            key = ("gather", "ccl", cost.gather_bytes / cost.gathers)
            groups[key][0] += cost.gathers
            groups[key][1] += gather_seconds(cost.gather_bytes, cost.gathers, p.tp, hw)
    out.collectives = [{"op": op, "algorithm": algorithm, "count": count, "payload_bytes": payload,
                        "seconds": seconds} for (op, algorithm, payload), (count, seconds)
                       in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][2]))]
    more = model.exact_time(grown)
    grown_tokens = sum(q.new_tokens for q in grown)
    scale = tokens / (grown_tokens - tokens)
    out.batch_independent = max(0.0, step.total_s - (more - step.total_s) * scale) / step.total_s
    return out


def headline_steps(model: StepModel, sessions: int, context: float, chunk: int) -> list[Explained]:
    """The two steps of the headline's point: `sessions` requests decoding (verifying the model's K drafts) at
    `context` cached tokens, and a prefill chunk of `chunk` tokens after `context` cached."""
    q = 1 + model.num_drafts
    kind = "verify" if model.num_drafts else "decode"
    c = int(context)
    decode = [Seq(q, c, kind)] * sessions
    prefill = [Seq(chunk, c, "prefill")]
    return [explain_step(model, decode, f"decode: {sessions} requests x {q} tokens at {c:,} cached",
                         [*decode, Seq(q, c, kind)]),
            explain_step(model, prefill, f"prefill: a {chunk:,}-token chunk after {c:,} cached",
                         [Seq(chunk + max(chunk // 100, 1), c, "prefill")])]


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:8.3f} ms"


def text(node: str, steps: list[Explained]) -> str:
    """The explained steps of one node as plain text."""
    lines = []
    for e in steps:
        lines.append(f"{node}, {e.what}: {_ms(e.total_s).strip()} "
                     f"({e.batch_independent:.0%} of it independent of the batch)")
        for kind, seconds in sorted(e.kernels_s.items(), key=lambda kv: -kv[1]):
            floor = e.floor_s.get(kind, 0.0)
            lines.append(f"  kernels  {kind:<22}{_ms(seconds)}  {seconds / e.total_s:6.1%}"
                         + (f"  ({floor * 1e3:.3f} ms of it the kernel floor)" if floor > 0 else ""))
        launch = e.launch
        lines.append(f"  launches {launch['mode']:<22}{_ms(launch['seconds'])}  {launch['seconds'] / e.total_s:6.1%}"
                     f"  ({launch['kernels']:,} kernels, {launch['graph_replays']} graph replays)")
        for c in e.collectives:
            label = f"{c['op']} {c['algorithm']}"
            lines.append(f"  comm     {label:<22}{_ms(c['seconds'])}  {c['seconds'] / e.total_s:6.1%}"
                         f"  ({c['count']:g} x {c['payload_bytes'] / 1024:,.0f} KiB)")
        lines.append(f"  host     {'':<22}{_ms(e.host_s)}  {e.host_s / e.total_s:6.1%}")
    return "\n".join(lines)
