"""Random calls of vLLM's K3 KDA kernels in vLLM's conventions, shared by the kda_overlap vLLM tests.

A mixed step as `KimiK3DeltaAttention._forward` runs it: `fused_recurrent_kda` on the verification rows, then
`chunk_kda_with_fused_gate` on the prefill rows from their gathered states, whose final states are written
back (vllm/models/kimi_k3/nvidia/kda.py:1136-1150, 1285-1318).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch

H, D = 3, 16
PREFIX = "model.layers.0.self_attn"
# verification rows of K+1 = 3 tokens: live (accepted 2), live with its last slot null, a null starting slot,
# an empty row, live (accepted 3); then three prefill rows from their own slots
VERIFY_CU = [0, 3, 6, 9, 9, 12]
VERIFY_SLOTS = [[1, 2, 4], [6, 8, 0], [0, 10, 11], [17, 18, 19], [20, 21, 22]]
ACCEPTED = [2, 1, 1, 3, 3]
PREFILL_SLOTS = [23, 24, 25]
NUM_SLOTS = 26


@dataclass
class MixedCase:
    """Keyword arguments of the two kernel calls (without state and out) and the state cache [slots, H, D, D]."""

    verify: dict[str, Any]
    prefill: dict[str, Any]
    prefill_slots: torch.Tensor
    cache: torch.Tensor

    def clone(self) -> MixedCase:
        return MixedCase(self.verify, self.prefill, self.prefill_slots, self.cache.clone())


def token_inputs(num_tokens: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """q, k, v, raw_g [1, T, H, D] and raw_beta [1, T, H], as the layer hands them to the kernels."""
    names = ("q", "k", "v", "raw_g")
    values = {name: torch.randn(1, num_tokens, H, D, generator=gen) for name in names}
    values["raw_beta"] = torch.randn(1, num_tokens, H, generator=gen)
    return values


def mixed_case(seed: int = 0, prefill_lens: tuple[int, ...] = (70, 1, 9), lower_bound: float | None = None
               ) -> MixedCase:
    gen = torch.Generator().manual_seed(seed)
    layer = {"A_log": torch.rand(H, generator=gen) * 2, "lower_bound": lower_bound}
    dt_bias = torch.randn(H * D, generator=gen) * 0.1
    cu = torch.tensor([0, *torch.tensor(prefill_lens).cumsum(0).tolist()], dtype=torch.int32)
    verify = {**token_inputs(VERIFY_CU[-1], gen), **layer, "dt_bias": dt_bias,
              "cu_seqlens": torch.tensor(VERIFY_CU, dtype=torch.int32),
              "ssm_state_indices": torch.tensor(VERIFY_SLOTS, dtype=torch.int32),
              "num_accepted_tokens": torch.tensor(ACCEPTED, dtype=torch.int32)}
    prefill = {**token_inputs(sum(prefill_lens), gen), **layer, "g_bias": dt_bias, "cu_seqlens": cu}
    cache = torch.randn(NUM_SLOTS, H, D, D, generator=gen) * 0.5
    return MixedCase(verify, prefill, torch.tensor(PREFILL_SLOTS[:len(prefill_lens)]), cache)


def serial_forward(case: MixedCase, ops: Any, spec_out: torch.Tensor | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's order, the kernels looked up in `ops` at call time as `_forward` imports them: the verification
    output, then the prefill output; `case.cache` is updated in place."""
    out_v, _ = ops.fused_recurrent_kda(**case.verify, initial_state=case.cache, out=spec_out)
    h0 = case.cache[case.prefill_slots].clone()
    out_p, final = ops.chunk_kda_with_fused_gate(**case.prefill, initial_state=h0, output_final_state=True,
                                                 use_qk_l2norm_in_kernel=True, out=None)
    case.cache[case.prefill_slots] = final.to(case.cache.dtype)
    return out_v, out_p


# ROCm's prefill kernel reads and writes the cache rows itself; sequence 1 starts from zeros; sequence 0 writes
# a checkpoint after its first 64 tokens into row 13 (rows 14 and 15 are named for sequences without one)
HAS_INITIAL = [True, False, True]
CHECKPOINT_OFFSETS = [64, 0, 0]
CHECKPOINT_ROWS = [13, 14, 15]


def serial_forward_rocm(case: MixedCase, ops: Any, spec_out: torch.Tensor | None = None
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """amd/kda.py's order (:496, :620), the kernels looked up in `ops` at call time: the verification output, then
    the prefill output; `case.cache` is updated in place, the checkpoint included."""
    n = len(case.prefill_slots)
    out_v, _ = ops.fused_recurrent_kda(**case.verify, initial_state=case.cache, uniform_sequence_length=None,
                                       out=spec_out)
    out_p, final = ops.chunk_kda_prefill(
        **case.prefill, use_qk_l2norm_in_kernel=True, out=None, checkpoint_state=case.cache,
        checkpoint_offsets=torch.tensor(CHECKPOINT_OFFSETS[:n], dtype=torch.int32),
        checkpoint_state_indices=torch.tensor(CHECKPOINT_ROWS[:n], dtype=torch.int32), state_cache=case.cache,
        state_indices=case.prefill_slots.to(torch.int32), has_initial_state=torch.tensor(HAS_INITIAL[:n]))
    assert final is None
    return out_v, out_p


def mixed_context(num_prefills: int, num_spec_decodes: int):
    from vllm.forward_context import override_forward_context

    metadata = SimpleNamespace(num_prefills=num_prefills, num_spec_decodes=num_spec_decodes)
    return override_forward_context(SimpleNamespace(attn_metadata={PREFIX: metadata}))


def on_stream(kernel, seen, name):
    """`kernel`, noting the stream it runs on."""
    def wrapped(**kwargs):
        seen.append((name, torch.cpu.current_stream()))
        return kernel(**kwargs)
    return wrapped
