"""draft_length in the simulator: off verifies its fixed K drafts every step, k0 none; the accepted drafts are
drawn at the setting's acceptance rates (`acceptance.config_alphas`). On (the chooser's K per batch size) is not
modelled yet."""

from __future__ import annotations

from opts.draft_length.acceptance import config_alphas
from opts.draft_length.config import DraftLengthConfig
from opts.sim_setting import SimSetting, not_modelled
from opts.vllm_setting import check_platform


def sim_setting(config: DraftLengthConfig, platform: str) -> SimSetting:
    """What `config` changes in the simulated engine on `platform`."""
    check_platform(platform)
    if config.mode == "k0":
        return SimSetting(num_drafts=0)
    if config.mode == "off":
        return SimSetting(num_drafts=config.k, alphas=config_alphas(config, config.k))
    raise not_modelled("draft_length", config.mode, ("off", "k0"))
