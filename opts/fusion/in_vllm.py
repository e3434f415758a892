"""fusion's code inside vLLM's processes: what `vllm.py`'s patches install. On the CPU, `KimiK3DeltaAttention._forward`
routed so that a plain decode step runs off's or on's passes (`naive.py` / `passes.py`); on ROCm, the q/kv norms
always fused or always the two RMSNorm layers, and the fused KDA decode answered unsupported."""

from __future__ import annotations

from typing import Any

from opts.fusion import naive, passes


def plain_decode(layer: Any) -> Any:
    """The layer's KDA metadata when this step is a plain decode (vLLM's fused-decode condition, nvidia/kda.py:
    984-991: decodes only, no prefill, no speculative rows), else None."""
    from vllm.forward_context import get_forward_context

    metadata = get_forward_context().attn_metadata
    m = metadata.get(layer.prefix) if isinstance(metadata, dict) else None
    if m is None or m.num_spec_decodes > 0 or m.num_prefills > 0 or m.num_decodes == 0:
        return None
    return m


def decode_step_args(layer: Any, m: Any, mixed_qkv, g1, g2, beta, core_attn_out) -> tuple:
    """The arguments of `passes.kda_decode_slots_fused` / `naive.kda_decode_slots_unfused` for a plain decode
    step of `layer` (vLLM's KimiK3DeltaAttention), from those of its `_forward`; rows past the step's tokens
    are left out, as vLLM's fused kernels leave them."""
    from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first

    n = m.num_actual_tokens
    conv_state, recurrent_state = layer.kv_cache[:2]
    if not is_conv_state_dim_first():
        conv_state = conv_state.transpose(-1, -2)
    weight = layer.conv1d.weight.data
    gate = g2[:n]
    if n == 1:
        # forward()'s rearrange recomputes a one-row view's row stride; give it the projection's, as every other
        # step has, so that its two-row form meets the same compiled graph (dynamic.as_two_rows)
        gate = gate.as_strided(gate.shape, (mixed_qkv.stride(0), *gate.stride()[1:]))
    return (mixed_qkv[:n], conv_state, weight.view(weight.size(0), weight.size(2)), g1[0, :n], beta[0, :n],
            layer.A_log.data, layer.dt_bias.data, recurrent_state, m.non_spec_state_indices_tensor[:n], gate,
            layer.o_norm.weight.data, core_attn_out[0, :n], layer.gate_lower_bound, layer.head_dim ** -0.5,
            layer.o_norm.eps)


def route_plain_decode(base: Any, fused: bool) -> Any:
    """Wrap `KimiK3DeltaAttention._forward`: a plain decode step runs the fused pass (`fused`) or off's separate
    passes, every other step `base`."""

    def _forward(self, mixed_qkv, g1, g2, beta, core_attn_out) -> None:
        m = plain_decode(self)
        # as vLLM's own fused decode: no speculative config (its conv state is wider), no conv bias (K3 has none)
        if m is None or self.num_spec or self.conv1d.bias is not None:
            return base(self, mixed_qkv=mixed_qkv, g1=g1, g2=g2, beta=beta, core_attn_out=core_attn_out)
        # looked up per call: the counting patches replace these module attributes
        decode = passes.kda_decode_slots_fused if fused else naive.kda_decode_slots_unfused
        decode(*decode_step_args(self, m, mixed_qkv, g1, g2, beta, core_attn_out))
        return None

    _forward.__wrapped__ = base  # type: ignore[attr-defined]
    return _forward


def rocm_normalize_q_kv(fused: bool) -> Any:
    """`KimiK3MultiHeadLatentAttentionWrapper._normalize_q_kv` (amd/mla.py:72-90) that always runs the fused dual
    RMSNorm (`fused`) or always the two RMSNorm layers."""

    def _normalize_q_kv(self, q_c, kv_c):
        q_norm, kv_norm = self.q_a_layernorm, self.kv_a_layernorm
        if not fused:
            return q_norm(q_c), kv_norm(kv_c)
        import torch

        return torch.ops.vllm.fused_mla_dual_rms_norm(q_c, q_norm.weight, kv_c, kv_norm.weight,
                                                      q_norm.variance_epsilon, kv_norm.variance_epsilon)

    return _normalize_q_kv


def unsupported(*_args: Any, **_kwargs: Any) -> bool:
    return False
