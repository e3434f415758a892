"""A capacity sweep: every retention policy and Belady at capacities given as fractions of a scenario's working
set, plus the unbounded cache, the cells run in parallel over the machine's cores.

A scenario is a stream builder and a geometry. This package builds no stream from a trace: the layer above
hands it its scenarios through the entry-point group SCENARIO_GROUP (k3-ablate's workload registers the
built-in ones, `ablations.workload.cache_stream.cache_scenarios`), so `opts` never imports `ablations`.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

from opts.cache_retention.config import CacheRetentionConfig
from opts.cache_retention.reference import block_uses, run_belady, run_unbounded
from opts.cache_retention.retention import NO_SESSIONS, run
from opts.k3.cache import CacheStats, CapacityError, no_cycle_collection, stream_keys
from opts.k3.cache.geometry import CacheGeometry
from opts.k3.cache.stream import CacheStream

POLICIES = ("off", "evict", "resume", "on", "belady")
FRACTIONS = (0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1.0)
# Relative seconds of one cell (agentx), to start the longest first.
_COST = {"belady": 8.0, "on": 5.5, "evict": 5.5, "resume": 3.5, "off": 3.5}
SCENARIO_GROUP = "k3_ablate.cache_scenarios"
_STATS = ("hit_rate", "prefill_tokens_saved", "prompt_tokens", "num_evictions", "num_resumes", "checkpoint_bytes",
          "num_waits", "wait_s")


@dataclass(frozen=True)
class Scenario:
    """A named stream (`build()` makes it; picklable when cells run in worker processes) at a cache geometry;
    `quick` and `full`: whether the quick and the full bench run it."""

    name: str
    build: Callable[[], CacheStream]
    geometry: CacheGeometry
    quick: bool = False
    full: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"Scenario.name: invalid value {self.name!r}; valid: a non-empty string")
        if not callable(self.build):
            raise ValueError(f"Scenario {self.name!r}: build: {self.build!r} is not callable")
        if not isinstance(self.geometry, CacheGeometry):
            raise ValueError(f"Scenario {self.name!r}: geometry: {self.geometry!r} is not a CacheGeometry")


def scenarios() -> dict[str, Scenario]:
    """The scenarios the installed packages provide: each entry point of SCENARIO_GROUP loads a function that
    returns them by name; a name given twice is a ValueError naming both providers."""
    found: dict[str, Scenario] = {}
    owner: dict[str, str] = {}
    for point in sorted(entry_points(group=SCENARIO_GROUP), key=lambda p: p.value):
        for name, item in point.load()().items():
            if not isinstance(item, Scenario) or item.name != name:
                raise ValueError(f"{SCENARIO_GROUP} entry point {point.value}: {name!r} is not a Scenario of that "
                                 f"name: {item!r}")
            if name in found:
                raise ValueError(f"{SCENARIO_GROUP}: scenario {name!r} provided by both {owner[name]} and "
                                 f"{point.value}")
            found[name], owner[name] = item, point.value
    return found


def scenario(name: str) -> Scenario:
    """The installed scenario called `name`; an unknown name lists the valid ones."""
    known = scenarios()
    try:
        return known[name]
    except KeyError:
        raise ValueError(f"scenario: unknown name {name!r}; valid choices: {', '.join(known) or 'none installed'}"
                         ) from None


def check_fractions(fractions: Iterable[float]) -> tuple[float, ...]:
    """`fractions` as a sorted tuple of distinct numbers > 0; anything else is a ValueError naming it."""
    values = tuple(fractions)
    bad = [f for f in values if isinstance(f, bool) or not isinstance(f, int | float) or not (
        f > 0 and math.isfinite(f))]
    if bad or not values:
        raise ValueError(f"fractions: invalid value(s) {bad or values!r}; valid: fractions of the working set > 0")
    return tuple(sorted(set(values)))


def check_policies(policies: Iterable[str]) -> tuple[str, ...]:
    """`policies` in POLICIES order; an unknown one is a ValueError naming the valid ones."""
    values = tuple(policies)
    unknown = [p for p in values if p not in POLICIES]
    if unknown or not values:
        raise ValueError(f"policies: invalid value(s) {unknown or values!r}; valid choices: {', '.join(POLICIES)}")
    return tuple(p for p in POLICIES if p in values)


def num_blocks_at(working_set_blocks: int, fraction: float) -> int:
    """Pool blocks at `fraction` of the working set (at least 1)."""
    return max(1, int(working_set_blocks * fraction))


@dataclass(frozen=True)
class Prepared:
    """What every cell of a sweep shares, computed once: the stream's block names at the geometry's block size
    (`pool.stream_keys`) and, when Belady runs, its next uses (`reference.block_uses`)."""

    stream: CacheStream
    geometry: CacheGeometry
    keys_of: list[list]
    uses: dict | None


def run_policy(stream: CacheStream, geometry: CacheGeometry, policy: str, num_blocks: int, *,
               prepared: Prepared | None = None) -> CacheStats:
    """One policy (a CacheRetentionConfig mode, or "belady") at one capacity; `prepared`: the same stream and
    geometry's shared work, when a sweep computed it."""
    keys_of = prepared.keys_of if prepared is not None else None
    if policy == "belady":
        return run_belady(stream, geometry, num_blocks, keys_of=keys_of,
                          uses=prepared.uses if prepared is not None else None)
    return run(stream, geometry, num_blocks, CacheRetentionConfig(mode=policy), keys=keys_of)


def _row(policy: str, fraction: float | None, num_blocks: int, geometry: CacheGeometry, stats: CacheStats | None,
         reason: str | None, seconds: float) -> dict[str, Any]:
    row: dict[str, Any] = {"policy": policy, "fraction": fraction, "num_blocks": num_blocks,
                           "capacity_bytes": num_blocks * geometry.block_bytes, "feasible": stats is not None,
                           "reason": reason}
    summary = stats.summary() if stats is not None else {}
    row.update({name: summary.get(name) for name in _STATS})
    row["seconds"] = seconds
    if "fallback" in summary:
        row["fallback"] = summary["fallback"]
    return row


def _cell(prepared: Prepared, policy: str, fraction: float, num_blocks: int) -> dict:
    start = time.perf_counter()
    try:
        stats = run_policy(prepared.stream, prepared.geometry, policy, num_blocks, prepared=prepared)
        reason = None
    except CapacityError as err:
        stats, reason = None, str(err)
    return _row(policy, fraction, num_blocks, prepared.geometry, stats, reason, time.perf_counter() - start)


_WORK: Prepared | None = None


def _init_worker(prepared: Prepared) -> None:
    global _WORK
    _WORK = prepared


def _worker_cell_args(cell: tuple[str, float, int]) -> dict:
    assert _WORK is not None
    return _cell(_WORK, *cell)


def available_cores() -> int:
    """CPU cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _context():
    return multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")


def _run_cells(prepared: Prepared, cells: list[tuple[str, float, int]], workers: int) -> Iterator[dict]:
    if workers <= 1:
        for cell in cells:
            yield _cell(prepared, *cell)
        return
    pool = _context().Pool(workers, initializer=_init_worker, initargs=(prepared,))
    try:
        yield from pool.imap_unordered(_worker_cell_args, cells)
        pool.close()
    except BaseException:
        # An error, a Ctrl-C or a test's time limit: stop the workers now instead of waiting for their cells.
        pool.terminate()
        raise
    finally:
        pool.join()


def same_replay(stream: CacheStream, policies: Iterable[str]) -> dict[str, str]:
    """Policies whose replay of `stream` is another one's, step for step: on a stream without session ids every
    mode runs as off (`retention.run`'s fallback), so the sweep replays off once for all of them."""
    if stream.has_sessions or "off" not in policies:
        return {}
    return {p: "off" for p in policies if p not in ("off", "belady")}


def _copied_row(row: dict[str, Any], policy: str) -> dict[str, Any]:
    copied = {**row, "policy": policy, "seconds": 0.0, "same_replay_as": row["policy"]}
    if row["feasible"]:     # what the replay of `policy` would say (an infeasible one says nothing)
        copied["fallback"] = NO_SESSIONS
    return copied


def _ratio(on: float | None, off: float | None) -> float | None:
    if on is None or off is None or (off == 0 and on > 0):
        return None
    return on / off if off else 1.0


@dataclass(frozen=True)
class SweepResult:
    """A sweep's rows: the unbounded cache first, then one per (fraction, policy) in that order."""

    scenario: str
    geometry: str
    block_bytes: int
    num_requests: int
    working_set_blocks: int
    fractions: tuple[float, ...]
    policies: tuple[str, ...]
    rows: tuple[dict[str, Any], ...]
    seconds: float
    workers: int

    @property
    def unbounded(self) -> dict[str, Any]:
        return self.rows[0]

    def row(self, policy: str, fraction: float) -> dict[str, Any]:
        """The row of `policy` at `fraction`."""
        for r in self.rows:
            if r["policy"] == policy and r["fraction"] == fraction:
                return r
        raise ValueError(f"{self.scenario}: no row for policy {policy!r} at fraction {fraction!r}; policies: "
                         f"{', '.join(self.policies)}; fractions: {', '.join(map(str, self.fractions))}")

    def hit_rates(self, policy: str) -> list[float | None]:
        """`policy`'s hit rate per fraction (None where the capacity is infeasible)."""
        return [self.row(policy, f)["hit_rate"] for f in self.fractions]

    def ratios(self) -> list[float | None]:
        """on hit rate / off hit rate per fraction: 1 where both are 0, None where either is missing (infeasible,
        not swept) or only off's is 0."""
        if not {"on", "off"} <= set(self.policies):
            return [None] * len(self.fractions)
        return [_ratio(on, off) for on, off in zip(self.hit_rates("on"), self.hit_rates("off"), strict=True)]

    def to_dict(self) -> dict[str, Any]:
        return {"scenario": self.scenario, "geometry": self.geometry, "block_bytes": self.block_bytes,
                "num_requests": self.num_requests, "working_set_blocks": self.working_set_blocks,
                "working_set_bytes": self.working_set_blocks * self.block_bytes,
                "unbounded_hit_rate": self.unbounded["hit_rate"], "fractions": list(self.fractions),
                "policies": list(self.policies), "hit_rates": {p: self.hit_rates(p) for p in self.policies},
                "ratios": self.ratios(), "seconds": self.seconds, "workers": self.workers, "rows": list(self.rows)}

    def table(self) -> str:
        """The hit rates as text: one line per fraction, a column per policy, then on/off; reasons below."""
        head = (f"{self.scenario} at {self.geometry}: {self.num_requests} requests, working set "
                f"{self.working_set_blocks} blocks ({self.working_set_blocks * self.block_bytes / 1e9:.1f} GB), "
                f"unbounded hit rate {self.unbounded['hit_rate']:.4f}, {self.seconds:.1f} s on {self.workers} "
                f"worker(s)")
        lines = [head, f"{'fraction':>8} {'blocks':>8} {'GB':>8} " + " ".join(f"{p:>7}" for p in self.policies)
                 + f" {'on/off':>7}"]
        reasons: dict[str, None] = {}
        for fraction, ratio in zip(self.fractions, self.ratios(), strict=True):
            cells = []
            for policy in self.policies:
                r = self.row(policy, fraction)
                cells.append(f"{r['hit_rate']:7.4f}" if r["feasible"] else f"{'n/a':>7}")
                if r["reason"]:
                    reasons[f"fraction {fraction:g}: {r['reason']}"] = None
            r = self.row(self.policies[0], fraction)
            lines.append(f"{fraction:8g} {r['num_blocks']:8d} {r['capacity_bytes'] / 1e9:8.2f} " + " ".join(cells)
                         + (f" {ratio:7.4f}" if ratio is not None else f" {'n/a':>7}"))
        return "\n".join(lines + [f"  infeasible at {reason}" for reason in reasons])


def sweep(scenario: Scenario, fractions: Iterable[float] = FRACTIONS, policies: Iterable[str] = POLICIES, *,
          workers: int | None = None, progress: Callable[[str], None] | None = print) -> SweepResult:
    """Every policy at every capacity (fractions of the unbounded cache's working set) on `scenario`'s stream.

    The cells run on `workers` processes (default: every core this process may use; 1 runs them here), the
    longest first; `progress` gets one line per finished cell. A capacity too small for some request gives
    rows marked infeasible with the reason (the CapacityError).
    """
    fractions, policies = check_fractions(fractions), check_policies(policies)
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise ValueError(f"workers: invalid value {workers!r}; valid: an integer >= 1 or None (every core)")
    start = time.perf_counter()
    with no_cycle_collection():
        stream, geometry = scenario.build(), scenario.geometry
        unbounded_start = time.perf_counter()
        keys_of = stream_keys(stream, geometry.block_size)
        unbounded = run_unbounded(stream, geometry, keys_of)
        unbounded_s = time.perf_counter() - unbounded_start
        uses = block_uses(stream, geometry, keys_of, unbounded) if "belady" in policies else None
    prepared = Prepared(stream, geometry, keys_of, uses)
    working = unbounded.info["working_set_blocks"]
    same = same_replay(stream, policies)
    cells = sorted(((p, f, num_blocks_at(working, f)) for f in fractions for p in policies if p not in same),
                   key=lambda cell: (-_COST[cell[0]], cell[1]))
    workers = min(workers or available_cores(), len(cells))
    done: dict[tuple[str, float], dict] = {}
    total = len(fractions) * len(policies)
    for row in _run_cells(prepared, cells, workers):
        rows = [row] + [_copied_row(row, policy) for policy, runs in same.items() if runs == row["policy"]]
        for r in rows:
            done[r["policy"], r["fraction"]] = r
            if progress:
                result = f"hit {r['hit_rate']:.4f}" if r["feasible"] else "infeasible"
                copied = f", the replay of {r['same_replay_as']}" if "same_replay_as" in r else ""
                progress(f"[{len(done)}/{total}] {scenario.name} fraction {r['fraction']:g} "
                         f"({r['num_blocks']} blocks) {r['policy']}: {result} ({r['seconds']:.1f} s{copied})")
    rows = [_row("unbounded", None, working, geometry, unbounded, None, unbounded_s)]
    rows += [done[p, f] for f in fractions for p in policies]
    return SweepResult(scenario=scenario.name, geometry=geometry.name, block_bytes=geometry.block_bytes,
                       num_requests=len(stream.requests), working_set_blocks=working, fractions=fractions,
                       policies=policies, rows=tuple(rows), seconds=time.perf_counter() - start, workers=workers)
