"""Every registered optimization package has the parts `opts/base.py` lists, and imports no other one."""

from __future__ import annotations

import ast
import importlib
import re
import sys
from pathlib import Path

import pytest
from import_graph import imported_modules

import opts
from opts.base import BenchCase, Optimization, ToggleConfig
from opts.registry import OPTIMIZATIONS
from opts.sim_setting import SimSetting
from opts.vllm_setting import PLATFORMS, VllmSetting

FILES = ("__init__.py", "config.py", "naive.py", "reference.py", "cases.py", "vllm.py", "sim.py", "README.md")
# Fixed names for fixed roles: the code vLLM's processes run is `in_vllm.py` (or the package `in_vllm/`), bench
# tooling beyond `cases.py` is under `bench/`; these names say what a module does, so none may stand at the top.
IN_VLLM = "in_vllm"
BENCH_NAMES = ("runner", "measure", "sweep", "plot", "evaluate", "pairs", "dist", "stack")
OPTS_DIR = Path(opts.__file__).parent


def optimization_packages() -> set[str]:
    """Dotted names of the optimization packages: every package under opts/ with a config.py."""
    return {f"opts.{p.parent.name}" for p in OPTS_DIR.glob("*/config.py")}


def toggle_problems(module) -> list[str]:
    found = [c for c in vars(module).values() if isinstance(c, type) and issubclass(c, ToggleConfig)
             and c.__module__ == module.__name__]
    if len(found) != 1:
        return [f"config.py: expected one ToggleConfig subclass, found {len(found)}"]
    cls = found[0]
    problems = []
    params = vars(cls).get("__dataclass_params__")   # its own, not ToggleConfig's
    if params is None or not params.frozen:
        problems.append(f"config.py: {cls.__name__} is not a frozen dataclass")
    if not {"off", "on"} <= set(cls.MODES):
        problems.append(f"config.py: {cls.__name__}.MODES {cls.MODES} lacks off or on")
    try:
        cls(mode="no-such-mode")
        problems.append(f"config.py: {cls.__name__} accepts mode 'no-such-mode'")
    except ValueError:
        pass
    except TypeError as err:
        problems.append(f"config.py: {cls.__name__}(mode=...) cannot be built: {err}")
    return problems


def vllm_problems(package: str, root: Path, optimization: Optimization | None) -> list[str]:
    """vllm.py: STOCK_MODES and vllm_setting (the registered ones), stock cells empty, no `ablations` import."""
    problems = [f"vllm.py: imports {name}" for name in sorted(imported_modules(root / "vllm.py"))
                if name == "ablations" or name.startswith("ablations.")]
    try:
        module = importlib.import_module(f"{package}.vllm")
    except Exception as err:
        return [*problems, f"vllm.py: import fails: {err!r}"]
    setting, stock = getattr(module, "vllm_setting", None), getattr(module, "STOCK_MODES", None)
    if not callable(setting) or not isinstance(stock, dict):
        return [*problems, "vllm.py: needs vllm_setting(config, platform) and STOCK_MODES"]
    if optimization is not None and (optimization.vllm_setting is not setting or optimization.stock_modes is not stock):
        problems.append("vllm.py: vllm_setting / STOCK_MODES are not the registered ones")
    config_cls = None
    if (root / "config.py").is_file():
        config_cls = next((c for c in vars(importlib.import_module(f"{package}.config")).values()
                           if isinstance(c, type) and issubclass(c, ToggleConfig) and c is not ToggleConfig), None)
    for platform, mode in stock.items():
        if platform not in PLATFORMS:
            problems.append(f"vllm.py: STOCK_MODES names unknown platform {platform!r}")
            continue
        if config_cls is None:
            continue
        try:
            result = setting(config_cls(mode=mode), platform)
        except Exception as err:
            problems.append(f"vllm.py: stock cell {mode} on {platform} fails: {err!r}")
            continue
        if not isinstance(result, VllmSetting) or not result.is_stock:
            problems.append(f"vllm.py: stock cell {mode} on {platform} is not an empty VllmSetting: {result!r}")
    return problems


def sim_problems(package: str, optimization: Optimization | None, config_cls: type | None) -> list[str]:
    """sim.py: sim_setting (the registered one); every mode on every platform a SimSetting or a ValueError naming
    the valid modes; off a SimSetting everywhere."""
    try:
        module = importlib.import_module(f"{package}.sim")
    except Exception as err:
        return [f"sim.py: import fails: {err!r}"]
    setting = getattr(module, "sim_setting", None)
    if not callable(setting):
        return ["sim.py: needs sim_setting(config, platform)"]
    problems = []
    if optimization is not None and optimization.sim_setting is not setting:
        problems.append("sim.py: sim_setting is not the registered one")
    for mode in config_cls.MODES if config_cls is not None else ():
        for platform in PLATFORMS:
            try:
                result = setting(config_cls(mode=mode), platform)
            except ValueError as err:
                if mode == "off":
                    problems.append(f"sim.py: off on {platform} fails: {err}")
                elif "valid:" not in str(err):
                    problems.append(f"sim.py: {mode} on {platform}: the error names no valid modes: {err}")
                continue
            except Exception as err:
                problems.append(f"sim.py: {mode} on {platform} fails: {err!r}")
                continue
            if not isinstance(result, SimSetting):
                problems.append(f"sim.py: {mode} on {platform} returns {type(result).__name__}, not a SimSetting")
    return problems


def name_problems(package: str, root: Path, optimization: Optimization | None) -> list[str]:
    """Fixed names: no top-level `vllm_*.py` or `engine.py` (in-vLLM code is `in_vllm`), which exists where `vllm.py`
    installs patches; `vllm.py` builds no function (its wrappers are `in_vllm`'s); no `measure.py` anywhere; bench
    tooling (`BENCH_NAMES`, the record's `run_bench`) under `bench/`."""
    problems = []
    for path in sorted(root.glob("*.py")):
        if (path.stem.startswith("vllm_") and path.stem != "vllm") or path.stem == "engine":
            problems.append(f"{path.name}: code vLLM runs goes in {IN_VLLM}.py or {IN_VLLM}/")
        if path.stem in BENCH_NAMES:
            problems.append(f"{path.name}: bench tooling goes under bench/")
    problems += [f"{p.relative_to(root)}: a name that says what it measures, not measure.py"
                 for p in sorted(root.rglob("measure.py"))]
    has_in_vllm = (root / f"{IN_VLLM}.py").is_file() or (root / IN_VLLM / "__init__.py").is_file()
    if (root / "vllm.py").is_file():
        tree = ast.parse((root / "vllm.py").read_text())
        for node in tree.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                nested = [n.name for n in ast.walk(node) if n is not node
                          and isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
                if nested:
                    problems.append(f"vllm.py: {node.name} builds {', '.join(nested)}: code vLLM runs goes in "
                                    f"{IN_VLLM}")
        if not has_in_vllm and _installs_patches(package):
            problems.append(f"vllm.py installs patches but the package has no {IN_VLLM}.py or {IN_VLLM}/")
    run_bench = getattr(optimization, "run_bench", None)
    if run_bench is not None and not run_bench.__module__.startswith(f"{package}.bench."):
        problems.append(f"run_bench is {run_bench.__module__}.{run_bench.__name__}, not under {package}.bench")
    return problems


def _installs_patches(package: str) -> bool:
    """Whether any mode of the package's toggle, on any platform, makes `vllm.py` install a patch."""
    try:
        module = importlib.import_module(f"{package}.vllm")
        config_cls = next(c for c in vars(importlib.import_module(f"{package}.config")).values()
                          if isinstance(c, type) and issubclass(c, ToggleConfig) and c is not ToggleConfig)
    except Exception:
        return False
    for mode in config_cls.MODES:
        for platform in PLATFORMS:
            try:
                if module.vllm_setting(config_cls(mode=mode), platform).patches:
                    return True
            except Exception:
                continue
    return False


def contract_problems(package: str, optimization: Optimization | None = None) -> list[str]:
    """What package `package` (importable, dotted) lacks of the contract in opts/base.py; [] when none."""
    module = importlib.import_module(package)
    root = Path(module.__file__).parent
    problems = [] if optimization is None or getattr(module, "OPTIMIZATION", None) is optimization else [
        "__init__.py: OPTIMIZATION is not the registered record"]
    problems += [f"{name}: missing" for name in FILES if not (root / name).is_file()]
    if (root / "config.py").is_file():
        try:
            problems += toggle_problems(importlib.import_module(f"{package}.config"))
        except Exception as err:
            problems.append(f"config.py: import fails: {err!r}")
    if (root / "cases.py").is_file():
        cases = importlib.import_module(f"{package}.cases")
        bench_cases = getattr(cases, "bench_cases", None)
        if bench_cases is None:
            problems.append("cases.py: no bench_cases")
        elif optimization is not None and optimization.bench_cases is not bench_cases:
            problems.append("cases.py: bench_cases is not the registered one")
        elif optimization is not None and optimization.run_bench is None:
            kinds = sorted({type(c).__name__ for c in bench_cases(True, "cpu") if not isinstance(c, BenchCase)})
            if kinds:
                problems.append(f"cases.py: bench_cases returns {', '.join(kinds)}, not BenchCase, and the record "
                                "sets no run_bench")
    if (root / "vllm.py").is_file():
        problems += vllm_problems(package, root, optimization)
    if (root / "sim.py").is_file():
        config_cls = None
        if (root / "config.py").is_file():
            config_cls = next((c for c in vars(importlib.import_module(f"{package}.config")).values()
                               if isinstance(c, type) and issubclass(c, ToggleConfig) and c is not ToggleConfig), None)
        problems += sim_problems(package, optimization, config_cls)
    if (root / "README.md").is_file():
        text = (root / "README.md").read_text()
        problems += [f"README.md: never says {w}" for w in ("off", "on") if not re.search(rf"\b{w}\b", text)]
    if (root / "__init__.py").is_file():
        tree = ast.parse((root / "__init__.py").read_text())
        targets = [t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets
                   if isinstance(t, ast.Name)]
        if "__all__" not in targets:
            problems.append("__init__.py: no __all__")
    problems += name_problems(package, root, optimization)
    others = optimization_packages() - {package}
    for path in sorted(root.rglob("*.py")):
        for name in sorted(imported_modules(path)):
            if any(name == o or name.startswith(f"{o}.") for o in others):
                problems.append(f"{path.relative_to(root)}: imports {name}, another optimization package")
    return problems + upward_imports(root)


def upward_imports(root: Path) -> list[str]:
    """Imports of `ablations` (the layer above) anywhere under `root`, function-level ones included."""
    return [f"{path.relative_to(root)}: imports {name}, the layer above" for path in sorted(root.rglob("*.py"))
            for name in sorted(imported_modules(path)) if name == "ablations" or name.startswith("ablations.")]


def test_opts_never_imports_ablations() -> None:
    assert upward_imports(OPTS_DIR) == []


@pytest.mark.parametrize("name", list(OPTIMIZATIONS))
def test_registered_package_keeps_the_contract(name: str) -> None:
    optimization = OPTIMIZATIONS[name]
    package = optimization.config_cls.__module__.rsplit(".", 1)[0]
    assert package == f"opts.{name}"
    assert contract_problems(package, optimization) == []


GOOD = {
    "__init__.py": "__all__ = []\n",
    "config.py": ("from dataclasses import dataclass\nfrom opts.base import ToggleConfig\n\n\n"
                  "@dataclass(frozen=True)\nclass FakeConfig(ToggleConfig):\n    pass\n"),
    "naive.py": "",
    "reference.py": "",
    "cases.py": "def bench_cases(quick, device):\n    return []\n",
    "vllm.py": ("from opts.vllm_setting import Patch, VllmSetting\n\nSTOCK_MODES = {'cpu': 'off'}\n\n\n"
                "def vllm_setting(config, platform):\n"
                "    if config.mode == 'off':\n        return VllmSetting()\n"
                "    return VllmSetting(patches=[Patch('m:f', lambda old: old, 'fake')])\n"),
    "sim.py": ("from opts.sim_setting import SimSetting, not_modelled\n\n\n"
               "def sim_setting(config, platform):\n"
               "    if config.mode == 'off':\n        return SimSetting()\n"
               "    return SimSetting(packed_kda=True)\n"),
    "README.md": "off runs the plain path, on the mechanism.\n",
    "in_vllm.py": "",
}
GOOD_VLLM = GOOD["vllm.py"]
BROKEN = {
    "no_naive": ({"naive.py": None}, "naive.py: missing"),
    "no_reference": ({"reference.py": None}, "reference.py: missing"),
    "no_readme": ({"README.md": None}, "README.md: missing"),
    "readme_without_on": ({"README.md": "off only\n"}, "never says on"),
    "no_all": ({"__init__.py": ""}, "no __all__"),
    "no_bench_cases": ({"cases.py": ""}, "no bench_cases"),
    "not_frozen": ({"config.py": GOOD["config.py"].replace("@dataclass(frozen=True)\n", "")},
                   "not a frozen dataclass"),
    "modes_without_on": ({"config.py": GOOD["config.py"].replace("    pass", "    MODES = ('off', 'x')")},
                         "lacks off or on"),
    "unchecked_mode": ({"config.py": GOOD["config.py"].replace(
        "    pass", "    def __post_init__(self):\n        pass")}, "accepts mode"),
    "no_config": ({"config.py": None}, "config.py: missing"),
    "imports_fusion": ({"naive.py": "from opts.fusion import stages\n"}, "imports opts.fusion"),
    "imports_from_opts": ({"reference.py": "from opts import kda_overlap\n"}, "imports opts.kda_overlap"),
    "imports_ablations": ({"naive.py": "def f():\n    from ablations.workload import generate\n"},
                          "naive.py: imports ablations.workload, the layer above"),
    "no_vllm": ({"vllm.py": None}, "vllm.py: missing"),
    "vllm_imports_ablations": ({"vllm.py": GOOD_VLLM + "from ablations.backends.vllm import patches\n"},
                               "vllm.py: imports ablations.backends.vllm"),
    "vllm_without_stock_modes": ({"vllm.py": GOOD_VLLM.replace("STOCK_MODES", "STOCK")},
                                 "needs vllm_setting(config, platform) and STOCK_MODES"),
    "stock_cell_patches": ({"vllm.py": GOOD_VLLM.replace("'cpu': 'off'", "'cpu': 'on'")},
                           "stock cell on on cpu is not an empty VllmSetting"),
    "unknown_platform": ({"vllm.py": GOOD_VLLM.replace("'cpu'", "'tpu'")}, "unknown platform 'tpu'"),
    "no_sim": ({"sim.py": None}, "sim.py: missing"),
    "sim_imports_ablations": ({"sim.py": GOOD["sim.py"] + "from ablations.backends.sim import cost\n"},
                              "sim.py: imports ablations.backends.sim.cost, the layer above"),
    "sim_without_sim_setting": ({"sim.py": "X = 1\n"}, "sim.py: needs sim_setting(config, platform)"),
    "sim_off_fails": ({"sim.py": GOOD["sim.py"].replace("    if config.mode == 'off':\n        return SimSetting()\n",
                                                        "    raise not_modelled('fake', config.mode, ())\n")},
                      "sim.py: off on cpu fails"),
    "vllm_named_module": ({"vllm_cpu.py": ""}, "vllm_cpu.py: code vLLM runs goes in in_vllm.py or in_vllm/"),
    "engine_module": ({"engine.py": ""}, "engine.py: code vLLM runs goes in in_vllm.py or in_vllm/"),
    "patches_without_in_vllm": ({"in_vllm.py": None}, "vllm.py installs patches but the package has no in_vllm"),
    "wrapper_built_in_vllm_py": ({"vllm.py": GOOD_VLLM + "\n\ndef wrap(base):\n    def forward(self):\n"
                                             "        return base(self)\n    return forward\n"},
                                 "vllm.py: wrap builds forward: code vLLM runs goes in in_vllm"),
    "runner_at_the_top": ({"runner.py": ""}, "runner.py: bench tooling goes under bench/"),
    "a_measure_module": ({"measure.py": ""}, "measure.py: a name that says what it measures"),
    "sim_returns_other": ({"sim.py": GOOD["sim.py"].replace("SimSetting(packed_kda=True)", "{}")},
                          "sim.py: on on cpu returns dict, not a SimSetting"),
}


def write_package(root: Path, pkg: str, changes: dict[str, str | None]) -> None:
    (root / pkg).mkdir()
    for name, text in {**GOOD, **changes}.items():
        if text is not None:
            (root / pkg / name).write_text(text)


@pytest.fixture
def fake_root(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [m for m in sys.modules if m.startswith("fake_opt_")]:
        del sys.modules[name]


def test_a_complete_fake_package_passes(fake_root) -> None:
    write_package(fake_root, "fake_opt_good", {})
    assert contract_problems("fake_opt_good") == []


@pytest.mark.parametrize("variant", list(BROKEN))
def test_an_incomplete_fake_package_fails(fake_root, variant: str) -> None:
    changes, problem = BROKEN[variant]
    write_package(fake_root, f"fake_opt_{variant}", changes)
    problems = contract_problems(f"fake_opt_{variant}")
    assert any(problem in p for p in problems), problems
