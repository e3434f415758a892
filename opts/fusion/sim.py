"""fusion in the simulator: not modelled yet (issue 28: its kernel counts and bytes from the package's traffic
accounting); off is the simulator's own path, separate passes."""

from __future__ import annotations

from opts.base import ToggleConfig
from opts.sim_setting import SimSetting, not_modelled
from opts.vllm_setting import check_platform


def sim_setting(config: ToggleConfig, platform: str) -> SimSetting:
    """What `config` changes in the simulated engine on `platform`."""
    check_platform(platform)
    if config.mode == "off":
        return SimSetting()
    raise not_modelled("fusion", config.mode, ("off",))
