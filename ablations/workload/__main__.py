"""`python -m ablations.workload stats|generate|export`: trace statistics, generated presets, conversion.

Every error is one line, `error: ...`, with exit code 2. FILE may be `.jsonl`, `.jsonl.gz` or
`pkg://<package>/<file>` (the vendored traces: pkg://ablations.workload/traces/<name>.jsonl.gz).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from ablations.workload.generate import generate
from ablations.workload.io import FORMATS, read_trace, sorted_by_arrival, write_trace
from ablations.workload.paths import output_problem
from ablations.workload.presets import PRESETS, preset
from ablations.workload.stats import format_stats, trace_stats
from ablations.workload.trace import Trace, TraceError
from opts.cli import Parser, int_at_least


def _check_out(path: str) -> None:
    problem = output_problem(Path(path))
    if problem:
        raise ValueError(f"--out {path}: {problem}")


def _stats(args: argparse.Namespace) -> int:
    stats = trace_stats(read_trace(args.file, block_size=args.block_size))
    print(json.dumps(stats, indent=2) if args.json else format_stats(stats))
    return 0


def _write(trace: Trace, path: str, form: str) -> None:
    write_trace(trace, path, form)
    print(f"wrote {path}: {len(trace.requests):,} requests, {form} form, block size {trace.block_size}",
          file=sys.stderr)


def _generate(args: argparse.Namespace) -> int:
    _check_out(args.out)
    config = preset(args.preset)
    if args.sessions is not None:
        config = config.with_overrides(num_sessions=args.sessions)
    began = time.perf_counter()
    trace = generate(config, seed=args.seed)
    print(f"generated {args.preset} (seed {args.seed}) in {time.perf_counter() - began:.1f} s", file=sys.stderr)
    _write(trace, args.out, args.format)
    return 0


def _export(args: argparse.Namespace) -> int:
    _check_out(args.out)
    trace = read_trace(args.file, block_size=args.block_size)
    if args.sort:
        trace = sorted_by_arrival(trace)
    _write(trace, args.out, args.format)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m ablations.workload", description=__doc__,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("stats", help="statistics of a timed_trace or session-form JSONL file")
    p.add_argument("file")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--block-size", type=int_at_least(1), help="block size of a file that records none (default 512)")
    p.set_defaults(func=_stats)
    p = sub.add_parser("generate", help="write a generated preset as JSONL")
    p.add_argument("preset", help=f"one of: {', '.join(PRESETS)}")
    p.add_argument("--out", required=True, help="output JSONL file (.gz: compressed); its directory must exist")
    p.add_argument("--seed", type=int_at_least(0), default=0, help="random seed (default 0)")
    p.add_argument("--sessions", type=int_at_least(1), help="number of root sessions (default: the preset's)")
    p.add_argument("--format", choices=FORMATS, default="session",
                   help="session (default; also a valid timed_trace) or timed_trace (Mooncake fields only)")
    p.set_defaults(func=_generate)
    p = sub.add_parser("export", help="convert a trace file, e.g. to a plain timed_trace")
    p.add_argument("file")
    p.add_argument("--format", choices=FORMATS, required=True)
    p.add_argument("--out", required=True, help="output JSONL file (.gz: compressed); its directory must exist")
    p.add_argument("--block-size", type=int_at_least(1), help="block size of a file that records none (default 512)")
    p.add_argument("--sort", action="store_true", help="reorder by timestamp instead of refusing a decrease")
    p.set_defaults(func=_export)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except (TraceError, ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
