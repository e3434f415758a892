"""The Hydra app's typed root schema, the ConfigStore registration of every group's schema, and the checks
and composition the app and the tests share."""

from __future__ import annotations

import typing
from collections.abc import Sequence
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from omegaconf import MISSING, DictConfig, OmegaConf

from ablations.backends.vllm.config import ModelConfig
from ablations.workload.config import WorkloadConfig
from ablations.workload.config import register_configs as register_workload
from opts.base import check_known_fields

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"
ROOT_SCHEMA = "app_schema"
MODEL_SCHEMA = "model_schema"
GROUPS = ("experiment", "model", "workload")


@dataclass
class AppConfig:
    """Root of `conf/config.yaml`. Each group's node is typed by its own schema."""

    workload: WorkloadConfig = MISSING
    model: ModelConfig = MISSING
    save_trace: bool = False
    result_file: str = "result.json"
    tags: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.result_file or Path(self.result_file).name != self.result_file:
            raise ValueError(f"AppConfig.result_file: {self.result_file!r} is not a plain file name")


def register_configs() -> None:
    """Register the root schema and every group schema as top-level configs (never group options); idempotent."""
    cs = ConfigStore.instance()
    cs.store(name=ROOT_SCHEMA, node=AppConfig)
    cs.store(name=MODEL_SCHEMA, node=ModelConfig)
    register_workload(cs)


def group_options(group: str) -> list[str]:
    """The options of a config group: its yaml files in conf/<group>/."""
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def _values(override: Override) -> list[str]:
    if override.is_sweep_override():
        return list(override.sweep_string_iterator())
    value = override.value()
    return [] if value is None else [str(value)]


def _check_field(key: str) -> None:
    node: Any = AppConfig
    names = key.split(".")
    for depth, name in enumerate(names):
        if not is_dataclass(node):
            return
        if name not in {f.name for f in fields(node)}:
            if depth == 0:
                raise ValueError(f"{key}: unknown group or field {name!r}; groups: {', '.join(GROUPS)}; "
                                 f"fields: {', '.join(sorted(f.name for f in fields(AppConfig)))}")
            check_known_fields(node, [name], ".".join(names[:depth]))
        node = typing.get_type_hints(node)[name]


def check_overrides(overrides: Sequence[str]) -> None:
    """Raise ValueError, naming the valid choices, for an override whose group, option or field is unknown.
    `hydra...` keys and unparsable overrides are left to Hydra."""
    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except Exception:
        return
    for override in parsed:
        key = override.key_or_group
        if key.split(".")[0] == "hydra" or "/" in key or override.package is not None or override.is_delete():
            continue
        if key in GROUPS:
            valid = group_options(key)
            for value in _values(override):
                if value not in valid:
                    raise ValueError(f"{key}: unknown option {value!r}; valid options: {', '.join(valid)}")
        else:
            _check_field(key)


def to_app(cfg: DictConfig) -> AppConfig:
    """The validated AppConfig of a composed config (each dataclass checks its own fields)."""
    app = OmegaConf.to_object(cfg)
    if not isinstance(app, AppConfig):
        raise TypeError(f"expected an AppConfig, got {type(app).__name__}")
    return app


def compose_app(overrides: Sequence[str] = ()) -> AppConfig:
    """The AppConfig `python -m ablations <overrides>` runs with (for tests and notebooks)."""
    check_overrides(overrides)
    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=list(overrides))
    return to_app(cfg)
