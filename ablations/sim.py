"""`python -m ablations.sim report [--json FILE]`: the simulator's report (ablations/backends/sim/report.py) —
Kimi K3 on agentx on MI355X and B300 nodes, stock, all toggles off and every modelled toggle on, the headline,
tokens per dollar, the frontier, draft_length's K per batch size, and the all-off headline's sensitivity to every
figure with a range (and each assumed one at ±20%). `python -m ablations.sim explain`: a decode step and a prefill
chunk at the headline's point on each node, by kernel class, launches, collectives and host. `python -m ablations.sim
validate`: DeepSeek-R1 simulated at each published point's configuration (backends/sim/validate.py), published
against simulated, the node-against-node orderings, and a plot of the frontiers. `python -m ablations.sim
calibrate [--write]`: the hardware figures the points marked `calibrates` set, one per platform
(backends/sim/calibrate_points.py)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from ablations.backends.sim import calibrate_points
from ablations.backends.sim.report import HARDWARE, OPTS, SENSITIVITY, explain, report, table
from ablations.backends.sim.validate import CURVE, POINTS_FILE, load_points, plot, to_json, validate, worst_per_node
from ablations.backends.sim.validate import explain as explain_point
from ablations.backends.sim.validate import table as validation_table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ablations.sim", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    rep = commands.add_parser("report", help="the headline per node, stock, all off and all on, with its sensitivity")
    rep.add_argument("--json", type=Path, help="also write the rows as JSON to this file")
    rep.add_argument("--hardware", nargs="+", default=list(HARDWARE), help="hardware options (default: %(default)s)")
    rep.add_argument("--sensitivity", nargs="*", default=list(SENSITIVITY),
                     help="the nodes whose all-off headline is moved (default: %(default)s; none: give no names)")
    rep.add_argument("--no-sensitivity", action="store_true", help="move no figure (as --sensitivity with no names)")
    rep.add_argument("--workers", type=int, default=None, help="processes (default: one per core)")
    rep.add_argument("overrides", nargs="*", help="Hydra overrides for every cell, e.g. backend.concurrency=[1,2,4]")
    exp = commands.add_parser("explain", help="a decode step and a prefill chunk at the headline's point, by part")
    exp.add_argument("--hardware", nargs="+", default=list(HARDWARE), help="hardware options (default: %(default)s)")
    exp.add_argument("--opts", choices=OPTS, default="all_off", help="the toggle set (default: %(default)s)")
    exp.add_argument("--sessions", type=int, default=6, help="live sessions decoding (default: %(default)s)")
    exp.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. backend.kv_dtype=fp8")
    val = commands.add_parser("validate", help="DeepSeek-R1 against published single-node GPU results")
    val.add_argument("--points", type=Path, default=POINTS_FILE, help="the published points (default: %(default)s)")
    val.add_argument("--plot", type=Path, default=Path("docs/validate_deepseek_r1.png"),
                     help="the frontiers' plot (default: %(default)s)")
    val.add_argument("--json", type=Path, help="also write the comparison and the sweeps as JSON to this file")
    val.add_argument("--curve", type=int, nargs="*", default=list(CURVE),
                     help="concurrencies every configuration runs besides its points' (default: %(default)s)")
    val.add_argument("--requests-per-slot", type=int, default=10,
                     help="requests per concurrency slot, as InferenceX sends 10 x concurrency (default: %(default)s)")
    val.add_argument("--workers", type=int, default=0, help="processes (default: one per core)")
    val.add_argument("--explain", nargs="*", metavar="POINT",
                     help="also explain the steps behind these points (no names: each node's worst miss)")
    cal = commands.add_parser("calibrate", help="the hardware figures the points marked `calibrates` set")
    cal.add_argument("--points", type=Path, default=POINTS_FILE, help="the published points (default: %(default)s)")
    cal.add_argument("--write", action="store_true", help="write each fitted value into its platform's profiles")
    cal.add_argument("--requests-per-slot", type=int, default=10,
                     help="requests per concurrency slot, as validate runs them (default: %(default)s)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    try:
        if args.command == "calibrate":
            return _calibrate(args, start)
        if args.command == "validate":
            return _validate(args, start)
        if args.command == "explain":
            print(explain(tuple(args.hardware), args.opts, args.sessions, tuple(args.overrides)))
            return 0
        sensitivity = () if args.no_sensitivity else tuple(args.sensitivity)
        rows = report(tuple(args.hardware), sensitivity=sensitivity, workers=args.workers,
                      overrides=tuple(args.overrides), progress=lambda line: print(line, file=sys.stderr, flush=True))
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(table(rows))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    print(f"sim report: {len(rows)} rows in {time.perf_counter() - start:.0f} s", file=sys.stderr)
    return 0


def _calibrate(args: argparse.Namespace, start: float) -> int:
    found = calibrate_points.calibrate(load_points(args.points), requests_per_slot=args.requests_per_slot,
                                       progress=lambda line: print(line, file=sys.stderr, flush=True))
    if not found:
        raise ValueError(f"{args.points}: no point is marked calibrates: nothing to fit")
    print(calibrate_points.table(found))
    for c in found if args.write else ():
        for path in calibrate_points.write(c):
            print(f"wrote {c.figure}: {c.value:g} into {path}", file=sys.stderr)
    print(f"sim calibrate: {len(found)} figures in {time.perf_counter() - start:.0f} s", file=sys.stderr)
    return 0


def _validate(args: argparse.Namespace, start: float) -> int:
    rows, runs = validate(load_points(args.points), curve=args.curve, requests_per_slot=args.requests_per_slot,
                          workers=args.workers, progress=lambda line: print(line, file=sys.stderr, flush=True))
    print(validation_table(rows))
    if args.explain is not None:
        names = args.explain or [worst_per_node(rows)[node].point.id for node in sorted(worst_per_node(rows))]
        by_id = {r.point.id: r.point for r in rows}
        for name in names:
            if name not in by_id:
                raise ValueError(f"--explain: no point {name!r}; valid: {', '.join(by_id)}")
            print("\n" + explain_point(by_id[name]))
    print(f"plot: {plot(rows, runs, args.plot)}", file=sys.stderr)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(to_json(rows, runs), indent=1) + "\n")
    print(f"sim validate: {len(rows)} points in {time.perf_counter() - start:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
