"""The layering: the app's config and the schemas import no backend (each backend checks its own config through
its schema's `VALIDATOR`), and `opts` imports nothing from `ablations`."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import ablations
import opts
from ablations.backends.sim.config import SimBackendConfig
from ablations.backends.vllm.config import VllmBackendConfig

ROOT = Path(ablations.__file__).parent
# The app's config and every schema it composes
SCHEMAS = ("config.py", "hardware.py", "paths.py", "experiment.py", "workload/config.py", "backends/sim/config.py",
           "backends/vllm/config.py")
SCHEMA_MODULES = {"ablations.backends.sim.config", "ablations.backends.vllm.config"}


def imports(path: Path) -> set[str]:
    """Every module `path` imports, at any depth (a function's lazy import too); `from a import b` counts a.b."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module)
            out.update(f"{node.module}.{alias.name}" for alias in node.names)
    return out


def backend_imports(path: Path) -> list[str]:
    """The backend modules `path` imports other than the backends' schemas (`from ablations.backends.sim.config
    import X` names X too, which is no module: only dotted names under a backend's package count)."""
    bad = []
    for name in sorted(imports(path)):
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


def test_opts_imports_nothing_from_ablations() -> None:
    root = Path(opts.__file__).parent
    found = [f"{p.relative_to(root)}: {name}" for p in sorted(root.rglob("*.py")) for name in sorted(imports(p))
             if name == "ablations" or name.startswith("ablations.")]
    assert found == []


@pytest.mark.parametrize("schema", [SimBackendConfig, VllmBackendConfig])
def test_each_backend_checks_its_own_config(schema) -> None:
    module = importlib.import_module(schema.VALIDATOR)
    assert callable(module.validate) and callable(module.wired)
    assert module.__name__.startswith(schema.__module__.rsplit(".", 1)[0] + ".")
