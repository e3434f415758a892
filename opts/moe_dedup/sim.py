"""moe_dedup in the simulator: on, each tensor-parallel rank up-projects the latent MoE's output into only its
1/tp of the hidden size (its rows of W_up, all it holds), so the up-projection's FLOPs and weight bytes per rank
fall by tp and the weights free that much memory for the cache; the same two all-reduces (README.md). Off is the
replicated tail. tiered runs on's tail in a pass of more than `tier_threshold` tokens and off's in the others
(each MoE pass by its own tokens: a step's, an MTP draft pass's), holding off's weights. sp splits the MoE
layer's tokens over the ranks (`sequence.py`): router, latent projections and the whole shared MLP on a rank's
1/tp of them, its 1/tp of the experts on all, the latents all-gathered and reduce-scattered and the outputs
all-gathered instead of the two all-reduces; every rank holds the whole shared MLP and W_up."""

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
        return SimSetting(sharded_latent_up=True)
    if config.mode == "tiered":
        return SimSetting(latent_up_tier=config.tier_threshold)
    if config.mode == "sp":
        return SimSetting(sequence_parallel_moe=True)
    raise not_modelled("moe_dedup", config.mode, ("off", "on", "tiered", "sp"))
