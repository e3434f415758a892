"""`python -m ablations`: the Hydra app. A run builds its workload and reports its statistics; with
`backend=vllm` it also starts the tiny model's engine with the toggle vector `opts/<name>=<mode>` and
greedy-generates from the workload's first requests (`ablations/backends/vllm/cell.py`).

A bad value is a one-line `error: ...` on stderr and exit code 2; a failed run leaves no run directory.
"""

from __future__ import annotations

import json
import logging
import shutil
import sys
import time
from pathlib import Path

import hydra
from hydra._internal.utils import get_args_parser
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from ablations.backends.vllm.cell import PROCESS_DIR, run_cell
from ablations.config import AppConfig, check_overrides, register_configs, to_app
from ablations.workload import format_stats, load_workload, trace_stats, write_trace
from opts.registry import vector_dict

register_configs()
log = logging.getLogger("ablations")
TRACE_FILE = "workload.jsonl"


def run(app: AppConfig, out_dir: Path) -> dict:
    """Build the workload, write the run's result file into `out_dir`, return the result."""
    start = time.perf_counter()
    trace = load_workload(app.workload)
    stats = trace_stats(trace)
    result = {
        "workload": app.workload.name,
        "stats": stats,
        "toggles": vector_dict(app.toggles()),
        "tags": list(app.tags),
    }
    log.info("workload %s:\n%s", app.workload.name, format_stats(stats))
    out_dir.mkdir(parents=True, exist_ok=True)
    if app.backend is not None:
        result["model"] = app.model.name
        result["backend"] = run_cell(app.backend, app.model, result["toggles"], trace, out_dir,
                                     app.paths.model_cache)
    result["seconds"] = time.perf_counter() - start
    if app.save_trace:
        result["trace_file"] = str(write_trace(trace, out_dir / TRACE_FILE))
    path = out_dir / app.result_file
    path.write_text(json.dumps(result, indent=2, default=float) + "\n")
    log.info("result: %s", path)
    return result


def message(err: BaseException) -> str:
    """One line for an error: its first line, prefixed by the config key OmegaConf names."""
    lines = str(err).strip().splitlines()
    text = lines[0] if lines else type(err).__name__
    key = getattr(err, "full_key", None)
    return f"{key}: {text}" if key and key not in text else text


def discard(out_dir: Path, made: list[str]) -> None:
    """Remove what a failed run put in `out_dir` (Hydra's files and `made`), then the directories it leaves
    empty up to the working directory."""
    shutil.rmtree(out_dir / ".hydra", ignore_errors=True)
    shutil.rmtree(out_dir / PROCESS_DIR, ignore_errors=True)
    for name in made:
        (out_dir / name).unlink(missing_ok=True)
    cwd, out = Path.cwd().resolve(), out_dir.resolve()
    for directory in (out, *out.parents):
        if directory == cwd or (directory != out and cwd not in directory.parents):
            break
        try:
            directory.rmdir()
        except OSError:
            break


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    """Run the composed config. A failure removes the run directory (unless it holds an earlier run's result);
    a bad value exits 2 with a one-line error."""
    hydra_cfg = HydraConfig.get()
    out_dir = Path(hydra_cfg.runtime.output_dir)
    result_name = str(cfg.get("result_file") or "")
    names = (f"{hydra_cfg.job.name}.log", TRACE_FILE, result_name)
    made = [name for name in names if name and Path(name).name == name]
    earlier = result_name in made and (out_dir / result_name).exists()
    try:
        run(to_app(cfg), out_dir)
    except BaseException as err:
        if not earlier:
            discard(out_dir, made)
        if not isinstance(err, ValueError | OSError):
            raise
        print(f"error: {message(err)}", file=sys.stderr)
        sys.exit(2)


def cli(argv: list[str] | None = None) -> None:
    """Check the overrides (unknown group, option or field: exit 2 naming the valid ones), then run Hydra."""
    args = get_args_parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        check_overrides(args.overrides)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    main()


if __name__ == "__main__":
    cli()
