"""Compose every entry point of the Hydra app: the root config with each option of each group."""

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import ablations.__main__ as app_main
from ablations.config import AppConfig, register_configs

CONF = Path(__file__).resolve().parents[2] / "conf"


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def compose_app(overrides: list[str]) -> AppConfig:
    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    app = OmegaConf.to_object(cfg)
    assert isinstance(app, AppConfig)
    return app


def test_default_config_composes():
    app = compose_app([])
    assert app.workload.name == "agentx"


@pytest.mark.parametrize("option", options("workload"))
def test_every_workload_option_composes(option):
    app = compose_app([f"workload={option}"])
    assert app.workload.name == option
    if app.workload.path is not None:
        assert app.workload.resolved_path.is_file(), app.workload.resolved_path


@pytest.mark.parametrize("option", options("model"))
def test_every_model_option_composes(option):
    assert compose_app([f"model={option}"]).model.name == option


@pytest.mark.parametrize("option", options("experiment"))
def test_every_experiment_composes(option):
    compose_app([f"experiment={option}"])


def test_typed_schema_rejects_bad_values():
    with pytest.raises(Exception, match="schedule"):
        compose_app(["workload.schedule=sometimes"])
    with pytest.raises(Exception, match="num_sessions"):
        compose_app(["workload.num_sessions=not-a-number"])


def test_app_run_writes_result(tmp_path):
    app = compose_app(["experiment=cpu_small"])
    result = app_main.run(app, tmp_path)
    assert (tmp_path / "result.json").is_file()
    assert result["stats"]["requests"] > 0
    assert result["stats"]["theoretical_prefix_reuse"] > 0.96


def test_cli_entry_point_runs(tmp_path):
    import json
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "ablations", "experiment=cpu_small", f"hydra.run.dir={tmp_path}"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "prefix reuse" in proc.stdout
    assert json.loads((tmp_path / "result.json").read_text())["workload"] == "agentx_small"
