"""How the kda_overlap toggle reaches vLLM.

off is stock vLLM on every platform: `KimiK3DeltaAttention._forward` runs the verification rows
(`fused_recurrent_kda`), then the prefill rows (`chunk_kda_with_fused_gate`). On vLLM-CPU those two kernels are
the backend's CPU fix S4, which runs this package's off code (`vllm_kernels`, over `naive.step_off`).

on (CPU, CUDA): four patches on top of whatever the targets hold (on the CPU, the CPU fix) in the model vLLM
runs there, `nvidia/kda.py`: `_forward` marks a step that mixes prefill and verification rows,
`fused_recurrent_kda` defers its call there, `chunk_kda_with_fused_gate` runs the packed pass instead
(`forward.packed_step`, counted as `kda_overlap_packed_step`): `packed.py` in PyTorch on the CPU, the
Triton kernel `triton_packed.py` on CUDA (`step.step_on` picks by the tensors' device). Not executed on a GPU.

streams (CUDA, ROCm): the same marking and deferral; the prefill kernel's call then runs the deferred
verification with vLLM's own `fused_recurrent_kda` on a side stream beside its own prefill kernel, joined before
the output is read (`forward.streamed_step`, counted as `kda_overlap_streamed_step`). On ROCm the targets are
`amd/kda.py`'s (`_forward` :352, `fused_recurrent_kda` :496, `chunk_kda_prefill` :620, imported into that module),
wrapped in their own signatures (`forward.defer_verify_rocm`, `forward.streamed_prefill_rocm`). Not executed on
a GPU here; the split and join run in order on the CPU's streams in the tests.

on (ROCm): the same four patches on amd/kda.py's targets; its prefill kernel's call runs `packed_step_rocm`: the
starting states read from the paged cache (`state_cache`, zeros where `has_initial_state` is false), the packed
pass (the Triton kernel on the GPU), the final states written back and the prefix cache's checkpoints
(`checkpoint_offsets`, multiples of 64) written from the same pass, as `chunk_kda_prefill` writes them. Not
executed on a GPU here; on the CPU it is tested against off in this form (`in_vllm/kernels.chunk_kda_prefill`).
"""

from __future__ import annotations

from opts.base import ToggleConfig
from opts.kda_overlap.config import KdaOverlapConfig
from opts.kda_overlap.in_vllm import forward
from opts.vllm_setting import KDA_FORWARD, KDA_OPS, Patch, VllmSetting, check_platform, not_wired

NAME = "kda_overlap"
STOCK_MODES = {"cpu": "off", "rocm": "off", "cuda": "off"}

FORWARD_TARGET = KDA_FORWARD
VERIFY_TARGET = f"{KDA_OPS}:fused_recurrent_kda"
PREFILL_TARGET = f"{KDA_OPS}:chunk_kda_with_fused_gate"
PACKED_TARGET = f"{forward.__name__}:packed_step"
PACKED_ROCM_TARGET = f"{forward.__name__}:packed_step_rocm"
PACKED_COUNTER = "kda_overlap_packed_step"
STREAMED_TARGET = f"{forward.__name__}:streamed_step"
STREAMED_COUNTER = "kda_overlap_streamed_step"

ROCM_KDA = "vllm.models.kimi_k3.amd.kda"
ROCM_FORWARD_TARGET = f"{ROCM_KDA}:KimiK3DeltaAttention._forward"
ROCM_VERIFY_TARGET = f"{ROCM_KDA}:fused_recurrent_kda"
ROCM_PREFILL_TARGET = f"{ROCM_KDA}:chunk_kda_prefill"

NOT_WIRED = {
    ("streams", "cpu"): "streams needs CUDA/ROCm streams; a CPU has none",
}


def valid_modes(platform: str) -> tuple[str, ...]:
    """The modes vLLM runs on `platform`."""
    return tuple(m for m in KdaOverlapConfig.MODES if (m, platform) not in NOT_WIRED)


def _mixed_step_patches(chunk_size: int, why: str, prefill: Patch, counted: Patch,
                        rocm: bool = False) -> tuple[Patch, ...]:
    """The mixed step marked in `_forward` and its verification call deferred (`rocm`: in amd/kda.py), then
    `prefill` (what the prefill kernel's call runs instead) and `counted` (the counted function it calls)."""
    return (
        Patch(ROCM_FORWARD_TARGET if rocm else FORWARD_TARGET,
              lambda base: forward.overlap_forward(base, chunk_size, rocm), f"{why} (marks the mixed steps)"),
        Patch(ROCM_VERIFY_TARGET if rocm else VERIFY_TARGET,
              forward.defer_verify_rocm if rocm else forward.defer_verify, f"{why} (defers the verification call)"),
        prefill,
        counted,
    )


def on_patches(chunk_size: int, rocm: bool = False) -> tuple[Patch, ...]:
    """The patches of kda_overlap=on (`rocm`: amd/kda.py's targets), `chunk_size` tokens per chunk of the packed
    pass (PyTorch's, on the CPU; the Triton kernel's chunk is its own `triton_packed.BT`)."""
    why = "kda_overlap=on: prefill and verification rows of a mixed step in one packed chunked pass"
    if rocm:
        prefill = Patch(ROCM_PREFILL_TARGET, forward.packed_prefill_rocm, f"{why} (runs the packed pass)")
        counted = Patch(PACKED_ROCM_TARGET, lambda step: step, f"{why} (counts the packed pass)", PACKED_COUNTER)
    else:
        prefill = Patch(PREFILL_TARGET, forward.packed_prefill, f"{why} (runs the packed pass)")
        counted = Patch(PACKED_TARGET, lambda step: step, f"{why} (counts the packed pass)", PACKED_COUNTER)
    return _mixed_step_patches(chunk_size, why, prefill, counted, rocm)


def streams_patches(chunk_size: int, rocm: bool = False) -> tuple[Patch, ...]:
    """The patches of kda_overlap=streams (CUDA; `rocm`: amd/kda.py's targets): the verification rows of a mixed
    step on a side stream, beside the prefill rows, with vLLM's own kernels (`chunk_size` only marks the step's
    call)."""
    why = "kda_overlap=streams: the verification rows of a mixed step on a side stream beside the prefill rows"
    prefill = (Patch(ROCM_PREFILL_TARGET, forward.streamed_prefill_rocm, f"{why} (runs both, split and joined)")
               if rocm else Patch(PREFILL_TARGET, forward.streamed_prefill, f"{why} (runs both, split and joined)"))
    return _mixed_step_patches(
        chunk_size, why, prefill,
        Patch(STREAMED_TARGET, lambda streamed_step: streamed_step, f"{why} (counts the two-stream steps)",
              STREAMED_COUNTER), rocm)


def vllm_setting(config: ToggleConfig, platform: str) -> VllmSetting:
    """What `config` changes in vLLM on `platform`."""
    check_platform(platform)
    if not isinstance(config, KdaOverlapConfig):
        raise ValueError(f"{NAME}: expected a KdaOverlapConfig, got {type(config).__name__}")
    if config.mode == STOCK_MODES[platform]:
        return VllmSetting()
    if (config.mode, platform) in NOT_WIRED:
        raise not_wired(NAME, config.mode, platform, NOT_WIRED[config.mode, platform], valid_modes(platform))
    if config.mode == "streams":
        return VllmSetting(patches=streams_patches(config.chunk_size, rocm=platform == "rocm"))
    return VllmSetting(patches=on_patches(config.chunk_size, rocm=platform == "rocm"))

