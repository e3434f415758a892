"""The run's limits and its process guard (tests/run_guard.py), tried on real pytest runs in a subprocess: a test
that hangs fails within seconds, a process a test leaves behind fails the run by name and does not survive it."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import procs
import pytest

pytestmark = pytest.mark.spawns

ROOT = Path(__file__).resolve().parents[2]
RUN_LIMIT_S = 120


def run_pytest(tmp_path: Path, source: str, *options: str) -> procs.subprocess.CompletedProcess:
    """pytest on one temporary test module, with this project's ini and the run_guard plugin; a run that does not
    end within RUN_LIMIT_S (a guard that let it hang) fails the calling test."""
    test = tmp_path / "test_probe.py"
    test.write_text(source)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "pytest", str(test), "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(tmp_path),
           "-p", "run_guard", "-p", "no:cacheprovider", "-q", "-o", "guard_grace=1", *options]
    return procs.run(cmd, timeout_s=RUN_LIMIT_S, cwd=tmp_path, env=env)


def test_the_limits_are_configured(pytestconfig):
    assert float(pytestconfig.getini("timeout")) > 0 and pytestconfig.getini("timeout_method") == "signal"
    assert float(pytestconfig.getini("engine_timeout")) > float(pytestconfig.getini("timeout"))


def test_a_test_that_sleeps_forever_fails_on_its_limit_within_seconds(tmp_path):
    done = run_pytest(tmp_path, "import time\n\ndef test_forever():\n    time.sleep(10**6)\n",
                               "-o", "timeout=2")
    assert done.returncode == 1, done.stdout[-3000:]
    assert "Timeout" in done.stdout and "1 failed" in done.stdout, done.stdout[-3000:]


def test_an_engine_test_gets_the_engine_limit(tmp_path):
    source = "import time\nimport pytest\n\n@pytest.mark.e2e\ndef test_engine():\n    time.sleep(10**6)\n"
    done = run_pytest(tmp_path, source, "-o", "timeout=600", "-o", "engine_timeout=2")
    assert done.returncode == 1 and "Timeout" in done.stdout, done.stdout[-3000:]


def test_a_process_left_behind_fails_the_run_by_name_and_is_ended(tmp_path):
    pid_file = tmp_path / "child.pid"
    source = ("import subprocess\n\ndef test_leaves_a_child():\n"
              "    child = subprocess.Popen(['sleep', '4242'])\n"
              f"    open({str(pid_file)!r}, 'w').write(str(child.pid))\n")
    done = run_pytest(tmp_path, source)
    assert "1 passed" in done.stdout, done.stdout[-3000:]
    assert done.returncode == 1, "a leftover process must fail the run"
    assert "process guard: 1 process(es)" in done.stdout and "sleep 4242" in done.stdout, done.stdout[-3000:]
    assert not procs.alive(int(pid_file.read_text()))


def test_a_hung_test_s_children_do_not_outlive_the_run(tmp_path):
    pid_file = tmp_path / "child.pid"
    source = ("import subprocess, time\n\ndef test_hangs_with_a_child():\n"
              "    child = subprocess.Popen(['sleep', '4343'])\n"
              f"    open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
              "    time.sleep(10**6)\n")
    done = run_pytest(tmp_path, source, "-o", "timeout=2")
    assert done.returncode == 1 and "Timeout" in done.stdout and "sleep 4343" in done.stdout, done.stdout[-3000:]
    assert not procs.alive(int(pid_file.read_text()))


def sleeping_4444(pid: int, within_s: float) -> bool:
    """Whether `pid` is still our `sleep 4444` after `within_s` (a SIGKILLed process may take a moment to go
    under load; a pid reused by another process does not count)."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            ours = b"4444" in Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return False
        if not (ours and procs.alive(pid)) or time.monotonic() > deadline:
            return ours and procs.alive(pid)
        time.sleep(0.05)


def test_procs_run_kills_the_whole_group_on_its_limit(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    script = (f"import subprocess, time\np = subprocess.Popen(['sleep', '4444'])\n"
              f"open({str(pid_file)!r}, 'w').write(str(p.pid))\ntime.sleep(10**6)\n")
    with pytest.raises(AssertionError, match="did not finish within 3 s"):
        procs.run([sys.executable, "-c", script], timeout_s=3)
    pid = int(pid_file.read_text())
    assert not sleeping_4444(pid, within_s=5), "the grandchild outlived its group's kill"
