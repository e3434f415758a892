"""The Hydra app's typed root schema and the ConfigStore registration of every group's schema."""

from __future__ import annotations

from dataclasses import dataclass, field

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from ablations.backends.vllm.config import ModelConfig
from ablations.backends.vllm.config import register_configs as register_model
from ablations.workload.config import WorkloadConfig
from ablations.workload.config import register_configs as register_workload

ROOT_SCHEMA = "app_schema"


@dataclass
class AppConfig:
    """Root of `conf/config.yaml`. Each group's node is typed by its own schema."""

    workload: WorkloadConfig = MISSING
    model: ModelConfig = MISSING
    save_trace: bool = False
    result_file: str = "result.json"
    tags: list[str] = field(default_factory=list)


def register_configs() -> None:
    """Register the root schema and every group schema; idempotent."""
    cs = ConfigStore.instance()
    cs.store(name=ROOT_SCHEMA, node=AppConfig)
    register_workload(cs)
    register_model(cs)
