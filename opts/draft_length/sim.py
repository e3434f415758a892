"""draft_length in the simulator: off verifies its fixed K drafts every step, k0 none, on the K its chooser picks
for each batch size, weighing the simulated node's own step seconds c(b, K) (as a user would measure them on
theirs) or its explicit schedule; the accepted drafts are drawn at the setting's acceptance rates
(`acceptance.config_alphas`), each step accepting at most its K."""

from __future__ import annotations

from dataclasses import dataclass

from opts.draft_length.acceptance import config_alphas
from opts.draft_length.chooser import choose_schedule
from opts.draft_length.config import DraftLengthConfig
from opts.draft_length.schedule import Schedule, merge_schedule
from opts.sim_setting import SimSetting, not_modelled
from opts.vllm_setting import check_platform


@dataclass(frozen=True)
class Chooser:
    """draft_length on's schedule on a step cost `cost` (anything with `seconds(batch, k)`): the chooser's best K
    per batch-size bucket among 0..max_k at the acceptance rates `alphas`, or the config's explicit `schedule`."""

    alphas: tuple[float, ...]
    max_k: int
    schedule: Schedule = ()

    def __call__(self, cost) -> Schedule:
        if self.schedule:
            return merge_schedule(self.schedule)
        return choose_schedule(cost, self.alphas, max_k=self.max_k)


def sim_setting(config: DraftLengthConfig, platform: str) -> SimSetting:
    """What `config` changes in the simulated engine on `platform`."""
    check_platform(platform)
    if config.mode == "k0":
        return SimSetting(num_drafts=0)
    if config.mode == "off":
        return SimSetting(num_drafts=config.k, alphas=config_alphas(config, config.k))
    if config.mode == "on":
        alphas = config_alphas(config, config.max_k)
        return SimSetting(num_drafts=config.max_k, alphas=alphas,
                          draft_schedule=Chooser(alphas, config.max_k, config.schedule))
    raise not_modelled("draft_length", config.mode, ("off", "on", "k0"))
