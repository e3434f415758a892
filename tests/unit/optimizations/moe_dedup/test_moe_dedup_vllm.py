"""moe_dedup's vLLM setting: the cells as data per platform, the patch targets and the runner attributes the
replacements use in the installed vLLM 0.32, and the tier wrappers. The tails themselves run in vLLM at TP 2 in
tests/e2e/test_vllm_toggle_moe_dedup.py."""

from __future__ import annotations

import contextlib
import importlib
import inspect

import pytest
import torch

from opts.moe_dedup import MoeDedupConfig, in_vllm
from opts.moe_dedup import vllm as setting
from opts.vllm_setting import PLATFORMS

TAIL_PARAMS = ["self", "fused_output", "shared_output", "trunc_size"]


def cell(mode: str, platform: str, **fields):
    return setting.vllm_setting(MoeDedupConfig(mode=mode, **fields), platform)


def targets(found) -> dict[str, str | None]:
    return {p.target: p.counter for p in found.patches}


@pytest.mark.parametrize("platform", PLATFORMS)
def test_the_stock_mode_is_stock_vllm(platform):
    assert cell(setting.STOCK_MODES[platform], platform).is_stock


def test_cpu_and_rocm_off_patch_the_sharded_tier_with_the_replicated_tail():
    assert targets(cell("off", "cpu")) == {f"{setting.NVIDIA_RUNNER}._shard_up_proj_tail": setting.REPLICATED_COUNTER}
    assert targets(cell("off", "rocm")) == {f"{setting.ROCM_RUNNER}._shard_up_proj_tail": setting.REPLICATED_COUNTER}


def test_cuda_off_replaces_the_sharded_tiers_and_on_the_replicated_one():
    assert targets(cell("off", "cuda")) == {f"{setting.NVIDIA_RUNNER}._shard_up_proj_tail": setting.REPLICATED_COUNTER,
                                            f"{setting.NVIDIA_RUNNER}._small_batch_tail": setting.REPLICATED_COUNTER}
    assert targets(cell("on", "cuda")) == {f"{setting.NVIDIA_RUNNER}._overlap_allreduce_tail":
                                           setting.SHARDED_COUNTER}


def test_tiered_on_cpu_and_rocm_is_a_patch_and_on_cuda_its_threshold():
    for platform, runner in (("cpu", setting.NVIDIA_RUNNER), ("rocm", setting.ROCM_RUNNER)):
        assert targets(cell("tiered", platform)) == {f"{runner}._shard_up_proj_tail": setting.TIERED_COUNTER}
    assert cell("tiered", "cuda", tier_threshold=64).env == {"VLLM_SHARED_EXPERTS_STREAM_TOKEN_THRESHOLD": "64"}
    assert cell("tiered", "cuda", tier_threshold=setting.VLLM_TIER_THRESHOLD).is_stock


def test_sp_is_engine_args_on_cuda_and_not_wired_elsewhere_with_the_reason():
    assert cell("sp", "cuda").engine_args == setting.SP_ENGINE_ARGS
    with pytest.raises(ValueError, match=r"moe_dedup=sp on cpu: .*data parallel size > 1.*valid there: off, on, "
                                         r"tiered"):
        cell("sp", "cpu")
    with pytest.raises(ValueError, match=r"moe_dedup=sp on rocm: .*nvidia/model.py"):
        cell("sp", "rocm")


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="platform: invalid value 'tpu'"):
        cell("off", "tpu")
    with pytest.raises(ValueError, match=r"MoeDedupConfig\.tier_threshold: invalid value -1"):
        MoeDedupConfig(mode="tiered", tier_threshold=-1)
    with pytest.raises(ValueError, match="mode"):
        MoeDedupConfig(mode="dedup")


@pytest.fixture(scope="module")
def vllm_runners():
    from ablations.backends.vllm.launch.runtime import hide_media_wheels

    with contextlib.suppress(RuntimeError):
        hide_media_wheels()
    pytest.importorskip("vllm")
    found = {}
    for target in (setting.NVIDIA_RUNNER, setting.ROCM_RUNNER):
        module, _, name = target.partition(":")
        found[target] = getattr(importlib.import_module(module), name)
    return found


def test_every_patched_tier_exists_with_the_tail_signature(vllm_runners):
    for platform in PLATFORMS:
        for mode in setting.valid_modes(platform):
            for patch in cell(mode, platform).patches:
                runner, _, method = patch.target.rpartition(".")
                params = list(inspect.signature(getattr(vllm_runners[runner], method)).parameters)
                assert params == TAIL_PARAMS, patch.target


def test_the_runner_parts_the_replacements_read_are_vllms(vllm_runners):
    for runner in vllm_runners.values():
        assert callable(runner._maybe_reduce_final_output)
        source = inspect.getsource(runner._shard_up_proj_tail)
        assert "transform.up_proj.weight" in source and "transform.norm" in source
    rocm = inspect.getsource(vllm_runners[setting.ROCM_RUNNER].__init__)
    assert 'getattr(transform, "row_sharded", False)' in rocm   # the rows in_vllm.full_up_weight gathers


def test_always_and_by_tokens_pick_the_tail_by_token_count():
    calls = []

    def small(runner, fused, shared, trunc):
        calls.append(("small", fused.shape[0]))
        return "small"

    def base(runner, fused, shared, trunc):
        calls.append(("base", fused.shape[0]))
        return "base"

    tiered = in_vllm.by_tokens(4, small)(base)
    replaced = in_vllm.always(small)(base)
    assert [tiered(None, torch.zeros(t, 2), None, None) for t in (1, 4, 5)] == ["small", "small", "base"]
    assert replaced(None, torch.zeros(9, 2), None, None) == "small"
    assert calls == [("small", 1), ("small", 4), ("base", 5), ("small", 9)]


def test_a_replicated_up_projection_is_used_as_it_is():
    weight = torch.randn(8, 4)

    class Transform:
        up_proj = torch.nn.Linear(4, 8, bias=False)
        norm = None
        row_sharded = False

    class Runner:
        routed_output_transform = Transform()

    Transform.up_proj.weight.data = weight
    assert in_vllm.full_up_weight(Runner()) is Transform.up_proj.weight
