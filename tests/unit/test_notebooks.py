"""The notebooks of notebooks/: stored without outputs, parameterized, and executed against a small sweep and
real microbenchmark JSON; a sweep missing a cell stops the attribution notebook with the cell's name."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient.exceptions import CellExecutionError
from notebook_exec import NOTEBOOKS, execute, plain, text_of
from toy_sweep import PLAYERS, write_sweep

NAMES = ("sweep.ipynb", "attribution.ipynb", "microbench.ipynb")
REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", NAMES)
def test_notebooks_are_stored_without_outputs_and_take_parameters(name):
    book = nbformat.read(NOTEBOOKS / name, as_version=4)
    nbformat.validate(book)
    code = [c for c in book.cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in code), f"{name}: clear its outputs"
    params = [c for c in code if "parameters" in c.metadata.get("tags", [])]
    assert len(params) == 1 and "os.environ.get(" in params[0].source, f"{name}: one papermill parameters cell"
    source = "\n".join(c.source for c in code)
    assert "from ablations." in source and "\ndef " not in source, f"{name}: calls the project, defines nothing"


@pytest.fixture(scope="module")
def bench_jsons(tmp_path_factory) -> str:
    """Real microbenchmark results: `python -m opts bench aiter_mla --quick --json` and pytest-benchmark's JSON of
    the same cases, both measured here with a short budget."""
    out = tmp_path_factory.mktemp("bench")
    run = [sys.executable, "-m", "opts", "bench", "aiter_mla", "--quick", "--budget", "0.05",
           "--json", str(out / "aiter_mla.json")]
    proc = subprocess.run(run, cwd=REPO, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0",
                           "tests/benchmarks/test_aiter_mla.py", "--benchmark-enable",
                           f"--benchmark-json={out / 'pytest_benchmark.json'}"], cwd=REPO, capture_output=True,
                          text=True, timeout=240, env={**_outside_xdist(), "K3_BENCH_QUICK": "1",
                                                        "K3_BENCH_SECONDS": "0.05"})
    assert proc.returncode == 0 and (out / "pytest_benchmark.json").is_file(), proc.stdout[-2000:] + proc.stderr[-2000:]
    return f"{out / 'aiter_mla.json'},{out / 'pytest_benchmark.json'}"


def _outside_xdist() -> dict[str, str]:
    """This environment without pytest-xdist's worker variables: a pytest started from an xdist worker would
    take itself for one, and pytest-benchmark measures nothing (and writes no JSON) under xdist."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST", "PYTEST_CURRENT_TEST"))}


@pytest.mark.spawns
def test_the_sweep_and_attribution_notebooks_run_on_a_small_sweep(tmp_path):
    sweep = write_sweep(tmp_path / "sweep")
    shown = text_of(execute("sweep.ipynb", {"K3_SWEEP_DIR": str(sweep)}))
    assert "8 cells under" in shown and "missing: none" in shown
    assert (sweep / "frontiers.png").is_file()
    shown = text_of(execute("attribution.ipynb", {"K3_SWEEP_DIR": str(sweep)}))
    out = json.loads((sweep / "attribution.json").read_text())
    assert out["shapley_method"] == "exact" and out["repeats"] == 2 and set(out["shapley_interval"]) == set(PLAYERS)
    assert f"sum of Shapley values {sum(out['shapley'].values()):.6g}" in shown
    assert (sweep / "attribution_bars.png").is_file() and (sweep / "interactions.png").is_file()


@pytest.mark.spawns
def test_the_attribution_notebook_shows_every_draws_values_and_the_intervals(tmp_path):
    sweep = write_sweep(tmp_path / "sweep", draws=4)
    shown = text_of(execute("attribution.ipynb", {"K3_SWEEP_DIR": str(sweep)}))
    out = json.loads((sweep / "attribution.json").read_text())
    assert out["draws"]["complete"] == 4 and "4 of 4 draws complete" in shown
    for d, values in out["draws"]["values"].items():       # a row per draw: its figure and its Shapley values
        x = out["draws"]["figures"][d]["x"]
        assert any(line.split()[:2] == [d, f"{x:.4g}"] for line in shown.splitlines()), (d, shown)
        assert values["fusion"] > 0
    fusion = [v["fusion"] for v in out["draws"]["values"].values()]
    assert fusion == sorted(fusion)                           # x scales fusion's speed-up
    assert "fusion: " in shown and " over the draws, P(>0) 1.00" in shown
    assert (sweep / "assumptions.png").is_file()


@pytest.mark.spawns
def test_a_sweep_missing_a_cell_stops_the_attribution_notebook_naming_it(tmp_path):
    sweep = write_sweep(tmp_path / "sweep", skip=(("fusion", 1),))
    with pytest.raises(CellExecutionError) as err:
        execute("attribution.ipynb", {"K3_SWEEP_DIR": str(sweep)})
    assert "SweepError: 1 of 8 cells missing: fusion repeat 1" in plain(str(err.value))


@pytest.mark.spawns
def test_the_microbench_notebook_shows_off_on_and_the_machine_of_every_number(bench_jsons, tmp_path):
    plot = tmp_path / "gains.png"
    shown = text_of(execute("microbench.ipynb", {"K3_BENCH_PATHS": bench_jsons, "K3_BENCH_PLOT": str(plot)}))
    assert plot.is_file()
    assert shown.count("aiter_mla") >= 6 and "geomean_gain" in shown


@pytest.mark.spawns
def test_the_microbench_notebook_refuses_numbers_without_their_machine(bench_jsons, tmp_path):
    first = Path(bench_jsons.split(",")[0])
    data = json.loads(first.read_text())
    for key in ("device", "cpu_model", "isa"):
        data.pop(key, None)
    for case in data["cases"]:
        case.pop("device", None)
    bad = tmp_path / "no_machine.json"
    bad.write_text(json.dumps(data))
    with pytest.raises(CellExecutionError) as err:
        execute("microbench.ipynb", {"K3_BENCH_PATHS": str(bad), "K3_BENCH_PLOT": str(tmp_path / "g.png")})
    assert f"numbers without their machine: ['{bad}: aiter_mla ctx4k_b1'" in plain(str(err.value))
