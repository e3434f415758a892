"""How the kda_overlap toggle reaches vLLM.

off is stock vLLM on every platform: `KimiK3DeltaAttention._forward` runs the verification rows
(`fused_recurrent_kda`), then the prefill rows (`chunk_kda_with_fused_gate`). On vLLM-CPU those two kernels are
the backend's CPU fix S4, which runs this package's off code (`vllm_kernels`, over `naive.step_off`).

on (CPU, CUDA): four patches on top of whatever the targets hold (on the CPU, the CPU fix) in the model vLLM
runs there, `nvidia/kda.py`: `_forward` marks a step that mixes prefill and verification rows,
`fused_recurrent_kda` defers its call there, `chunk_kda_with_fused_gate` runs the packed pass instead
(`forward.packed_step`, counted as `kda_overlap_packed_step`): `packed.py` in PyTorch on the CPU, the
Triton kernel `triton_packed.py` on CUDA (`step.step_on` picks by the tensors' device). Not executed on a GPU.

streams (CUDA): the same marking and deferral; `chunk_kda_with_fused_gate` then runs the deferred verification
with vLLM's own `fused_recurrent_kda` on a side stream beside its own prefill kernel, joined before the output
is read (`forward.streamed_step`, counted as `kda_overlap_streamed_step`). Not executed on a GPU here; the
split and join run in order on the CPU's streams in the tests.

ROCm runs another model file, `amd/kda.py`, whose prefill kernel is its own: `NOT_WIRED` says why.
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
PACKED_COUNTER = "kda_overlap_packed_step"
STREAMED_TARGET = f"{forward.__name__}:streamed_step"
STREAMED_COUNTER = "kda_overlap_streamed_step"

ROCM = ("vLLM's ROCm K3 model (amd/kda.py) runs its own prefill kernel, chunk_kda_prefill (amd/kda.py:620, "
        "amd/ops/kda_prefill.py:27), which also writes the prefix cache's state checkpoints and picks the fused "
        "chunk kernel; the packed pass's wrappers take nvidia/kda.py's chunk_kda_with_fused_gate only, and a "
        "patch of those targets would never run on ROCm")
NOT_WIRED = {
    ("streams", "cpu"): "streams needs CUDA/ROCm streams; a CPU has none",
    ("on", "rocm"): ROCM,
    ("streams", "rocm"): ROCM,
}


def valid_modes(platform: str) -> tuple[str, ...]:
    """The modes vLLM runs on `platform`."""
    return tuple(m for m in KdaOverlapConfig.MODES if (m, platform) not in NOT_WIRED)


def _mixed_step_patches(chunk_size: int, why: str, prefill: Patch, counted: Patch) -> tuple[Patch, ...]:
    """The mixed step marked in `_forward` and its verification call deferred, then `prefill` (what the prefill
    kernel's call runs instead) and `counted` (the counted function it calls)."""
    return (
        Patch(FORWARD_TARGET, lambda base: forward.overlap_forward(base, chunk_size),
              f"{why} (marks the mixed steps)"),
        Patch(VERIFY_TARGET, forward.defer_verify, f"{why} (defers the verification call)"),
        prefill,
        counted,
    )


def on_patches(chunk_size: int) -> tuple[Patch, ...]:
    """The patches of kda_overlap=on, `chunk_size` tokens per chunk of the packed pass (PyTorch's, on the CPU;
    the Triton kernel's chunk is its own `triton_packed.BT`)."""
    why = "kda_overlap=on: prefill and verification rows of a mixed step in one packed chunked pass"
    return _mixed_step_patches(
        chunk_size, why, Patch(PREFILL_TARGET, forward.packed_prefill, f"{why} (runs the packed pass)"),
        Patch(PACKED_TARGET, lambda packed_step: packed_step, f"{why} (counts the packed pass)", PACKED_COUNTER))


def streams_patches(chunk_size: int) -> tuple[Patch, ...]:
    """The patches of kda_overlap=streams (CUDA): the verification rows of a mixed step on a side stream,
    beside the prefill rows, with vLLM's own kernels (`chunk_size` only marks the step's call)."""
    why = "kda_overlap=streams: the verification rows of a mixed step on a side stream beside the prefill rows"
    return _mixed_step_patches(
        chunk_size, why, Patch(PREFILL_TARGET, forward.streamed_prefill, f"{why} (runs both, split and joined)"),
        Patch(STREAMED_TARGET, lambda streamed_step: streamed_step, f"{why} (counts the two-stream steps)",
              STREAMED_COUNTER))


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
        return VllmSetting(patches=streams_patches(config.chunk_size))
    return VllmSetting(patches=on_patches(config.chunk_size))

