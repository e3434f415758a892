"""The simulator against published GPU results: DeepSeek-R1 on single 8-GPU nodes (`python -m ablations.sim
validate`).

A published point (`deepseek_r1_points.yaml`, each row with its source) is a throughput per GPU at a stated
concurrency or interactivity, or a ratio between two nodes at one configuration. Each point's configuration (node,
ISL/OSL, parallelism, cache dtype, MTP) is simulated over a closed-loop concurrency sweep of fixed-length random
prompts (`ablations.workload.fixed`), the way InferenceX and `vllm bench serve` run it, and the point's figure is
read off the simulated sweep: at its concurrency, or interpolated on the simulated frontier at its interactivity
(1 / median TPOT, tokens/s/user). A point marked `calibrates: <figure>` set that figure (`python -m ablations.sim
calibrate`, `calibrate_points.py`): it is reported apart, and the summary's errors are the held-out points'.
"""

from __future__ import annotations

import itertools
import math
import multiprocessing
import os
import statistics
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from ablations.backends.sim.cell import run_point, sim_setup
from ablations.workload.fixed import FixedLengths, fixed_trace
from opts.base import check_known_fields
from opts.registry import make_config

POINTS_FILE = Path(__file__).with_name("deepseek_r1_points.yaml")
MODEL = "deepseek_r1"
METRICS = ("output_per_gpu", "total_per_gpu", "ratio")
CURVE = (1, 2, 4, 8, 16, 32, 64, 128)       # the concurrencies every configuration's curve runs besides its points'
GOAL = 0.25                                  # the goal: every held-out point within 25%


@dataclass(frozen=True)
class Point:
    """One published figure. `node`: a `hardware` option (mi355x_x8, b200_x8, h200_x8, b300_x8); `metric`:
    output_per_gpu or total_per_gpu (tokens/s per GPU) at `concurrency` or at `interactivity` (tokens/s/user),
    or ratio (`node`'s throughput over `vs`'s at `concurrency`, `ratio_of` output_per_gpu or total_per_gpu);
    `tp` ranks, experts split by expert (`ep`) or by slice; `dp` data-parallel ranks; `kv_dtype` the cache
    (auto: bf16); `mtp` draft tokens (0: none) accepted at `mtp_alphas` (conditional rates per position);
    `precision` the weights; `reported_interactivity` and `reported_ttft_s`, the interactivity (1 / median TPOT)
    and median TTFT the source reports beside a figure at a concurrency: they say which part of the step a miss
    lies in (the decode steps, or the prefill). `source` (URL), `date`, `framework` and `quote` (the sentence or
    table row the figure comes from) say where it was read. `calibrates`: the hardware figure this point sets on
    its platform (`calibrate_points.py`; empty: held out)."""

    id: str
    node: str
    metric: str
    value: float
    isl: int
    osl: int
    source: str
    date: str
    framework: str
    quote: str
    concurrency: int | None = None
    interactivity: float | None = None
    vs: str | None = None
    ratio_of: str = "total_per_gpu"
    tp: int = 8
    ep: bool = False
    dp: int = 1
    kv_dtype: str = "auto"
    precision: str = "fp8"
    mtp: int = 0
    mtp_alphas: tuple[float, ...] = ()
    reported_interactivity: float | None = None
    reported_ttft_s: float | None = None
    note: str = ""
    calibrates: str = ""

    def __post_init__(self) -> None:
        where = f"point {self.id!r}"
        if self.metric not in METRICS:
            raise ValueError(f"{where}: metric: invalid value {self.metric!r}; valid: {', '.join(METRICS)}")
        if not (isinstance(self.value, int | float) and self.value > 0 and math.isfinite(self.value)):
            raise ValueError(f"{where}: value: invalid value {self.value!r}; valid: a number > 0")
        for name in ("source", "date", "framework", "quote"):
            if not str(getattr(self, name)).strip():
                raise ValueError(f"{where}: {name}: empty; every point says where it was read")
        if (self.concurrency is None) == (self.interactivity is None):
            raise ValueError(f"{where}: give exactly one of concurrency and interactivity")
        if self.metric == "ratio" and (self.vs is None or self.concurrency is None
                                       or self.ratio_of not in METRICS[:2]):
            raise ValueError(f"{where}: a ratio needs vs (the other node), a concurrency and ratio_of "
                             f"({', '.join(METRICS[:2])})")
        if self.precision != "fp8":
            raise ValueError(f"{where}: precision: {self.precision!r} is not modelled; valid: fp8 (the checkpoint's)")
        if self.dp != 1:
            raise ValueError(f"{where}: dp: {self.dp}; valid: 1 (the simulator runs one tensor-parallel engine)")
        if len(self.mtp_alphas) != self.mtp:
            raise ValueError(f"{where}: mtp_alphas: {len(self.mtp_alphas)} rates for mtp {self.mtp} drafts")
        object.__setattr__(self, "mtp_alphas", tuple(self.mtp_alphas))

    def config(self, node: str | None = None) -> Config:
        """The simulated configuration of this point (on `node`, default its own)."""
        return Config(node or self.node, self.isl, self.osl, self.tp, "ep" if self.ep else "tp", self.kv_dtype,
                      self.mtp, self.mtp_alphas)

    @property
    def where(self) -> str:
        return f"c={self.concurrency}" if self.concurrency is not None else f"{self.interactivity:g} tok/s/user"


@dataclass(frozen=True)
class Config:
    """A simulated serving configuration: node, ISL/OSL, tensor parallelism, expert split, cache dtype, MTP."""

    node: str
    isl: int
    osl: int
    tp: int
    moe: str
    kv_dtype: str
    mtp: int
    alphas: tuple[float, ...]
    figures: tuple[tuple[str, float], ...] = ()     # hardware figures set otherwise than the profile (calibration)

    @property
    def label(self) -> str:
        lengths = FixedLengths(self.isl, self.osl, 1).label
        return f"{self.node} {lengths}{f' MTP {self.mtp}' if self.mtp else ''}"


def load_points(path: str | os.PathLike = POINTS_FILE) -> list[Point]:
    """The published points of `path` (a YAML list; a bad row is a ValueError naming the file, row and field)."""
    path = Path(path)
    rows = yaml.safe_load(path.read_text())
    if not isinstance(rows, list) or not rows:
        raise ValueError(f"{path}: expected a non-empty list of points")
    points, seen = [], set()
    for i, row in enumerate(rows, 1):
        try:
            if not isinstance(row, dict):
                raise ValueError(f"row {i}: expected a mapping, got {row!r}")
            check_known_fields(Point, row, f"row {i}")
            point = Point(**{k: tuple(v) if k == "mtp_alphas" else v for k, v in row.items()})
        except (TypeError, ValueError) as err:
            raise ValueError(f"{path}: row {i}: {err}" if not str(err).startswith("row ") else f"{path}: {err}") \
                from None
        if point.id in seen:
            raise ValueError(f"{path}: row {i}: point id {point.id!r} appears twice")
        seen.add(point.id)
        points.append(point)
    return points


def toggles(config: Config, platform: str) -> dict[str, Any]:
    """The toggle vector a configuration runs as its published runs served DeepSeek-R1: AITER's MLA decode on ROCm
    (`VLLM_ROCM_USE_AITER=1`, as AMD's runs set it; on CUDA the MLA decode vLLM selects there), the MTP draft
    length and its acceptance, plain prefix caching; kda_overlap and moe_dedup act on K3's KDA and latent MoE only
    (off: nothing to change), fusion left to the node's stock path."""
    vector = {"kda_overlap": make_config("kda_overlap", mode="off"), "moe_dedup": make_config("moe_dedup", mode="off"),
              "cache_retention": make_config("cache_retention", mode="off")}
    if platform == "rocm":
        vector["aiter_mla"] = make_config("aiter_mla", mode="on")
    vector["draft_length"] = (make_config("draft_length", mode="off", k=config.mtp, alphas=config.alphas)
                              if config.mtp else make_config("draft_length", mode="k0"))
    return vector


@cache
def _setup(config: Config):
    from ablations.config import compose_app

    app = compose_app(["backend=sim", f"model={MODEL}", f"hardware={config.node}", f"backend.tp={config.tp}",
                       f"backend.moe={config.moe}", f"backend.kv_dtype={config.kv_dtype}",
                       *(o for key, value in config.figures
                         for o in (f"hardware.{key}={value!r}", f"++hardware.sources.{key}='calibrating'"))])
    # fixed lengths share nothing: no trace is needed to build the engine (draft_length on is never used here)
    return sim_setup(app.backend, MODEL, app.hardware, toggles(config, app.hardware.platform)), app.backend.seed


def simulate(config: Config, concurrency: int, requests_per_slot: int = 10, min_requests: int = 32
             ) -> dict[str, Any]:
    """One simulated point: `config` at `concurrency` requests in flight, over max(`min_requests`,
    `requests_per_slot` x concurrency) requests (InferenceX sends 10 x concurrency): steady-state output and total
    throughput per GPU, interactivity (1 / median TPOT) and its P90 form, TTFT p50."""
    setup, seed = _setup(config)
    trace = fixed_trace(FixedLengths(config.isl, config.osl, max(min_requests, requests_per_slot * concurrency)))
    point = run_point(setup, trace, concurrency, seed)
    steady = point["steady"]
    return {"concurrency": concurrency, "output_per_gpu": steady["output_throughput_per_gpu"],
            "total_per_gpu": steady["throughput_per_gpu"], "interactivity": 1.0 / steady["tpot_s"]["p50"],
            "interactivity_p90": steady["interactivity_p90"], "ttft_p50_s": steady["ttft_s"]["p50"],
            "requests": len(trace.requests), "wall_s": point["wall_s"]}


def _task(args: tuple) -> tuple[Config, dict[str, Any]]:
    config, concurrency, per_slot, minimum = args
    return config, simulate(config, concurrency, per_slot, minimum)


def sweeps(points: Sequence[Point], curve: Sequence[int] = CURVE, requests_per_slot: int = 10,
           min_requests: int = 32, workers: int = 0,
           progress: Callable[[str], None] = lambda _: None) -> dict[Config, list[dict[str, Any]]]:
    """Every configuration the points need (a ratio's both nodes), each at its points' concurrencies and `curve`,
    sorted by concurrency; on `workers` forked processes (0: one per core)."""
    need: dict[Config, set[int]] = {}
    for p in points:
        for node in (p.node, p.vs) if p.metric == "ratio" else (p.node,):
            need.setdefault(p.config(node), set(curve)).update([p.concurrency] if p.concurrency else [])
    tasks = [(c, n, requests_per_slot, min_requests) for c, ns in need.items() for n in sorted(ns, reverse=True)]
    workers = min(workers or os.cpu_count() or 1, len(tasks))
    out: dict[Config, list[dict[str, Any]]] = {c: [] for c in need}
    if workers > 1:
        pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"))
        results: Iterable = pool.map(_task, tasks)
    else:
        pool, results = None, map(_task, tasks)
    try:
        for k, (config, row) in enumerate(results, 1):
            out[config].append(row)
            progress(f"validate: [{k}/{len(tasks)}] {config.label} c={row['concurrency']}: "
                     f"{row['output_per_gpu']:,.0f} output tok/s/GPU at {row['interactivity']:.1f} tok/s/user "
                     f"({row['requests']} requests, {row['wall_s']:.1f} s)")
    finally:
        if pool is not None:
            pool.shutdown()
    for rows in out.values():
        rows.sort(key=lambda r: r["concurrency"])
    return out


def at_interactivity(rows: Sequence[dict[str, Any]], metric: str, target: float) -> float:
    """`metric` interpolated on the simulated frontier at `target` tokens/s/user (NaN when no two points bracket
    it: never extrapolated)."""
    pts = sorted((r["interactivity"], r[metric]) for r in rows)
    for (x0, y0), (x1, y1) in itertools.pairwise(pts):
        if x0 <= target <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (target - x0) / (x1 - x0)
    return math.nan


def simulated(point: Point, runs: dict[Config, list[dict[str, Any]]]) -> float:
    """The simulator's figure for `point`, read off `runs` (`sweeps`)."""
    def at(node: str, metric: str) -> float:
        rows = runs[point.config(node)]
        if point.concurrency is None:
            return at_interactivity(rows, metric, point.interactivity)
        return next(r[metric] for r in rows if r["concurrency"] == point.concurrency)

    if point.metric == "ratio":
        return at(point.node, point.ratio_of) / at(point.vs, point.ratio_of)
    return at(point.node, point.metric)


@dataclass(frozen=True)
class Row:
    """A point, the simulator's figure, their ratio (simulated / published) and the relative error; at a
    concurrency, the simulated interactivity and median TTFT there."""

    point: Point
    simulated: float
    interactivity: float = math.nan
    ttft_s: float = math.nan

    @property
    def ratio(self) -> float:
        return self.simulated / self.point.value

    @property
    def error(self) -> float:
        return self.ratio - 1.0

    @property
    def ordering(self) -> bool | None:
        """For a node-against-node ratio: whether the simulator puts the nodes in the published order."""
        if self.point.metric != "ratio" or math.isnan(self.simulated):
            return None
        return (self.point.value > 1) == (self.simulated > 1)


def compare(points: Sequence[Point], runs: dict[Config, list[dict[str, Any]]]) -> list[Row]:
    """One row per point."""
    rows = []
    for p in points:
        at = next((r for r in runs[p.config()] if r["concurrency"] == p.concurrency), None)
        rows.append(Row(p, simulated(p, runs), *((at["interactivity"], at["ttft_p50_s"]) if at else ())))
    return rows


def orderings(rows: Sequence[Row]) -> list[tuple[str, str, str, float, float, bool]]:
    """Every node-against-node ordering the published points state: each ratio point, and each pair of absolute
    points on two nodes at the same ISL/OSL, MTP and concurrency: (what, node, other, published, simulated
    ratio, reproduced)."""
    out = [(r.point.id, r.point.node, r.point.vs, r.point.value, r.simulated, bool(r.ordering))
           for r in rows if r.ordering is not None]
    absolute = [r for r in rows if r.point.metric != "ratio" and r.point.concurrency is not None]
    for i, a in enumerate(absolute):
        for b in absolute[i + 1:]:
            pa, pb = a.point, b.point
            same = (pa.isl, pa.osl, pa.mtp, pa.concurrency, pa.metric) == (pb.isl, pb.osl, pb.mtp, pb.concurrency,
                                                                           pb.metric)
            if same and pa.node != pb.node:
                pub, sim = pa.value / pb.value, a.simulated / b.simulated
                out.append((f"{pa.id} / {pb.id}", pa.node, pb.node, pub, sim, (pub > 1) == (sim > 1)))
    return out


def summary(rows: Sequence[Row]) -> dict[str, Any]:
    """Median and worst absolute error over the held-out points, how many are within `GOAL`, the calibration
    points' errors, the orderings."""
    held = [r for r in rows if not r.point.calibrates]
    errors = [abs(r.error) for r in held if not math.isnan(r.simulated)]
    worst = max(held, key=lambda r: abs(r.error) if not math.isnan(r.simulated) else -1.0, default=None)
    orders = orderings(rows)
    return {"points": len(rows), "compared": len(errors), "held_out": len(held),
            "calibrated_from": len(rows) - len(held),
            "calibration_errors": {r.point.id: r.error for r in rows if r.point.calibrates},
            "median_abs_error": statistics.median(errors) if errors else math.nan,
            "worst_abs_error": max(errors) if errors else math.nan, "worst": worst.point.id if worst else "",
            "within_goal": sum(e <= GOAL for e in errors), "orderings": len(orders),
            "orderings_reproduced": sum(o[-1] for o in orders)}


def worst_per_node(rows: Sequence[Row]) -> dict[str, Row]:
    """Each node's point the simulator misses most (absolute points at a concurrency only)."""
    out: dict[str, Row] = {}
    for r in rows:
        if r.point.metric == "ratio" or r.point.concurrency is None or math.isnan(r.simulated):
            continue
        if r.point.node not in out or abs(r.error) > abs(out[r.point.node].error):
            out[r.point.node] = r
    return out


def _pair(published: float | None, sim: float, spec: str) -> str:
    if published is None or math.isnan(sim):
        return ""
    return f"{published:{spec}} / {sim:{spec}}"


def _fmt(value: float, metric: str) -> str:
    if math.isnan(value):
        return "n/a"
    return f"{value:.2f}x" if metric == "ratio" else f"{value:,.0f}"


def table(rows: Sequence[Row]) -> str:
    """The comparison as Markdown: every point, then the node-against-node orderings and the summary."""
    lines = ["| point | node | ISL/OSL | MTP | at | metric | published | simulated | sim / pub | error | "
             "interactivity pub / sim | TTFT p50 pub / sim (s) |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        p = r.point
        node = f"{p.node} / {p.vs}" if p.metric == "ratio" else p.node
        metric = f"ratio of {p.ratio_of}" if p.metric == "ratio" else p.metric
        name = f"{p.id} (calibrates {p.calibrates})" if p.calibrates else p.id
        lines.append(f"| {name} | {node} | {FixedLengths(p.isl, p.osl, 1).label} | {p.mtp or 'off'} | {p.where} | "
                     f"{metric} | {_fmt(p.value, p.metric)} | {_fmt(r.simulated, p.metric)} | "
                     f"{'n/a' if math.isnan(r.simulated) else f'{r.ratio:.2f}'} | "
                     f"{'n/a' if math.isnan(r.simulated) else f'{r.error:+.1%}'} | "
                     f"{_pair(p.reported_interactivity, r.interactivity, '.1f')} | "
                     f"{_pair(p.reported_ttft_s, r.ttft_s, '.3f')} |")
    orders = orderings(rows)
    if orders:
        lines += ["", "| ordering | node | against | published | simulated | reproduced |", "|---|---|---|---|---|---|"]
        lines += [f"| {what} | {a} | {b} | {pub:.2f}x | {sim:.2f}x | {'yes' if ok else 'no'} |"
                  for what, a, b, pub, sim, ok in orders]
    s = summary(rows)
    if s["calibrated_from"]:
        calibration = ", ".join(f"{k} {e:+.1%}" for k, e in s["calibration_errors"].items())
        held = (f"{s['compared']} of {s['held_out']} held-out points compared ({s['calibrated_from']} more set a "
                f"figure, `python -m ablations.sim calibrate`: {calibration})")
    else:
        held = f"{s['compared']} of {s['points']} points compared, all held out (no figure calibrated from them)"
    lines += ["", f"{held}: median absolute error {s['median_abs_error']:.1%}, worst {s['worst_abs_error']:.1%} "
              f"({s['worst']}); {s['within_goal']} within {GOAL:.0%}; node-against-node orderings reproduced "
              f"{s['orderings_reproduced']} of {s['orderings']}"]
    return "\n".join(lines)


def plot(rows: Sequence[Row], runs: dict[Config, list[dict[str, Any]]], path: str | os.PathLike) -> Path:
    """The frontiers: per ISL/OSL and MTP, each node's simulated total throughput per GPU against interactivity
    (a line through its concurrencies) and the published total-throughput points over it (stars; diamonds for the
    points a calibration used; at the interactivity their source reports, else at the simulated one of their
    concurrency; ratios are in the table)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = sorted({(c.isl, c.osl, c.mtp) for c in runs})
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.2), squeeze=False)
    colors: dict[str, str] = {}
    for ax, (isl, osl, mtp) in zip(axes[0], panels, strict=True):
        for config, curve in sorted(runs.items(), key=lambda kv: kv[0].node):
            if (config.isl, config.osl, config.mtp) != (isl, osl, mtp):
                continue
            color = colors.setdefault(config.node, f"C{len(colors)}")
            ax.plot([r["interactivity"] for r in curve], [r["total_per_gpu"] for r in curve], "-o", ms=3,
                    color=color, label=f"{config.node} simulated")
        for r in rows:
            p = r.point
            if (p.isl, p.osl, p.mtp) != (isl, osl, mtp) or p.metric != "total_per_gpu":
                continue
            x = p.interactivity or p.reported_interactivity
            if x is None:
                x = next(c["interactivity"] for c in runs[p.config()] if c["concurrency"] == p.concurrency)
            ax.plot([x], [p.value], marker="D" if p.calibrates else "*", ms=7 if p.calibrates else 11, ls="",
                    color=colors.get(p.node, "k"), markeredgecolor="k",
                    label=f"{p.node} published{' (calibrates)' if p.calibrates else ''}")
        handles, labels = ax.get_legend_handles_labels()
        unique = dict(zip(labels, handles, strict=True))
        ax.legend(unique.values(), unique.keys(), fontsize=7)
        ax.set_title(f"DeepSeek-R1 FP8 {FixedLengths(isl, osl, 1).label}{f', MTP {mtp}' if mtp else ''}")
        ax.set_xlabel("interactivity (tok/s/user, 1 / median TPOT)")
        ax.set_ylabel("total tok/s per GPU (input + output)")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def validate(points: Sequence[Point], *, curve: Sequence[int] = CURVE, requests_per_slot: int = 10,
             min_requests: int = 32, workers: int = 0,
             progress: Callable[[str], None] = lambda _: None) -> tuple[list[Row], dict[Config, list[dict]]]:
    """The points compared with the simulator, and the simulated sweeps they were read from."""
    runs = sweeps(points, curve, requests_per_slot, min_requests, workers, progress)
    return compare(points, runs), runs


def explain(point: Point, chunk: int = 8192) -> str:
    """The step behind a point, explained by part (`explain.py`): its configuration's decode step with the point's
    concurrency decoding at the mean context of an answer (ISL + OSL / 2), and a prefill chunk of one prompt."""
    from ablations.backends.sim.explain import headline_steps, text

    config = point.config()
    setup, _ = _setup(config)
    model = setup.steps.models[setup.steps.k(point.concurrency or 1)]
    steps = headline_steps(model, point.concurrency or 1, config.isl + config.osl / 2, min(chunk, config.isl))
    return text(f"{config.label} ({point.id})", steps)


def to_json(rows: Sequence[Row], runs: dict[Config, list[dict[str, Any]]]) -> dict[str, Any]:
    """The comparison and the sweeps as plain data."""
    return {"summary": summary(rows),
            "points": [{**asdict(r.point), "simulated": r.simulated, "error": r.error} for r in rows],
            "sweeps": [{**asdict(c), "points": rows_} for c, rows_ in runs.items()]}
