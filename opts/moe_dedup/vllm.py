"""How the moe_dedup toggle reaches vLLM, per platform.

vLLM 0.32 runs K3's latent-MoE tail in a runner with per-step tiers (README.md, "In vLLM"):
- ROCm (`amd/latent_moe_runner.py:ROCmLatentMoERunner`): the sharded tail whenever the layer is shardable (TP > 1,
  shared experts, no sequence parallelism, routed_scaling_factor 1): stock is on. off patches the tier
  (`_shard_up_proj_tail`) with the replicated tail; tiered adds NVIDIA's token-count choice.
- CUDA (`nvidia/latent_moe_runner.py:LatentMoERunner`): tier 0 (SM100, TP 8/16: one fused CuTeDSL collective and a
  sharded up-projection) for decode-sized steps, tier 1 (replicated up-projection, the shared all-reduce overlapped
  on a side stream) up to VLLM_SHARED_EXPERTS_STREAM_TOKEN_THRESHOLD (256) tokens, tier 2 (sharded) above: stock is
  tiered. off replaces tiers 0 and 2 with the replicated tail, on replaces tier 1 with the sharded one. sp is
  vLLM's sequence-parallel MoE (expert parallel, TP > 1, DP > 1, an all2all backend that splits tokens).
- CPU: vLLM-CPU sets VLLM_DISABLE_SHARED_EXPERTS_STREAM=1 (`platforms/cpu.py:419`), so the NVIDIA runner always
  takes tier 2: stock is on. off patches tier 2 with the replicated tail, tiered with the token-count choice.
At tensor-parallel size 1 no runner takes a tail tier (`_use_fused_path`): every mode runs the same code there.
"""

from __future__ import annotations

from opts.base import ToggleConfig
from opts.moe_dedup import in_vllm
from opts.moe_dedup.config import MoeDedupConfig
from opts.vllm_setting import K3_VLLM, Patch, VllmSetting, check_platform, not_wired

NAME = "moe_dedup"
STOCK_MODES = {"cpu": "on", "rocm": "on", "cuda": "tiered"}
VLLM_TIER_THRESHOLD = 256

NVIDIA_RUNNER = f"{K3_VLLM}.latent_moe_runner:LatentMoERunner"
ROCM_RUNNER = "vllm.models.kimi_k3.amd.latent_moe_runner:ROCmLatentMoERunner"
REPLICATED_COUNTER = "moe_dedup_replicated_tail"
SHARDED_COUNTER = "moe_dedup_sharded_tail"
TIERED_COUNTER = "moe_dedup_tiered_tail"

SP_CPU = ("vLLM's sequence-parallel MoE needs expert parallelism with data parallel size > 1 and an all2all "
          "backend (config/parallel.py:763-781, nvidia/model.py:883-888); one CPU engine here runs TP only")
SP_ROCM = ("vLLM's AMD K3 model never passes is_sequence_parallel to its MoE (amd/linear.py:322-343): "
           "sequence-parallel MoE exists only in nvidia/model.py")
NOT_WIRED = {("sp", "cpu"): SP_CPU, ("sp", "rocm"): SP_ROCM}
SP_ENGINE_ARGS = {"enable_expert_parallel": True, "all2all_backend": "allgather_reducescatter"}


def valid_modes(platform: str) -> tuple[str, ...]:
    """The modes vLLM runs on `platform`."""
    return tuple(m for m in MoeDedupConfig.MODES if (m, platform) not in NOT_WIRED)


def _why(mode: str) -> str:
    return f"moe_dedup={mode}: " + {
        "off": "every rank up-projects the full hidden size (naive.tail_off)",
        "on": "each rank up-projects only its hidden shard into the shared partial (sharded.tail_on)",
        "tiered": "replicated tail up to the token threshold, sharded above",
    }[mode]


# Every tail route: an engine without tensor parallelism (no `tensor_parallel_size` argument) never takes a tier.
SINGLE_RANK = (("!tensor_parallel_size", "at tensor-parallel size 1 no runner takes a tail tier (_use_fused_path): "
                                         "every mode runs the same code"),)


def _replicated(target: str, mode: str) -> Patch:
    return Patch(target, in_vllm.always(in_vllm.replicated_tail), _why(mode), REPLICATED_COUNTER,
                 idle_with=SINGLE_RANK)


def vllm_setting(config: ToggleConfig, platform: str) -> VllmSetting:
    """What `config` changes in vLLM on `platform`."""
    check_platform(platform)
    if not isinstance(config, MoeDedupConfig):
        raise ValueError(f"{NAME}: expected a MoeDedupConfig, got {type(config).__name__}")
    mode = config.mode
    if (mode, platform) in NOT_WIRED:
        raise not_wired(NAME, mode, platform, NOT_WIRED[mode, platform], valid_modes(platform))
    if platform == "cuda" and mode == "tiered" and config.tier_threshold != VLLM_TIER_THRESHOLD:
        return VllmSetting(env={"VLLM_SHARED_EXPERTS_STREAM_TOKEN_THRESHOLD": str(config.tier_threshold)})
    if mode == STOCK_MODES[platform]:
        return VllmSetting()
    if mode == "sp":
        return VllmSetting(engine_args=dict(SP_ENGINE_ARGS))
    if platform == "cuda":
        if mode == "off":
            return VllmSetting(patches=(_replicated(f"{NVIDIA_RUNNER}._shard_up_proj_tail", mode),
                                        _replicated(f"{NVIDIA_RUNNER}._small_batch_tail", mode)))
        return VllmSetting(patches=(Patch(f"{NVIDIA_RUNNER}._overlap_allreduce_tail",
                                          in_vllm.always(in_vllm.sharded_tail), _why(mode), SHARDED_COUNTER,
                                          idle_with=SINGLE_RANK),))
    target = f"{NVIDIA_RUNNER if platform == 'cpu' else ROCM_RUNNER}._shard_up_proj_tail"
    if mode == "off":
        return VllmSetting(patches=(_replicated(target, mode),))
    return VllmSetting(patches=(Patch(target, in_vllm.by_tokens(config.tier_threshold, in_vllm.replicated_tail),
                                      _why(mode), TIERED_COUNTER, idle_with=SINGLE_RANK),))
