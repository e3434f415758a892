"""kda_overlap's Triton packed kernel, tested under Triton's interpreter: `kda_triton_checks.py` in a process of
its own started with TRITON_INTERPRET=1 (triton reads it once, at its first import, so it cannot be switched on
inside this process, where vLLM imports triton compiled)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import procs

CHECKS = Path(__file__).with_name("kda_triton_checks.py")


def test_the_triton_kernel_passes_its_checks_in_the_interpreter(tmp_path):
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = procs.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
                      str(CHECKS)], timeout_s=600, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "failed" not in done.stdout
