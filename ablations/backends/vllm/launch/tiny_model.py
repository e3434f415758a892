"""Write a tiny K3-family model directory: config.json, a local character-level tokenizer, and (K3
wrapper) the image-processor settings the wrapper reads at start-up.

There are no weight files: vLLM builds the weights with our `k3_fan_in` load format
(`cpu/loader.py`), a seeded fan-in-scaled random init.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from ablations.backends.vllm.config import ModelConfig

SPECIAL_TOKENS = (
    "<pad>", "<s>", "</s>", "<unk>", "<|im_start|>", "<|im_end|>", "<|kimi_image_placeholder|>", "<|media_pad|>"
)
PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3
MEDIA_PAD_ID = SPECIAL_TOKENS.index("<|media_pad|>")
# The K3 wrapper builds its image processor (KimiK25FusedVisionProcessor) whenever a tokenizer is
# loaded, even with images disabled; these are the fields it reads.
MEDIA_PROC_CFG = {
    "patch_size": 14,
    "merge_kernel_size": [2, 2],
    "temporal_merge_kernel_size": 1,
    "in_patch_limit": 1024,
    "in_patch_limit_each_frame": 1024,
    "in_patch_limit_video": 1024,
    "patch_limit_on_one_side": 64,
    "fixed_output_tokens": None,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
}
STAMP_FILE = "k3_ablate_model.json"
GENERATOR_VERSION = 2  # bump when the files written change, so existing model dirs are refreshed
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def text_config(cfg: ModelConfig) -> dict[str, Any]:
    """The `kimi_linear` text config (KimiLinearConfig fields)."""
    linear_attn = {
        "kda_layers": list(cfg.kda_layers),
        "full_attn_layers": cfg.full_attn_layers,
        "num_heads": cfg.kda_num_heads,
        "head_dim": cfg.kda_head_dim,
        "short_conv_kernel_size": cfg.short_conv_kernel_size,
        "use_full_rank_gate": cfg.use_full_rank_gate,
    }
    if cfg.gate_lower_bound is not None:
        linear_attn["gate_lower_bound"] = cfg.gate_lower_bound
    return {
        "model_type": "kimi_linear",
        "architectures": ["KimiLinearForCausalLM"],
        "dtype": cfg.dtype,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_hidden_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_attention_heads,
        "head_dim": cfg.qk_nope_head_dim + cfg.qk_rope_head_dim,
        "hidden_act": cfg.hidden_act,
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": cfg.max_position_embeddings,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "pad_token_id": PAD_ID,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "q_lora_rank": cfg.q_lora_rank,
        "kv_lora_rank": cfg.kv_lora_rank,
        "qk_nope_head_dim": cfg.qk_nope_head_dim,
        "qk_rope_head_dim": cfg.qk_rope_head_dim,
        "v_head_dim": cfg.v_head_dim,
        "mla_use_nope": True,
        "mla_use_output_gate": cfg.mla_use_output_gate,
        "num_experts": cfg.num_experts,
        "num_experts_per_token": cfg.num_experts_per_token,
        "moe_intermediate_size": cfg.moe_intermediate_size,
        "num_shared_experts": cfg.num_shared_experts,
        "first_k_dense_replace": cfg.first_k_dense_replace,
        "moe_layer_freq": 1,
        "moe_renormalize": True,
        "moe_router_activation_func": "sigmoid",
        "routed_scaling_factor": cfg.routed_scaling_factor,
        "use_grouped_topk": True,
        "num_expert_group": 1,
        "topk_group": 1,
        "routed_expert_hidden_size": cfg.routed_expert_hidden_size,
        "latent_moe_use_norm": cfg.latent_moe_use_norm,
        "attn_res_block_size": cfg.attn_res_block_size,
        "linear_attn_config": linear_attn,
        "num_nextn_predict_layers": cfg.num_nextn_predict_layers,
    }


def vision_config(cfg: ModelConfig) -> dict[str, Any]:
    """A minimal MoonViT config: the K3 wrapper always builds its vision tower."""
    return {
        "model_type": "kimi_k3_vision",
        "patch_size": 14,
        "init_pos_emb_height": 4,
        "init_pos_emb_width": 4,
        "init_pos_emb_time": 1,
        "vt_num_attention_heads": 2,
        "vt_num_hidden_layers": 1,
        "vt_hidden_size": 64,
        "vt_intermediate_size": 128,
        "mm_hidden_size": 64,
        "text_hidden_size": cfg.hidden_size,
    }


def hf_config(cfg: ModelConfig) -> dict[str, Any]:
    """config.json for `cfg.architecture`."""
    text = text_config(cfg)
    if cfg.architecture == "KimiLinearForCausalLM":
        return text
    return {
        "model_type": "kimi_k3",
        "architectures": ["KimiK3ForConditionalGeneration"],
        "dtype": cfg.dtype,
        "text_config": text,
        "vision_config": vision_config(cfg),
        "media_placeholder_token_id": MEDIA_PAD_ID,
        "pad_token_id": PAD_ID,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
    }


def tokenizer_vocab(vocab_size: int) -> dict[str, int]:
    """Special tokens, printable ASCII characters, then filler tokens `<tN>` up to `vocab_size`."""
    tokens = list(SPECIAL_TOKENS) + ["\n", "\t"] + [chr(c) for c in range(32, 127)]
    if len(tokens) > vocab_size:
        raise ValueError(f"ModelConfig.vocab_size: {vocab_size} is below the tokenizer's {len(tokens)} base tokens")
    tokens += [f"<t{i}>" for i in range(len(tokens), vocab_size)]
    return {tok: i for i, tok in enumerate(tokens)}


def write_tokenizer(path: Path, vocab_size: int) -> None:
    """A character-level WordLevel tokenizer covering every id of the model's vocabulary."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel(vocab=tokenizer_vocab(vocab_size), unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "pad_token": "<pad>",
        "unk_token": "<unk>",
        "model_max_length": 1 << 20,
        "add_bos_token": False,
        "chat_template": CHAT_TEMPLATE,
    }, indent=1))
    (path / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>"}, indent=1
    ))


def config_digest(cfg: ModelConfig) -> str:
    payload = {"generator": GENERATOR_VERSION, "model": cfg.to_dict()}
    return hashlib.sha1(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def write_model_dir(cfg: ModelConfig, path: str | Path) -> Path:
    """Write (or refresh, when `cfg` changed) the model directory at `path`; returns it."""
    path = Path(path)
    stamp = path / STAMP_FILE
    digest = config_digest(cfg)
    if stamp.is_file() and json.loads(stamp.read_text()).get("digest") == digest:
        return path
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(hf_config(cfg), indent=1))
    (path / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": BOS_ID, "eos_token_id": EOS_ID, "pad_token_id": PAD_ID}, indent=1
    ))
    write_tokenizer(path, cfg.vocab_size)
    if cfg.architecture == "KimiK3ForConditionalGeneration":
        (path / "preprocessor_config.json").write_text(json.dumps({"media_proc_cfg": MEDIA_PROC_CFG}, indent=1))
    stamp.write_text(json.dumps({"digest": digest, "model": cfg.to_dict()}, indent=1))
    return path


def prompt_length(model_dir: str | Path, text: str) -> int:
    """Number of tokens the model directory's tokenizer gives `text`."""
    from tokenizers import Tokenizer

    return len(Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json")).encode(text).ids)
