"""Typed schema of a tiny K3-family model for the vLLM backend (conf/model/*.yaml)."""

from __future__ import annotations

import types
import typing
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar

from opts.base import check_known_fields
from opts.k3 import TINY_CONFIG as TINY

ARCHITECTURES = ("KimiK3ForConditionalGeneration", "KimiLinearForCausalLM")
DTYPES = ("float32", "bfloat16")
HIDDEN_ACTS = ("silu",)
# vLLM-CPU's MLA decode kernel (csrc/cpu/mla_decode.cpp) only exists for a 576-wide latent head.
CPU_MLA_KV_LORA_RANK = 512
CPU_MLA_ROPE_DIM = 64
# Models that only their checkpoint defines (conf/model/<name>.yaml): vLLM serves them from `checkpoint`, never empty.
FULL_SIZE_MODELS = ("kimi_k3",)
# Models only the serving simulator runs (its check against published GPU results): no vLLM cell is built for them.
SIM_ONLY_MODELS = ("deepseek_r1",)


def _bad(field_name: str, value: Any, valid: str) -> ValueError:
    return ValueError(f"ModelConfig.{field_name}: invalid value {value!r}; valid: {valid}")


def matches_type(value: Any, hint: Any) -> bool:
    """Whether `value` fits the annotation `hint` (int, float, bool, str, list[X], X | None); ints pass as floats."""
    origin = typing.get_origin(hint)
    if origin in (types.UnionType, typing.Union):
        return any(matches_type(value, arg) for arg in typing.get_args(hint))
    if origin is list:
        (item,) = typing.get_args(hint)
        return isinstance(value, list) and all(matches_type(v, item) for v in value)
    if hint is type(None):
        return value is None
    if isinstance(value, bool):
        return hint is bool
    if hint is float:
        return isinstance(value, int | float)
    return isinstance(value, hint)


def type_name(hint: Any) -> str:
    return getattr(hint, "__name__", None) if typing.get_origin(hint) is None else str(hint).replace("typing.", "")


def check_types(obj: Any) -> None:
    """Raise ValueError naming the first field of dataclass `obj` whose value does not fit its annotation."""
    hints = typing.get_type_hints(type(obj))
    for f in fields(obj):
        value = getattr(obj, f.name)
        if not matches_type(value, hints[f.name]):
            valid = type_name(hints[f.name])
            raise ValueError(f"{type(obj).__name__}.{f.name}: invalid value {value!r}; valid: {valid}")


@dataclass
class ModelConfig:
    """A tiny K3-family model: KDA and MLA layers mixed, latent MoE, MTP head (defaults: `opts.k3.TINY_CONFIG`).

    `kda_layers` are 1-based (the checkpoint convention); every other layer is MLA. `checkpoint` (a local path
    or a Hugging Face id) serves that real checkpoint instead, whose own config.json then defines the model
    (`conf/model/kimi_k3.yaml`; on GPU nodes, through `backend.print_commands`); of the other fields only
    `vocab_size` is still read: the replayed prompts' token ids stay below it (valid in any larger vocabulary).
    """

    name: str = "k3_tiny"
    checkpoint: str = ""
    architecture: str = TINY["architecture"]
    dtype: str = TINY["dtype"]
    seed: int = TINY["seed"]
    vocab_size: int = TINY["vocab_size"]
    hidden_size: int = TINY["hidden_size"]
    intermediate_size: int = TINY["intermediate_size"]
    num_hidden_layers: int = TINY["num_hidden_layers"]
    kda_layers: list[int] = field(default_factory=lambda: list(TINY["kda_layers"]))
    kda_num_heads: int = TINY["kda_num_heads"]
    kda_head_dim: int = TINY["kda_head_dim"]
    short_conv_kernel_size: int = TINY["short_conv_kernel_size"]
    use_full_rank_gate: bool = TINY["use_full_rank_gate"]
    gate_lower_bound: float | None = TINY["gate_lower_bound"]
    num_attention_heads: int = TINY["num_attention_heads"]
    q_lora_rank: int | None = TINY["q_lora_rank"]
    kv_lora_rank: int = TINY["kv_lora_rank"]
    qk_nope_head_dim: int = TINY["qk_nope_head_dim"]
    qk_rope_head_dim: int = TINY["qk_rope_head_dim"]
    v_head_dim: int = TINY["v_head_dim"]
    mla_use_output_gate: bool = TINY["mla_use_output_gate"]
    num_experts: int | None = TINY["num_experts"]
    num_experts_per_token: int = TINY["num_experts_per_token"]
    num_shared_experts: int = TINY["num_shared_experts"]
    moe_intermediate_size: int = TINY["moe_intermediate_size"]
    first_k_dense_replace: int = TINY["first_k_dense_replace"]
    routed_expert_hidden_size: int | None = TINY["routed_expert_hidden_size"]
    latent_moe_use_norm: bool = TINY["latent_moe_use_norm"]
    routed_scaling_factor: float = TINY["routed_scaling_factor"]
    hidden_act: str = TINY["hidden_act"]
    attn_res_block_size: int | None = TINY["attn_res_block_size"]
    num_nextn_predict_layers: int = TINY["num_nextn_predict_layers"]
    max_position_embeddings: int = TINY["max_position_embeddings"]

    def __post_init__(self) -> None:
        if isinstance(self.kda_layers, Sequence) and not isinstance(self.kda_layers, str):
            self.kda_layers = list(self.kda_layers)
        self.validate()

    @property
    def full_attn_layers(self) -> list[int]:
        """1-based indices of the MLA layers."""
        return [i for i in range(1, self.num_hidden_layers + 1) if i not in self.kda_layers]

    @property
    def has_mla(self) -> bool:
        return bool(self.full_attn_layers)

    def validate(self) -> None:
        check_types(self)
        if self.architecture not in ARCHITECTURES:
            raise _bad("architecture", self.architecture, ", ".join(ARCHITECTURES))
        if self.dtype not in DTYPES:
            raise _bad("dtype", self.dtype, ", ".join(DTYPES))
        if self.hidden_act not in HIDDEN_ACTS:
            raise _bad(
                "hidden_act", self.hidden_act, "silu (SiTU has no unquantized CPU MoE backend in vLLM 0.32)"
            )
        for name in (
            "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "kda_num_heads",
            "kda_head_dim", "num_attention_heads", "qk_nope_head_dim", "v_head_dim", "moe_intermediate_size",
            "max_position_embeddings", "short_conv_kernel_size", "num_experts_per_token",
        ):
            if getattr(self, name) <= 0:
                raise _bad(name, getattr(self, name), "a positive integer")
        bad_layers = [i for i in self.kda_layers if not 1 <= i <= self.num_hidden_layers]
        if bad_layers or len(set(self.kda_layers)) != len(self.kda_layers):
            raise _bad("kda_layers", self.kda_layers, f"distinct 1-based indices in 1..{self.num_hidden_layers}")
        if self.has_mla and self.kv_lora_rank != CPU_MLA_KV_LORA_RANK:
            raise _bad("kv_lora_rank", self.kv_lora_rank, f"{CPU_MLA_KV_LORA_RANK} (vLLM-CPU MLA decode kernel)")
        if self.has_mla and self.qk_rope_head_dim != CPU_MLA_ROPE_DIM:
            raise _bad(
                "qk_rope_head_dim", self.qk_rope_head_dim, f"{CPU_MLA_ROPE_DIM} (vLLM-CPU MLA decode kernel)"
            )
        if self.num_experts is not None and not 1 <= self.num_experts_per_token <= self.num_experts:
            raise _bad("num_experts_per_token", self.num_experts_per_token, f"1..num_experts={self.num_experts}")
        if self.gate_lower_bound is not None and not -5.0 <= self.gate_lower_bound < 0:
            raise _bad("gate_lower_bound", self.gate_lower_bound, "null or a value in [-5, 0)")
        if self.num_nextn_predict_layers not in (0, 1):
            raise _bad("num_nextn_predict_layers", self.num_nextn_predict_layers, "0 or 1")
        if self.num_nextn_predict_layers and self.architecture != "KimiK3ForConditionalGeneration":
            raise _bad(
                "num_nextn_predict_layers", self.num_nextn_predict_layers,
                "0 unless architecture is KimiK3ForConditionalGeneration (vLLM wires MTP only for kimi_k3)",
            )
        if self.attn_res_block_size is not None and self.attn_res_block_size <= 0:
            raise _bad("attn_res_block_size", self.attn_res_block_size, "null or a positive integer")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> ModelConfig:
        """Build from a plain mapping (e.g. a Hydra node), naming unknown fields."""
        check_known_fields(cls, values)
        return cls(**values)


@dataclass
class EngineSettings:
    """The vLLM engine settings a run chooses (shared by `EngineConfig` and the `backend` group's schema).

    `platform`: which of each toggle's vLLM settings applies (cpu, rocm, cuda). `num_speculative_tokens` 0
    turns speculation off (or leaves it to the draft_length toggle). `tensor_parallel_size`: ranks (worker
    processes) the model is sharded over; `data_parallel_size`: engine replicas (vLLM drops draft_length=on's
    per-batch-size K when it is above 1, so such a cell is refused). `kv_cache_gib` sizes the CPU KV cache;
    `num_gpu_blocks_override` (null: vLLM's own sizing) fixes its number of blocks instead.
    """

    platform: str = "cpu"
    max_model_len: int = 2048
    max_num_seqs: int = 16
    max_num_batched_tokens: int | None = None
    enable_prefix_caching: bool = False
    enable_chunked_prefill: bool = True
    num_speculative_tokens: int = 0
    spec_method: str = "mtp"
    kv_cache_gib: int = 1
    num_gpu_blocks_override: int | None = None
    tensor_parallel_size: int = 1
    data_parallel_size: int = 1
    seed: int = 0


# replay: the engine in this process, the workload replayed by its schedule (cell.py); serve: an OpenAI server per
# cell and a client at each concurrency (serve_cell.py).
MODES = ("replay", "serve")
CLIENTS = ("vllm_bench", "aiperf")


@dataclass
class VllmBackendConfig(EngineSettings):
    """The `backend=vllm` group: the engine a run starts for the `model` group's tiny model (conf/backend/vllm.yaml
    sets prefix caching and a 64-token step budget, so that with MTP, whose draft length the draft_length toggle
    sets, steps mix prefill chunks with verification rows, what kda_overlap acts on), and the short greedy
    generation it makes from the workload's first `num_requests` requests (prompts cut to `max_prompt_tokens`,
    `max_tokens` each). `mode` replay runs the engine in this process (cell.py); serve starts an OpenAI server
    per cell and replays with `client` at each of `concurrencies`, reading throughput per GPU at
    `target_interactivity` (tokens/s/user) from the points (serve_cell.py), after sending the trace's first
    `warmup_requests` requests once, one at a time, answers and steps left out (a fresh server's first request
    pays seconds of one-time start-up)."""

    VALIDATOR: ClassVar[str] = "ablations.backends.vllm.checks"    # checks an app config for this backend

    name: str = "vllm"
    num_requests: int = 8
    max_prompt_tokens: int = 512
    max_tokens: int = 16
    mode: str = "replay"
    client: str = "aiperf"
    concurrencies: list[int] = field(default_factory=lambda: [1, 2, 4])
    target_interactivity: float = 50.0
    warmup_requests: int = 1
    server_timeout_s: int = 300
    replay_timeout_s: int = 600
    print_commands: bool = False

    def __post_init__(self) -> None:
        check_types(self)
        if self.mode not in MODES:
            raise ValueError(f"VllmBackendConfig.mode: invalid value {self.mode!r}; valid choices: {', '.join(MODES)}")
        if self.client not in CLIENTS:
            raise ValueError(f"VllmBackendConfig.client: invalid value {self.client!r}; valid choices: "
                             f"{', '.join(CLIENTS)}")
        if not self.concurrencies or any(isinstance(c, bool) or not isinstance(c, int) or c < 1
                                         for c in self.concurrencies):
            raise ValueError(f"VllmBackendConfig.concurrencies: invalid value {self.concurrencies!r}; valid: a "
                             "non-empty list of integers >= 1")
        if not self.target_interactivity > 0:
            raise ValueError(f"VllmBackendConfig.target_interactivity: invalid value {self.target_interactivity!r}; "
                             "valid: tokens/s/user > 0")
        for name in ("server_timeout_s", "replay_timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"VllmBackendConfig.{name}: invalid value {getattr(self, name)!r}; valid: "
                                 "seconds > 0")
        if self.warmup_requests < 0:
            raise ValueError(f"VllmBackendConfig.warmup_requests: invalid value {self.warmup_requests!r}; valid: an "
                             "integer >= 0")
        for name in ("num_requests", "max_prompt_tokens", "max_tokens"):
            if getattr(self, name) <= 0:
                raise ValueError(f"VllmBackendConfig.{name}: invalid value {getattr(self, name)!r}; valid: a "
                                 "positive integer")
        if self.max_prompt_tokens + self.max_tokens > self.max_model_len:
            raise ValueError(f"VllmBackendConfig.max_prompt_tokens: {self.max_prompt_tokens} + max_tokens "
                             f"{self.max_tokens} exceed max_model_len {self.max_model_len}; valid: at most "
                             f"{self.max_model_len} together")

    def engine_settings(self) -> dict[str, Any]:
        """The EngineSettings fields, as keyword arguments of EngineConfig."""
        return {f.name: getattr(self, f.name) for f in fields(EngineSettings)}
