"""How the draft_length toggle reaches vLLM: the K keys of the engine's `speculative_config` (every platform).

k0 is stock vLLM (no `speculative_config`: no speculation). off: K3's MTP head with a fixed
`num_speculative_tokens` = k. on: `num_speculative_tokens_per_batch_size` = the chooser's [[lo, hi, K], ...]
with `num_speculative_tokens` = its largest K (vLLM caps every bucket at it, `v1/spec_decode/dynamic/utils.py`).
vLLM drops the per-batch-size K when data_parallel_size > 1 (`config/vllm.py:1060-1075`): on would run as off
at the largest K, so the backend's EngineConfig refuses an on cell there. With sampling "synthetic" drafts are
accepted at the profile's rates (vLLM's synthetic rejection sampling takes cumulative per-position rates), so
throughput cells compare alike; "standard" is real sampling.
"""

from __future__ import annotations

from typing import Any

from opts.base import ToggleConfig
from opts.draft_length.acceptance import config_alphas, to_cumulative
from opts.draft_length.chooser import policy
from opts.draft_length.config import DraftLengthConfig
from opts.vllm_setting import VllmSetting, check_platform

NAME = "draft_length"
STOCK_MODES = {"cpu": "k0", "rocm": "k0", "cuda": "k0"}
METHOD = "mtp"


def speculative_config(config: DraftLengthConfig) -> dict[str, Any] | None:
    """vLLM's `speculative_config` for `config` (None: no speculation)."""
    schedule = policy(config)
    max_k = max(k for _, _, k in schedule)
    if max_k == 0:
        return None
    spec: dict[str, Any] = {"method": METHOD, "num_speculative_tokens": max_k}
    if config.mode == "on":
        spec["num_speculative_tokens_per_batch_size"] = [list(entry) for entry in schedule]
    if config.sampling == "synthetic":
        spec["rejection_sample_method"] = "synthetic"
        spec["synthetic_acceptance_rates"] = [float(r) for r in to_cumulative(config_alphas(config, max_k))]
    return spec


def vllm_setting(config: ToggleConfig, platform: str) -> VllmSetting:
    """What `config` changes in vLLM on `platform`."""
    check_platform(platform)
    if not isinstance(config, DraftLengthConfig):
        raise ValueError(f"{NAME}: expected a DraftLengthConfig, got {type(config).__name__}")
    spec = speculative_config(config)
    return VllmSetting() if spec is None else VllmSetting(engine_args={"speculative_config": spec})
