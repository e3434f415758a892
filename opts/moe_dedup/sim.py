"""moe_dedup in the simulator: not modelled yet (issue 28: the latent tail's up-projection per rank); off is the
simulator's own path, every rank up-projecting the replicated latent."""

from __future__ import annotations

from opts.base import ToggleConfig
from opts.sim_setting import SimSetting, not_modelled
from opts.vllm_setting import check_platform


def sim_setting(config: ToggleConfig, platform: str) -> SimSetting:
    """What `config` changes in the simulated engine on `platform`."""
    check_platform(platform)
    if config.mode == "off":
        return SimSetting()
    raise not_modelled("moe_dedup", config.mode, ("off",))
