"""Per-process call counts of the plugin's replaced kernels, readable from other processes.

When `K3_ABLATE_COUNTER_DIR` is set, each vLLM process writes its counts to `<dir>/<pid>.counts.json`:
at once when a kernel is called for the first time, then from a background thread within `FLUSH_INTERVAL_S`
of any new call, and at exit. `read_counts(dir)` sums all processes; `wait_flushed()` is how long a reader
waits after the last call for every count to be on disk.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

COUNTER_DIR_ENV = "K3_ABLATE_COUNTER_DIR"
FLUSH_INTERVAL_S = 0.5

COUNTS_SUFFIX = ".counts.json"

_counts: Counter[str] = Counter()
_lock = threading.Lock()
_dirty = threading.Event()
_started = False

F = TypeVar("F", bound=Callable[..., Any])


@contextlib.contextmanager
def counting_into(directory: str | Path) -> Iterator[None]:
    """Inside, the vLLM processes this one starts write their counts and records into `directory`
    (`K3_ABLATE_COUNTER_DIR`, restored on exit)."""
    previous = os.environ.get(COUNTER_DIR_ENV)
    os.environ[COUNTER_DIR_ENV] = str(directory)
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(COUNTER_DIR_ENV, None)
        else:
            os.environ[COUNTER_DIR_ENV] = previous


def counter_dir() -> Path | None:
    value = os.environ.get(COUNTER_DIR_ENV)
    return Path(value) if value else None


def flush() -> None:
    """Write this process's counts now (no-op without `K3_ABLATE_COUNTER_DIR`)."""
    directory = counter_dir()
    if directory is None:
        return
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / f"{os.getpid()}{COUNTS_SUFFIX}"
    tmp = directory / f".{os.getpid()}.counts.tmp"
    with _lock:
        tmp.write_text(json.dumps(dict(_counts), sort_keys=True))
        tmp.replace(target)


def _flush_loop() -> None:
    while True:
        _dirty.wait()
        time.sleep(FLUSH_INTERVAL_S)
        _dirty.clear()
        flush()


def _start() -> None:
    global _started
    _started = True
    atexit.register(flush)
    threading.Thread(target=_flush_loop, name="k3-ablate-counters", daemon=True).start()


def count(name: str) -> None:
    """Record one call of the replaced kernel `name`."""
    with _lock:
        is_new = name not in _counts
        _counts[name] += 1
    if not _started:
        _start()
    if is_new:
        flush()
    else:
        _dirty.set()


def wait_flushed() -> None:
    """Sleep until counts made before this call are on disk in every process (the flush thread's period)."""
    time.sleep(3 * FLUSH_INTERVAL_S)


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
    for path in sorted(Path(directory).glob(f"*{COUNTS_SUFFIX}")):
        total.update(json.loads(path.read_text()))
    return dict(total)
