"""`python -m opts bench moe_dedup`: every case on one pool of real ranks, a table, the crossover, the JSON."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from opts.machine import cpu_isa, cpu_model
from opts.moe_dedup.bench.rank_case import summarize, time_case
from opts.moe_dedup.bench.ranks import RankPool
from opts.moe_dedup.cases import DistCase

THREADS_PER_RANK = 1


def crossover(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per scope: the token counts where on is not faster than off (on/off >= 1), and the smallest count from
    which on is faster at every larger measured count (None: not at the largest)."""
    found: dict[str, dict[str, Any]] = {}
    for scope in dict.fromkeys(r["scope"] for r in rows):
        mine = sorted((r for r in rows if r["scope"] == scope and "on_over_off" in r), key=lambda r: r["num_tokens"])
        slower = [r["num_tokens"] for r in mine if r["on_over_off"] >= 1]
        faster_from = None
        for r in reversed(mine):
            if r["on_over_off"] >= 1:
                break
            faster_from = r["num_tokens"]
        found[scope] = {"on_not_faster_at": slower, "on_faster_from": faster_from,
                        "tokens": [r["num_tokens"] for r in mine]}
    return found


def table(rows: list[dict[str, Any]]) -> str:
    """The rows as a text table: median step ms per mode, on/off and sp/off, per-rank GFLOP, comm MB, check."""
    head = (f"{'case':<12} {'tokens':>6} {'off ms':>9} {'on ms':>9} {'sp ms':>9} {'on/off':>7} {'sp/off':>7} "
            f"{'GFLOP/rank off / on / sp':>26} {'comm MB':>8} {'max|on-off|':>11} {'max|sp-off|':>11}")
    lines = [head, "-" * len(head)]
    for r in rows:
        m = r["modes"]

        def ms(mode: str, m: dict[str, Any] = m) -> str:
            return f"{1e3 * m[mode]['median_s']:9.2f}" if mode in m else f"{'-':>9}"

        gflop = " / ".join(f"{m[x]['counts']['flops'] / 1e9:.3g}" for x in ("off", "on", "sp") if x in m)
        ratio = {x: f"{r[f'{x}_over_off']:7.3f}" if f"{x}_over_off" in r else f"{'-':>7}" for x in ("on", "sp")}
        diff = {x: f"{r['max_abs_diff'][x]:11.2e}" if x in r["max_abs_diff"] else f"{'-':>11}" for x in ("on", "sp")}
        lines.append(f"{r['case']:<12} {r['num_tokens']:>6} {ms('off')} {ms('on')} {ms('sp')} {ratio['on']} "
                     f"{ratio['sp']} {gflop:>26} {m['off']['counts']['comm_bytes'] / 1e6:8.2f} {diff['on']} "
                     f"{diff['sp']}")
    return "\n".join(lines)


def run_bench(cases: list[DistCase], *, quick: bool, out_dir: str | Path | None = None,
              progress: Callable[[str], None] | None = print) -> dict[str, Any]:
    """Run each case on `world_size` ranks (one pool per world size and backend, each rank on 1 CPU thread),
    print its line and then the table and the crossover; the JSON result. moe_dedup writes no files."""
    if out_dir is not None:
        raise ValueError(f"--out: moe_dedup writes no files (got {str(out_dir)!r}); use --json FILE")
    start = time.perf_counter()
    rows: list[dict[str, Any]] = []
    groups: dict[tuple[int, str], list[DistCase]] = {}
    for case in cases:
        groups.setdefault((case.world_size, case.backend), []).append(case)
    done = 0
    for (world_size, backend), group in groups.items():
        with RankPool(world_size, backend=backend, num_threads=THREADS_PER_RANK) as pool:
            for case in group:
                done += 1
                if progress:
                    progress(f"[case {done}/{len(cases)}] {case.name}: {case.scope} at {case.num_tokens} tokens, "
                             f"{case.rounds} rounds of {', '.join(case.modes)} on {world_size} {backend} ranks")
                case_start = time.perf_counter()
                rows.append(summarize(case, pool.run(time_case, case)))
                if progress:
                    r = rows[-1]
                    times = ", ".join(f"{m} {1e3 * v['median_s']:.2f} ms" for m, v in r["modes"].items())
                    progress(f"    {times}; on/off {r.get('on_over_off', float('nan')):.3f} "
                             f"({time.perf_counter() - case_start:.1f} s)")
    cross = crossover(rows)
    if progress:
        progress(table(rows))
        for scope, c in cross.items():
            progress(f"crossover ({scope}): on not faster than off at {c['on_not_faster_at'] or 'no'} token counts; "
                     f"on faster from {c['on_faster_from']} tokens on (measured: {c['tokens']})")
    return {"optimization": "moe_dedup", "quick": quick, "cpu_model": cpu_model(), "cpu_isa": cpu_isa(),
            "threads_per_rank": THREADS_PER_RANK, "seconds": time.perf_counter() - start, "cases": rows,
            "crossover": cross}
