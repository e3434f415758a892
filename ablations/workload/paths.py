"""Trace file paths: plain (absolute, or relative to the working directory) or `pkg://<package>/<file>`
inside an importable package, such as the vendored traces."""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

PACKAGE_PREFIX = "pkg://"
TRACES = "pkg://ablations.workload/traces"


def resolve_path(path: str | os.PathLike) -> Path:
    """The file `path` names: `pkg://<package>/<file>` inside the package, `~` expanded, else as given."""
    text = os.fspath(path)
    if not text.startswith(PACKAGE_PREFIX):
        return Path(text).expanduser()
    package, _, rest = text.removeprefix(PACKAGE_PREFIX).partition("/")
    if not package or not rest:
        raise ValueError(f"{text!r}: expected {PACKAGE_PREFIX}<package>/<file>")
    try:
        root = resources.files(package)
    except ModuleNotFoundError:
        raise ValueError(f"{text!r}: no package named {package!r}") from None
    return Path(str(root.joinpath(rest)))


def file_problem(path: Path) -> str | None:
    """Why `path` cannot be read as a file ("no such file", "is a directory"), or None."""
    if path.is_dir():
        return "is a directory, not a trace file"
    if not path.is_file():
        return "no such file"
    return None


def output_problem(path: Path) -> str | None:
    """Why a file cannot be written at `path` (a directory there, a missing parent directory), or None."""
    if path.is_dir():
        return "is a directory"
    parent = path.parent
    if not parent.exists():
        return f"directory {str(parent)!r} does not exist"
    if not parent.is_dir():
        return f"{str(parent)!r} is not a directory"
    return None
