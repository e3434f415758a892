"""`python -m opts list|bench`: the registered optimizations and their microbenchmarks."""

from __future__ import annotations

import argparse
import json
import sys

import torch

from opts import bench, registry
from opts.cli import Parser, int_at_least


def _list(args: argparse.Namespace) -> int:
    rows = [{"name": opt.name, "description": opt.description, "modes": list(opt.config_cls.MODES)}
            for opt in registry.OPTIMIZATIONS.values()]
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        width = max(len(r["name"]) for r in rows)
        for r in rows:
            print(f"{r['name']:<{width}}  {r['description']}")
    return 0


def _bench(args: argparse.Namespace) -> int:
    opt = registry.get(args.name)
    if not args.budget > 0:
        raise ValueError(f"--budget: invalid value {args.budget}; must be > 0 seconds")
    device = bench.check_device(args.device or bench.default_device())
    if args.json:
        bench.check_writable(args.json)
    if args.out is not None and not opt.writes_files:
        writers = [o.name for o in registry.OPTIMIZATIONS.values() if o.writes_files]
        raise ValueError(f"--out: {opt.name} writes no files but --json; --out is for {', '.join(writers)}")
    if opt.run_bench is not None:
        cases = bench.select_cases(opt, args.quick, device, args.case)
        result = opt.run_bench(cases, quick=args.quick, out_dir=args.out)
    else:
        if args.threads is not None:
            torch.set_num_threads(args.threads)
        result = bench.run(opt, quick=args.quick, device=device, only=args.case, budget_s=args.budget)
    if args.json:
        bench.write_json(result, args.json)
        print(f"wrote {args.json}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m opts", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("list", help="the registered optimizations, one line each")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=_list)
    p = sub.add_parser("bench", help="off against on, same inputs, same run (cache_retention: hit rates)")
    p.add_argument("name", help=f"one of: {', '.join(registry.names())}")
    p.add_argument("--quick", action="store_true", help="the small case set")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    p.add_argument("--device", help="cpu or cuda (default: cuda if present)")
    p.add_argument("--case", help="run only the case of this name (else those whose name contains it)")
    p.add_argument("--budget", type=float, default=1.0, help="seconds of timing per case (default 1)")
    p.add_argument("--out", metavar="DIR", help="folder for the plots of a package that writes them "
                   "(cache_retention; default outputs/cache_retention/ here)")
    p.add_argument("--threads", type=int_at_least(1),
                   help="torch CPU threads (default: torch's; 1 is steadier on a shared CPU)")
    p.set_defaults(func=_bench)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except AssertionError as err:
        print(f"error: {str(err).splitlines()[0]}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
