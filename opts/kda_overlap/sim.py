"""kda_overlap in the simulator: on, a step that prefills and verifies runs its KDA verification rows inside the
prefill's chunked pass (one pass: the chunked kernel's FLOPs for those rows and one set of launches) instead of a
recurrent pass and then a chunked one (off). Without speculation there are no verification rows: nothing
changes. The two-stream variant is not modelled yet."""

from __future__ import annotations

from opts.base import ToggleConfig
from opts.sim_setting import SimSetting, not_modelled
from opts.vllm_setting import check_platform


def sim_setting(config: ToggleConfig, platform: str) -> SimSetting:
    """What `config` changes in the simulated engine on `platform`."""
    check_platform(platform)
    if config.mode == "off":
        return SimSetting()
    if config.mode == "on":
        return SimSetting(packed_kda=True)
    raise not_modelled("kda_overlap", config.mode, ("off", "on"))
