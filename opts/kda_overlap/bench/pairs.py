"""Per-pair off/on ratios for kda_overlap's cases, for machines too noisy for a ratio of medians.

    python -m opts.kda_overlap.bench.pairs --seconds 40 [--quick] [--case verify]

Off and on run back to back, the order flipped every pair; each pair's off/on ratio shares its moment's load.
"""

from __future__ import annotations

import argparse
import statistics

from opts.bench import compare
from opts.kda_overlap.cases import bench_cases


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m opts.kda_overlap.bench.pairs", description=__doc__)
    parser.add_argument("--seconds", type=float, default=20.0, help="seconds per case (verify-only gets half)")
    parser.add_argument("--quick", action="store_true", help="the small case set")
    parser.add_argument("--case", help="only the cases whose name contains this")
    args = parser.parse_args(argv)
    for case in bench_cases(args.quick, "cpu"):
        if args.case and args.case not in case.name:
            continue
        seconds = args.seconds / 2 if "verify_only" in case.name else args.seconds
        timing = compare(case.setup(), "cpu", budget_s=seconds, min_rounds=5, max_rounds=1 << 30)
        off_s, on_s = timing.off_s, timing.on_s
        ratios = sorted(a / b for a, b in zip(off_s, on_s, strict=True))
        q1, q3 = ratios[len(ratios) // 4], ratios[(3 * len(ratios)) // 4]
        off_ms, on_ms = statistics.median(off_s) * 1e3, statistics.median(on_s) * 1e3
        print(f"{case.name:<40} off {off_ms:8.1f} ms  on {on_ms:8.1f} ms"
              f"  off/on per pair: median {statistics.median(ratios):.3f} (25-75%: {q1:.3f}-{q3:.3f})"
              f"  pairs {len(ratios)}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
