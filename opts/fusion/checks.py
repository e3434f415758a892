"""Input checks shared by the off and on paths; every error names the argument, its shape and the expected one."""

from __future__ import annotations

import torch

from opts.fusion.inputs import AttnResLayer, AttnResStep


def _expect(name: str, x: torch.Tensor, shape: tuple[int, ...], what: str) -> None:
    if tuple(x.shape) != shape:
        raise ValueError(f"{name}: expected shape {shape} ({what}), got {tuple(x.shape)}")


def check_attn_res(layer: AttnResLayer, step: AttnResStep, out: torch.Tensor | None = None) -> None:
    if step.prefix.dim() != 2:
        raise ValueError(f"prefix: expected [tokens, hidden], got {tuple(step.prefix.shape)}")
    t, hidden = step.prefix.shape
    if step.blocks.dim() != 3 or step.blocks.shape[0] != t or step.blocks.shape[2] != hidden:
        raise ValueError(f"blocks: expected [{t}, max_blocks, {hidden}], got {tuple(step.blocks.shape)}")
    max_blocks = step.blocks.shape[1]
    if not 0 <= step.num_blocks <= max_blocks:
        raise ValueError(f"num_blocks: invalid value {step.num_blocks}; valid: 0..{max_blocks} (blocks holds "
                         f"{max_blocks})")
    if step.block_write_idx >= 0 and step.block_write_idx < step.num_blocks:
        raise ValueError(f"block_write_idx: invalid value {step.block_write_idx}; it must not overwrite a mixed "
                         f"block (valid: -1 or {step.num_blocks}..{max_blocks - 1})")
    if step.block_write_idx >= max_blocks:
        raise ValueError(f"block_write_idx: invalid value {step.block_write_idx}; valid: -1 or "
                         f"{step.num_blocks}..{max_blocks - 1}")
    if step.delta is not None:
        _expect("delta", step.delta, (t, hidden), "tokens, hidden")
    for name, w in (("res_norm_weight", layer.res_norm_weight), ("res_proj_weight", layer.res_proj_weight),
                    ("out_norm_weight", layer.out_norm_weight)):
        _expect(name, w, (hidden,), "hidden")
    if out is not None:
        _expect("out", out, (t, hidden), "tokens, hidden")
    for name, x in (("prefix", step.prefix), ("blocks", step.blocks)):
        if not x.is_contiguous():
            raise ValueError(f"{name}: must be contiguous (updated in place), got strides {tuple(x.stride())}")


def check_q_kv_norm(qr: torch.Tensor, kv: torch.Tensor, q_weight: torch.Tensor, kv_weight: torch.Tensor) -> None:
    """vLLM's `fused_q_kv_rmsnorm` arguments: the q and kv latents [N, q_lora] and [N, kv_lora], their weights."""
    if qr.dim() != 2 or kv.dim() != 2 or qr.shape[0] != kv.shape[0]:
        raise ValueError(f"qr, kv: expected [tokens, q_lora] and [tokens, kv_lora], got {tuple(qr.shape)} and "
                         f"{tuple(kv.shape)}")
    _expect("q_weight", q_weight, (qr.shape[1],), "q_lora")
    _expect("kv_weight", kv_weight, (kv.shape[1],), "kv_lora")


def check_kda_decode_slots(x, conv_pool, conv_weight, raw_g, raw_beta, A_log, dt_bias, state_pool, slots, gate,
                           norm_weight, out, *_) -> None:
    """The arguments of one engine decode step over vLLM's slot pools (`passes.kda_decode_slots_fused`,
    `naive.kda_decode_slots_unfused`); every error names the argument."""
    n = x.shape[0]
    heads, dim = raw_g.shape[1:] if raw_g.dim() == 3 else (None, None)
    if heads is None or x.dim() != 2 or x.shape[1] != 3 * heads * dim:
        raise ValueError(f"x, raw_g: expected [tokens, 3*H*D] and [tokens, H, D], got {tuple(x.shape)} and "
                         f"{tuple(raw_g.shape)}")
    width = conv_weight.shape[-1]
    _expect("conv_weight", conv_weight, (3 * heads * dim, width), "channels, conv width")
    _expect("conv_pool", conv_pool, (conv_pool.shape[0], 3 * heads * dim, width - 1), "slots, channels, width - 1")
    _expect("state_pool", state_pool, (state_pool.shape[0], heads, dim, dim), "slots, heads, dv, dk")
    _expect("raw_g", raw_g, (n, heads, dim), "tokens, heads, head_dim")
    _expect("raw_beta", raw_beta, (n, heads), "tokens, heads")
    _expect("slots", slots, (n,), "tokens")
    _expect("gate", gate, (n, heads, dim), "tokens, heads, head_dim")
    _expect("out", out, (n, heads, dim), "tokens, heads, head_dim")
    _expect("A_log", A_log, (heads,), "heads")
    _expect("dt_bias", dt_bias, (heads * dim,), "heads * head_dim")
    _expect("norm_weight", norm_weight, (dim,), "head_dim")
    if slots.dtype.is_floating_point:
        raise ValueError(f"slots: expected an integer tensor, got {slots.dtype}")
    if state_pool.dtype not in (torch.float32, torch.float64):
        raise ValueError(f"state_pool: expected fp32 (K3 keeps the recurrent state in fp32), got {state_pool.dtype}")
