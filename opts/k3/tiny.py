"""The tiny K3 the vLLM backend serves here, defined once: its config in Hugging Face's field names (what
`ablations/backends/vllm/launch/tiny_model.py` writes into the checkpoint's config.json). The vLLM backend's
`ModelConfig` takes its defaults from it, `K3_TINY` is its spec, and the simulator's `k3_tiny` reads its sizes."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from opts.k3.spec import K3Spec

# K3 wrapper architecture; KDA (1-based layers 1, 3) and MLA (2, 4) mixed; K3 KDA with its full-rank gate, q-LoRA
# MLA with the sigmoid output gate, attention residuals over 2-layer blocks, a latent MoE with a shared expert, one
# MTP layer. kv_lora_rank 512 + rope 64: the only latent head vLLM-CPU's MLA decode kernel has. fp32: exact checks.
TINY_CONFIG: Mapping[str, Any] = MappingProxyType({
    "architecture": "KimiK3ForConditionalGeneration",
    "dtype": "float32",
    "seed": 0,
    "vocab_size": 1024,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 4,
    "kda_layers": (1, 3),
    "kda_num_heads": 4,
    "kda_head_dim": 64,
    "short_conv_kernel_size": 4,
    "use_full_rank_gate": True,
    "gate_lower_bound": None,
    "num_attention_heads": 4,
    "q_lora_rank": 128,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 64,
    "qk_rope_head_dim": 64,
    "v_head_dim": 64,
    "mla_use_output_gate": True,
    "num_experts": 8,
    "num_experts_per_token": 2,
    "num_shared_experts": 1,
    "moe_intermediate_size": 128,
    "first_k_dense_replace": 1,
    "routed_expert_hidden_size": 128,
    "latent_moe_use_norm": True,
    "routed_scaling_factor": 1.0,
    "hidden_act": "silu",
    "attn_res_block_size": 2,
    "num_nextn_predict_layers": 1,
    "max_position_embeddings": 4096,
})

DTYPE_BYTES = {"float32": 4.0, "bfloat16": 2.0}


def spec_from_config(name: str, config: Mapping[str, Any]) -> K3Spec:
    """The K3Spec of a K3-family model given by its config (Hugging Face field names, as `TINY_CONFIG`)."""
    kda = len(config["kda_layers"])
    return K3Spec(
        name=name, num_layers=config["num_hidden_layers"], num_kda_layers=kda, hidden=config["hidden_size"],
        mla_heads=config["num_attention_heads"], q_lora_rank=config["q_lora_rank"],
        kv_lora_rank=config["kv_lora_rank"], rope_dim=config["qk_rope_head_dim"],
        qk_nope_dim=config["qk_nope_head_dim"], v_head_dim=config["v_head_dim"],
        kda_heads=config["kda_num_heads"] if kda else 0, kda_head_dim=config["kda_head_dim"] if kda else 0,
        conv_width=config["short_conv_kernel_size"] if kda else 0,
        num_experts=config["num_experts"], num_shared_experts=config["num_shared_experts"],
        experts_per_token=config["num_experts_per_token"], expert_latent=config["routed_expert_hidden_size"] or 0,
        moe_intermediate=config["moe_intermediate_size"], attn_res_block=config["attn_res_block_size"] or 0,
        mtp_layers=config["num_nextn_predict_layers"], mla_output_gate=config["mla_use_output_gate"],
    )


K3_TINY = spec_from_config("k3_tiny", TINY_CONFIG)
