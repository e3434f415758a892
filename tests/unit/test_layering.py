"""The layering: the app's config and the schemas import no backend (each backend checks its own config through
its schema's `VALIDATOR`); the simulator sees a toggle only through the registry and its `SimSetting`, importing
no toggle package. The other arrow, `opts` importing nothing from `ablations`, is the contract test's
(`tests/unit/optimizations/test_contract.py::test_opts_never_imports_ablations`)."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
from import_graph import imported_modules

import ablations
from ablations.backends.sim.config import SimBackendConfig
from ablations.backends.vllm.config import VllmBackendConfig
from opts.registry import OPTIMIZATIONS

ROOT = Path(ablations.__file__).parent
# The app's config and every schema it composes
SCHEMAS = ("config.py", "hardware.py", "paths.py", "experiment.py", "workload/config.py", "backends/sim/config.py",
           "backends/vllm/config.py")
SCHEMA_MODULES = {"ablations.backends.sim.config", "ablations.backends.vllm.config"}


def backend_imports(path: Path) -> list[str]:
    """The backend modules `path` imports other than the backends' schemas (`from ablations.backends.sim.config
    import X` names X too, which is no module: only dotted names under a backend's package count)."""
    bad = []
    for name in sorted(imported_modules(path)):
        if not name.startswith("ablations.backends."):
            continue
        parts = name.split(".")
        module = ".".join(parts[:4])
        if module in SCHEMA_MODULES or len(parts) < 4:
            continue
        bad.append(name)
    return bad


@pytest.mark.parametrize("schema", SCHEMAS)
def test_the_config_and_the_schemas_import_no_backend(schema: str) -> None:
    assert backend_imports(ROOT / schema) == []


def test_a_planted_backend_import_is_found(tmp_path: Path) -> None:
    planted = tmp_path / "config.py"
    planted.write_text("from ablations.backends.sim.config import SimBackendConfig\n\n\ndef f():\n"
                       "    from ablations.backends.sim.cell import settings\n    return settings\n")
    assert backend_imports(planted) == ["ablations.backends.sim.cell", "ablations.backends.sim.cell.settings"]


@pytest.mark.parametrize("schema", [SimBackendConfig, VllmBackendConfig])
def test_each_backend_checks_its_own_config(schema) -> None:
    module = importlib.import_module(schema.VALIDATOR)
    assert callable(module.validate) and callable(module.wired)
    assert module.__name__.startswith(schema.__module__.rsplit(".", 1)[0] + ".")


def toggle_imports(path: Path) -> list[str]:
    """The toggle packages' modules (`opts.<toggle>...`) `path` imports."""
    return sorted(name for name in imported_modules(path)
                  if name.split(".")[0] == "opts" and len(name.split(".")) > 1 and name.split(".")[1] in OPTIMIZATIONS)


@pytest.mark.parametrize("module", sorted(p.name for p in (ROOT / "backends" / "sim").glob("*.py")))
def test_the_simulator_imports_no_toggle_package(module: str) -> None:
    # what a toggle hands the simulator (fusion's fused pricing, draft_length's schedule) travels in its SimSetting
    assert toggle_imports(ROOT / "backends" / "sim" / module) == []


def test_a_planted_toggle_import_is_found(tmp_path: Path) -> None:
    planted = tmp_path / "cost.py"
    planted.write_text("from opts.k3 import K3\nfrom opts.sim_setting import StageTraffic\n"
                       "from opts.fusion.sim import fused_kda_decode\n")
    assert toggle_imports(planted) == ["opts.fusion.sim", "opts.fusion.sim.fused_kda_decode"]
