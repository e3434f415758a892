"""Per-process call counts of the plugin's replaced kernels, readable from other processes.

When `K3_ABLATE_COUNTER_DIR` is set, each vLLM process writes its counts to `<dir>/<pid>.json`:
at once when a kernel is called for the first time, at most every `FLUSH_INTERVAL_S` after that,
and at exit. `read_counts(dir)` sums all processes.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

COUNTER_DIR_ENV = "K3_ABLATE_COUNTER_DIR"
FLUSH_INTERVAL_S = 0.5

_counts: Counter[str] = Counter()
_last_flush = 0.0
_atexit_registered = False

F = TypeVar("F", bound=Callable[..., Any])


def counter_dir() -> Path | None:
    value = os.environ.get(COUNTER_DIR_ENV)
    return Path(value) if value else None


def flush() -> None:
    """Write this process's counts now (no-op without `K3_ABLATE_COUNTER_DIR`)."""
    global _last_flush
    directory = counter_dir()
    if directory is None:
        return
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / f"{os.getpid()}.json"
    tmp = target.with_suffix(".tmp")
    tmp.write_text(json.dumps(dict(_counts), sort_keys=True))
    tmp.replace(target)
    _last_flush = time.monotonic()


def count(name: str) -> None:
    """Record one call of the replaced kernel `name`."""
    global _atexit_registered
    is_new = name not in _counts
    _counts[name] += 1
    if not _atexit_registered:
        atexit.register(flush)
        _atexit_registered = True
    if is_new or time.monotonic() - _last_flush > FLUSH_INTERVAL_S:
        flush()


def counted(name: str) -> Callable[[F], F]:
    """Decorator: count every call of the decorated replacement as `name`."""

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def inner(*args: Any, **kwargs: Any) -> Any:
            count(name)
            return fn(*args, **kwargs)

        return inner  # type: ignore[return-value]

    return wrap


def read_counts(directory: str | Path) -> dict[str, int]:
    """Counts summed over every process that wrote into `directory`."""
    total: Counter[str] = Counter()
    for path in sorted(Path(directory).glob("*.json")):
        total.update(json.loads(path.read_text()))
    return dict(total)
