"""Processes the test run starts: bounded, and never left behind.

`run(cmd, timeout_s)` is `subprocess.run` in its own process group, killed as a group when it times out or the
test is interrupted (pytest-timeout, Ctrl-C), so a CLI that started vLLM engine processes takes them along.
`live_descendants()` and `end_processes()` serve the end-of-session guard in tests/conftest.py.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

# Children that live as long as the interpreter by design, not a test's leftovers.
INFRASTRUCTURE = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")


@dataclass(frozen=True)
class Proc:
    pid: int
    command: str

    def __str__(self) -> str:
        return f"pid {self.pid}: {self.command[:200]}"


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _state_and_parent(pid: int | str) -> tuple[str, int] | None:
    """(state letter, parent pid) from /proc/<pid>/stat, or None when the process is gone."""
    stat = _read(Path(f"/proc/{pid}/stat"))
    if stat is None:
        return None
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ')'.
    state, ppid = stat[stat.rindex(")") + 2:].split()[:2]
    return state, int(ppid)


def alive(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie."""
    found = _state_and_parent(pid)
    return found is not None and found[0] not in "ZX"


def _children_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        found = _state_and_parent(entry.name) if entry.name.isdigit() else None
        if found is not None and found[0] not in "ZX":
            children.setdefault(found[1], []).append(int(entry.name))
    return children


def _command(pid: int) -> str:
    raw = _read(Path(f"/proc/{pid}/cmdline"))
    return raw.replace("\0", " ").strip() if raw else f"<{pid}>"


def live_descendants(pid: int | None = None, ignore_infrastructure: bool = True) -> list[Proc]:
    """Every live (not zombie) process below `pid` (default: this one), with its command line. Linux only: an
    empty list elsewhere."""
    if not Path("/proc/self/stat").exists():
        return []
    children, found, todo = _children_map(), [], [os.getpid() if pid is None else pid]
    while todo:
        for child in children.get(todo.pop(), []):
            todo.append(child)
            found.append(Proc(child, _command(child)))
    if ignore_infrastructure:
        found = [p for p in found if not any(name in p.command for name in INFRASTRUCTURE)]
    return found


def end_processes(procs: list[Proc], grace_s: float = 5.0) -> None:
    """SIGTERM `procs`, then SIGKILL whatever still lives after `grace_s`."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 0.0)):
        for p in procs:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(p.pid, sig)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and any(alive(p.pid) for p in procs):
            time.sleep(0.1)


def wait_gone(pid: int | None = None, within_s: float = 10.0) -> list[Proc]:
    """The descendants of `pid` still alive after waiting up to `within_s` for them to exit."""
    deadline = time.monotonic() + within_s
    while (left := live_descendants(pid)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def _kill_group(proc: subprocess.Popen) -> tuple[str | None, str | None]:
    """SIGKILL the command's process group; what it wrote (or a note where a process outside the group still holds
    its pipes, so reading them would wait)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    try:
        return proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        proc.wait()
        return None, "<output not read: a process outside the command's group holds its pipes>"


def run(cmd: list[str], timeout_s: float, **kwargs) -> subprocess.CompletedProcess:
    """`subprocess.run(cmd, capture_output=True, text=True)` bounded by `timeout_s`: on timeout, or any
    exception while waiting, the command's whole process group is killed, and a timeout raises an
    AssertionError carrying the command and the tail of its output."""
    kwargs.setdefault("capture_output", True)
    kwargs.setdefault("text", True)
    if kwargs.pop("capture_output"):
        kwargs["stdout"] = kwargs["stderr"] = subprocess.PIPE
    proc = subprocess.Popen(cmd, start_new_session=True, **kwargs)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        out, err = _kill_group(proc)
        raise AssertionError(f"{' '.join(map(str, cmd))[:300]} did not finish within {timeout_s:g} s (killed with "
                             f"its process group); stderr tail:\n{(err or '')[-3000:]}") from None
    except BaseException:
        _kill_group(proc)
        raise
    # A command that exited may still have left a group behind (a daemon it started): end it too.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
