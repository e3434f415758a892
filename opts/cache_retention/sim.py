"""cache_retention in the simulator: the engine admits requests through the same pool model (`pool.py`) its
replays use, with this setting's free-block order and resume point, so every mode acts as in those replays."""

from __future__ import annotations

from functools import partial

from opts.cache_retention.config import CacheRetentionConfig
from opts.cache_retention.retention import free_list_for, resume_for
from opts.sim_setting import SimSetting
from opts.vllm_setting import check_platform


def sim_setting(config: CacheRetentionConfig, platform: str) -> SimSetting:
    """What `config` changes in the simulated engine (off: vLLM's LRU free order, no resume: the default)."""
    check_platform(platform)
    if config.mode == "off":
        return SimSetting()
    return SimSetting(free_list=partial(free_list_for, config), resume=resume_for(config))
