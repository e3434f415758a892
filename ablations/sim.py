"""`python -m ablations.sim report [--json FILE]`: the simulator's report (ablations/backends/sim/report.py) —
Kimi K3 on agentx on MI355X and B300 nodes, all toggles off and every modelled toggle on, the headline, tokens
per dollar, the frontier, and the headline's sensitivity to each assumed profile value (±20%)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from ablations.backends.sim.report import HARDWARE, report, table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ablations.sim", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    rep = commands.add_parser("report", help="the headline per node, all off and all on, with its sensitivity")
    rep.add_argument("--json", type=Path, help="also write the rows as JSON to this file")
    rep.add_argument("--hardware", nargs="+", default=list(HARDWARE), help="hardware options (default: %(default)s)")
    rep.add_argument("--no-sensitivity", action="store_true", help="skip the ±20%% runs of the assumed values")
    rep.add_argument("--workers", type=int, default=None, help="processes (default: one per core)")
    rep.add_argument("overrides", nargs="*", help="Hydra overrides for every cell, e.g. backend.concurrency=[1,2,4]")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    try:
        rows = report(tuple(args.hardware), sensitivity=not args.no_sensitivity, workers=args.workers,
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


if __name__ == "__main__":
    sys.exit(main())
