"""`python -m ablations`: the Hydra app. A run builds its workload and reports its statistics; with
`backend=vllm` it also starts the tiny model's engine with the toggle vector `opts/<name>=<mode>` and
replays the workload's first requests (`ablations/backends/vllm/cells/cell.py`); with `backend=sim` it simulates the
node replaying the workload at each concurrency of a sweep (`ablations/backends/sim/cell.py`).

A run is one ablation cell: one `result.json` (`ablations/cells.py`) in its output directory. In a multirun
(`-m design=factorial ...`, conf/design/; presets and modifiers in conf/experiment/) `ablation.cell` picks the
toggle vector; a cell whose result exists for the same config is skipped, a cell that fails records its error and
the sweep goes on, and the attribution runs at the end (`ablations/attribution/sweep.py`).

A bad value is a one-line `error: ...` on stderr and exit code 2; a failed single run leaves no run directory.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import sys
from pathlib import Path

import hydra
from hydra._internal.utils import get_args_parser
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from ablations.backends.vllm.cells.cell import PROCESS_DIR
from ablations.cells import (
    RESULT_FILE,
    config_hash,
    environment,
    finished,
    other_experiment,
    setting_hash,
    sweep_progress,
    write_result,
)
from ablations.config import apply_cell, check_overrides, players_of, register_configs, to_app
from ablations.experiment import design_cells
from ablations.run import TRACE_FILE, run

register_configs()
log = logging.getLogger("ablations")


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
    if hydra_cfg.mode == RunMode.MULTIRUN and cfg.ablation.cell:
        run_sweep_cell(cfg, out_dir, result_name)
        return
    try:
        app = to_app(cfg)
        run(app, out_dir, OmegaConf.to_container(cfg, resolve=True), players_of(cfg))
    except BaseException as err:
        if not earlier:
            discard(out_dir, made)
        if not isinstance(err, ValueError | OSError):
            raise
        print(f"error: {message(err)}", file=sys.stderr)
        sys.exit(2)


def run_sweep_cell(cfg: DictConfig, out_dir: Path, result_name: str) -> None:
    """One cell of a multirun: skipped when its result exists for the same config; an error is recorded in
    its result (status "failed") and the sweep goes on."""
    cfg = apply_cell(cfg)
    config = OmegaConf.to_container(cfg, resolve=True)
    players = players_of(cfg)
    this_hash = config_hash(config)
    done = finished(out_dir, this_hash) if result_name == RESULT_FILE else None
    other = other_experiment(out_dir / result_name, setting_hash(config, list(players)))
    if other:
        print(f"error: cell {cfg.ablation.cell}: {out_dir / result_name} holds a result of {other}; valid: another "
              "hydra.sweep.dir (nothing was overwritten)", file=sys.stderr)
        return
    if done is not None:
        log.info("cell %s (repeat %d): finished before, skipped (%s)", cfg.ablation.cell, cfg.ablation.repeat,
                 out_dir / result_name)
        return
    total = len(design_cells(cfg.ablation.design, players, num_permutations=cfg.ablation.num_permutations,
                             seed=cfg.ablation.seed)) * cfg.ablation.repeats * (1 + cfg.ablation.draws)
    draw = f", draw {cfg.ablation.draw}" if cfg.ablation.draws else ""
    which = f"{cfg.ablation.cell} (repeat {cfg.ablation.repeat}{draw})"
    headline = "failed"
    try:
        app = to_app(cfg)
        with quiet_console():       # the cell's own lines go to its log (<cell dir>/__main__.log), not the terminal
            result = run(app, out_dir, config, players)
        value = result["metrics"].get(cfg.ablation.metric)
        headline = f"{cfg.ablation.metric} {value:.6g}" if isinstance(value, int | float) else \
            f"no {cfg.ablation.metric}"
        headline += f" ({result['seconds']:.1f} s)"
    except Exception as err:
        text = message(err)
        print(f"error: cell {cfg.ablation.cell}: {text}", file=sys.stderr)
        if not isinstance(err, ValueError):         # a bug, not bad input: its traceback into the cell's log
            log.error("cell %s failed", cfg.ablation.cell, exc_info=err)
        detail = str(err).strip().splitlines()[1:]    # e.g. a dead server's log tail
        if detail:
            print("\n".join("  " + line for line in detail), file=sys.stderr)
        failed = {"schema": 1, "status": "failed", "error": f"{type(err).__name__}: {text}", "config": config,
                  "error_detail": str(err),
                  "config_hash": config_hash(config), "setting_hash": setting_hash(config, list(players)),
                  "ablation": {"design": cfg.ablation.design, "players": list(players), "cell": cfg.ablation.cell,
                               "repeat": cfg.ablation.repeat, "metric": cfg.ablation.metric},
                  "environment": environment()}
        write_result(out_dir / result_name, failed)
    log.info("[cell %d/%d] %s: %s %s", HydraConfig.get().job.num + 1, total, which, headline,
             sweep_progress(Path(HydraConfig.get().sweep.dir), total, result_name))


@contextlib.contextmanager
def quiet_console(level: int = logging.WARNING):
    """The root logger's console handlers at `level` inside (its file handlers keep every line)."""
    handlers = [h for h in logging.getLogger().handlers
                if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)]
    levels = [h.level for h in handlers]
    for handler in handlers:
        handler.setLevel(max(level, handler.level))
    try:
        yield
    finally:
        for handler, previous in zip(handlers, levels, strict=True):
            handler.setLevel(previous)


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
