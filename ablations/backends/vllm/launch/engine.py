"""Engine settings for the tiny K3 model on vLLM: engine kwargs, server flags, process environment, and an LLM.

One `EngineConfig` gives the same engine to `vllm.LLM` (offline, `open_llm`) and to the OpenAI
server (`server.py`). The plugin (entry point `k3_ablate`) is loaded by vLLM itself in every process.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import json
import os
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ablations.backends.vllm.config import EngineSettings, ModelConfig, VllmBackendConfig
from ablations.backends.vllm.in_vllm.cpu.loader import LOAD_FORMAT
from ablations.backends.vllm.in_vllm.toggles import CONFIG_KEY
from ablations.backends.vllm.launch.runtime import hide_media_wheels, vllm_process_env
from ablations.backends.vllm.launch.tiny_model import write_model_dir
from opts.base import check_known_fields
from opts.registry import parse_vector, vector_dict, vllm_settings
from opts.vllm_setting import VllmSetting, check_platform

DEFAULT_MODEL_DIR = Path(os.environ.get("K3_ABLATE_MODEL_DIR", Path.home() / ".cache" / "k3-ablate" / "models"))
SPEC_METHODS = ("mtp", "ngram")
# Engine arguments a toggle's vLLM setting may add, passed to the server as `--name value`.
TOGGLE_FLAGS = frozenset({"attention_backend", "prefix_match_unit", "enable_expert_parallel", "all2all_backend"})
REJECTION_METHODS = ("standard", "synthetic")
CPU_MLA_BACKEND = "CPU_MLA"
THREADS_BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"


def _bad(name: str, value: Any, valid: str) -> ValueError:
    return ValueError(f"EngineConfig.{name}: invalid value {value!r}; valid: {valid}")


@dataclass
class EngineConfig(EngineSettings):
    """One vLLM engine over a tiny K3-family model (the engine settings are EngineSettings').

    `model_dir` empty: `<model_cache or K3_ABLATE_MODEL_DIR or ~/.cache/k3-ablate/models>/<model.name>-<digest>`.
    `shutdown_timeout_s`: how long a stopping engine lets its processes finish before killing them.
    `served_model_name` empty: the model's name (`k3_tiny`), the name clients send to the server.
    `toggles`: the toggle vector {optimization: {field: value}}; each toggle's `vllm.py` setting for `platform`
    adds engine arguments, environment and patches, and the vector travels to every vLLM process in
    `additional_config["k3_ablate"]`. Empty: stock vLLM (with the CPU fixes on a CPU).
    """

    model: ModelConfig = field(default_factory=ModelConfig)
    model_dir: str = ""
    model_cache: str = ""
    served_model_name: str = ""
    rejection_sample_method: str = "standard"
    synthetic_acceptance_rates: list[float] | None = None
    skip_tokenizer_init: bool = False
    multiprocess: bool = True
    log_stats: bool = True
    shutdown_timeout_s: int = 10
    additional_config: dict[str, Any] = field(default_factory=dict)
    toggles: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.model, dict):
            self.model = ModelConfig.from_dict(self.model)
        check_platform(self.platform)
        if CONFIG_KEY in self.additional_config:
            raise _bad("additional_config", self.additional_config, f"no {CONFIG_KEY!r} entry (set `toggles`)")
        self.toggles = vector_dict(parse_vector(dict(self.toggles), "EngineConfig.toggles"))
        self.settings()
        for name in ("max_model_len", "max_num_seqs", "kv_cache_gib", "tensor_parallel_size", "data_parallel_size"):
            if getattr(self, name) <= 0:
                raise _bad(name, getattr(self, name), "a positive integer")
        if self.shutdown_timeout_s < 0:
            raise _bad("shutdown_timeout_s", self.shutdown_timeout_s, "0 (kill at once) or a positive integer")
        if self.max_model_len > self.model.max_position_embeddings and not self.model.checkpoint:
            raise _bad("max_model_len", self.max_model_len,
                       f"1..{self.model.max_position_embeddings} (model.max_position_embeddings)")
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens <= 0:
            raise _bad("max_num_batched_tokens", self.max_num_batched_tokens, "null or a positive integer")
        blocks = self.num_gpu_blocks_override
        if blocks is not None and (isinstance(blocks, bool) or not isinstance(blocks, int) or blocks < 1):
            raise _bad("num_gpu_blocks_override", blocks, "null (vLLM's own sizing) or an integer >= 1")
        budget = self.max_num_batched_tokens or self.max_model_len
        if not self.enable_chunked_prefill and budget < self.max_model_len:
            raise _bad("max_num_batched_tokens", budget, ">= max_model_len without chunked prefill")
        if self.num_speculative_tokens < 0:
            raise _bad("num_speculative_tokens", self.num_speculative_tokens, "0 (off) or a positive integer")
        if self.tensor_parallel_size > 1 and not self.multiprocess:
            raise _bad("tensor_parallel_size", self.tensor_parallel_size, "1 with multiprocess=False (ranks are "
                       "worker processes)")
        toggle_spec = self._toggle_speculation()
        if toggle_spec and self.num_speculative_tokens:
            raise _bad("num_speculative_tokens", self.num_speculative_tokens,
                       f"0 when the toggle vector sets the speculative config ({toggle_spec}): one place sets "
                       "the draft length")
        if toggle_spec and not self.model.num_nextn_predict_layers:
            raise _bad("toggles", toggle_spec, "a model with an MTP layer (num_nextn_predict_layers=1)")
        per_batch = [name for name, spec in self._toggle_specs().items()
                     if "num_speculative_tokens_per_batch_size" in spec]
        if per_batch and self.data_parallel_size > 1:
            raise _bad("data_parallel_size", self.data_parallel_size,
                       f"1 with {per_batch[0]}={self.toggles[per_batch[0]]['mode']}: vLLM 0.32 drops "
                       "num_speculative_tokens_per_batch_size when data_parallel_size > 1 (config/vllm.py), so "
                       "the cell would run a fixed K")
        if self.spec_method not in SPEC_METHODS:
            raise _bad("spec_method", self.spec_method, ", ".join(SPEC_METHODS))
        if self.num_speculative_tokens and self.spec_method == "mtp" and not self.model.num_nextn_predict_layers:
            raise _bad("spec_method", "mtp", "ngram, or a model with num_nextn_predict_layers=1")
        if self.rejection_sample_method not in REJECTION_METHODS:
            raise _bad("rejection_sample_method", self.rejection_sample_method, ", ".join(REJECTION_METHODS))
        rates = self.synthetic_acceptance_rates
        if (rates is not None) != (self.rejection_sample_method == "synthetic"):
            raise _bad("synthetic_acceptance_rates", rates, "a list exactly when rejection_sample_method=synthetic")
        if rates is not None and (
            len(rates) != self.num_speculative_tokens
            or any(not 0 <= r <= 1 for r in rates)
            or any(b > a for a, b in itertools.pairwise(rates))
        ):
            raise _bad(
                "synthetic_acceptance_rates", rates,
                f"{self.num_speculative_tokens} non-increasing values in [0, 1] (one per draft position)",
            )

    def _toggle_specs(self) -> dict[str, dict[str, Any]]:
        """The `speculative_config` each toggle's vLLM setting sets, by toggle name."""
        return {name: s.engine_args["speculative_config"] for name, s in self.settings().items()
                if "speculative_config" in s.engine_args}

    def _toggle_speculation(self) -> str:
        """The toggles whose vLLM setting sets `speculative_config`, as "name=mode" ("" when none)."""
        return ", ".join(f"{name}={self.toggles[name]['mode']}" for name in self._toggle_specs())

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> EngineConfig:
        check_known_fields(cls, values)
        return cls(**values)

    def settings(self) -> dict[str, VllmSetting]:
        """What each toggle changes in vLLM on `platform` (a cell vLLM cannot run raises ValueError)."""
        return vllm_settings(parse_vector(self.toggles), self.platform)

    @property
    def served_name(self) -> str:
        return self.served_model_name or self.model.name

    def resolved_model_dir(self) -> Path:
        if self.model.checkpoint:
            return Path(self.model.checkpoint)
        if self.model_dir:
            return Path(self.model_dir)
        from ablations.backends.vllm.launch.tiny_model import config_digest

        cache = Path(self.model_cache) if self.model_cache else DEFAULT_MODEL_DIR
        return cache / f"{self.model.name}-{config_digest(self.model)}"

    def ensure_model_dir(self) -> Path:
        """Write the model directory if it is missing or stale; returns it (a checkpoint is used as it is)."""
        if self.model.checkpoint:
            return self.resolved_model_dir()
        return write_model_dir(self.model, self.resolved_model_dir())

    def speculative_config(self) -> dict[str, Any] | None:
        if not self.num_speculative_tokens:
            return None
        spec: dict[str, Any] = {"method": self.spec_method, "num_speculative_tokens": self.num_speculative_tokens}
        if self.spec_method == "ngram":
            spec.update(prompt_lookup_min=2, prompt_lookup_max=4)
        if self.rejection_sample_method == "synthetic":
            rates = list(self.synthetic_acceptance_rates or [])
            spec.update(rejection_sample_method="synthetic", synthetic_acceptance_rates=rates)
        return spec


def engine_kwargs(cfg: EngineConfig) -> dict[str, Any]:
    """Keyword arguments of `vllm.LLM` / `EngineArgs` for `cfg` (the model dir must exist)."""
    tiny = not cfg.model.checkpoint    # a real checkpoint: its own weights and dtype, CUDA/HIP graphs
    kwargs: dict[str, Any] = dict(
        model=str(cfg.resolved_model_dir()),
        served_model_name=cfg.served_name,
        load_format=LOAD_FORMAT if tiny else "auto",
        dtype=cfg.model.dtype if tiny else "auto",
        enforce_eager=tiny,
        max_model_len=cfg.max_model_len,
        max_num_seqs=cfg.max_num_seqs,
        enable_prefix_caching=cfg.enable_prefix_caching,
        enable_chunked_prefill=cfg.enable_chunked_prefill,
        seed=cfg.seed,
        skip_tokenizer_init=cfg.skip_tokenizer_init,
        disable_log_stats=not cfg.log_stats,
        shutdown_timeout=cfg.shutdown_timeout_s,
    )
    if tiny:
        kwargs["model_loader_extra_config"] = {"seed": cfg.model.seed}
    if cfg.max_num_batched_tokens is not None:
        kwargs["max_num_batched_tokens"] = cfg.max_num_batched_tokens
    if cfg.num_gpu_blocks_override is not None:
        kwargs["num_gpu_blocks_override"] = cfg.num_gpu_blocks_override
    if cfg.tensor_parallel_size > 1:
        kwargs["tensor_parallel_size"] = cfg.tensor_parallel_size
    if cfg.data_parallel_size > 1:
        kwargs["data_parallel_size"] = cfg.data_parallel_size
    if cfg.model.architecture == "KimiK3ForConditionalGeneration":
        kwargs["limit_mm_per_prompt"] = {"image": 0}
    spec = cfg.speculative_config()
    if spec is not None:
        kwargs["speculative_config"] = spec
    extra = dict(cfg.additional_config)
    for name, setting in cfg.settings().items():
        clash = sorted((set(setting.engine_args) & set(kwargs)) | (set(setting.additional_config) & set(extra)))
        if clash:
            raise ValueError(f"toggle {name}: its vLLM setting overrides {', '.join(clash)}, already set")
        kwargs.update(setting.engine_args)
        extra.update(setting.additional_config)
    if cfg.platform == "cpu" and cfg.model.has_mla:
        # S24: on hosts with AMX vLLM-CPU would pick AMX_MLA (no float32 kernels) for the model and, on its own,
        # for the MTP draft; every host runs CPU_MLA for both.
        kwargs["attention_backend"] = CPU_MLA_BACKEND
        if "speculative_config" in kwargs:
            kwargs["speculative_config"] = {**kwargs["speculative_config"], "attention_backend": CPU_MLA_BACKEND}
    if cfg.toggles:
        extra[CONFIG_KEY] = cfg.toggles
    if extra:
        kwargs["additional_config"] = extra
    return kwargs


def server_args(cfg: EngineConfig) -> list[str]:
    """The OpenAI server's command-line flags for `cfg`."""
    kw = engine_kwargs(cfg)
    args = [
        "--model", kw.pop("model"),
        "--served-model-name", kw.pop("served_model_name"),
        "--load-format", kw.pop("load_format"),
        "--dtype", kw.pop("dtype"),
        "--max-model-len", str(kw.pop("max_model_len")),
        "--max-num-seqs", str(kw.pop("max_num_seqs")),
        "--seed", str(kw.pop("seed")),
        "--shutdown-timeout", str(kw.pop("shutdown_timeout")),
        "--enforce-eager" if kw.pop("enforce_eager") else "--no-enforce-eager",
        "--enable-prefix-caching" if kw.pop("enable_prefix_caching") else "--no-enable-prefix-caching",
        "--enable-chunked-prefill" if kw.pop("enable_chunked_prefill") else "--no-enable-chunked-prefill",
    ]
    if "model_loader_extra_config" in kw:
        args += ["--model-loader-extra-config", json.dumps(kw.pop("model_loader_extra_config"))]
    if kw.pop("skip_tokenizer_init"):
        args.append("--skip-tokenizer-init")
    if kw.pop("disable_log_stats"):
        args.append("--disable-log-stats")
    if "max_num_batched_tokens" in kw:
        args += ["--max-num-batched-tokens", str(kw.pop("max_num_batched_tokens"))]
    if "num_gpu_blocks_override" in kw:
        args += ["--num-gpu-blocks-override", str(kw.pop("num_gpu_blocks_override"))]
    if "tensor_parallel_size" in kw:
        args += ["--tensor-parallel-size", str(kw.pop("tensor_parallel_size"))]
    if "data_parallel_size" in kw:
        args += ["--data-parallel-size", str(kw.pop("data_parallel_size"))]
    for name, flag in (
        ("limit_mm_per_prompt", "--limit-mm-per-prompt"),
        ("speculative_config", "--speculative-config"),
        ("additional_config", "--additional-config"),
    ):
        if name in kw:
            args += [flag, json.dumps(kw.pop(name))]
    for name in sorted(set(kw) & TOGGLE_FLAGS):
        flag, value = name.replace("_", "-"), kw.pop(name)
        if isinstance(value, bool):
            args.append(f"--{flag}" if value else f"--no-{flag}")
        else:
            args += [f"--{flag}", str(value)]
    if kw:
        raise AssertionError(f"server_args: engine kwargs without a server flag: {sorted(kw)}")
    return args


def engine_env(cfg: EngineConfig) -> dict[str, str]:
    """Environment entries a vLLM process for `cfg` needs (on top of the hiding in `vllm_process_env`)."""
    env = {
        "VLLM_CPU_KVCACHE_SPACE": str(cfg.kv_cache_gib),
        "VLLM_ENABLE_V1_MULTIPROCESSING": "1" if cfg.multiprocess else "0",
    }
    if cfg.platform == "cpu" and cfg.tensor_parallel_size > 1:
        env[THREADS_BIND_ENV] = os.environ.get(THREADS_BIND_ENV) or rank_cores(cfg.tensor_parallel_size)
    env.update(toggle_env(cfg))
    return env


def toggle_env(cfg: EngineConfig) -> dict[str, str]:
    """The environment variables the toggles' vLLM settings set for `cfg`'s platform."""
    env: dict[str, str] = {}
    for setting in cfg.settings().values():
        env.update(setting.env)
    return env


def rank_cores(num_ranks: int, cores: list[int] | None = None) -> str:
    """VLLM_CPU_OMP_THREADS_BIND for `num_ranks` CPU workers: this process's cores split into that many groups
    ("0|1" for 2 ranks on 2 cores). vLLM's "auto" binds rank N to NUMA node N, which one-node machines lack."""
    cores = sorted(os.sched_getaffinity(0)) if cores is None else cores
    if len(cores) < num_ranks:
        raise ValueError(f"EngineConfig.tensor_parallel_size: invalid value {num_ranks}; vLLM-CPU binds each rank "
                         f"to its own cores and this process has {len(cores)} ({cores}); set {THREADS_BIND_ENV} "
                         "to override")
    per = len(cores) // num_ranks
    return "|".join(",".join(map(str, cores[i * per:(i + 1) * per])) for i in range(num_ranks))


def process_env(cfg: EngineConfig, base: dict[str, str] | None = None) -> dict[str, str]:
    """Full environment for a child process (e.g. the OpenAI server) serving `cfg`."""
    env = vllm_process_env(base)
    env.update(engine_env(cfg))
    return env


def build_llm(cfg: EngineConfig):
    """A `vllm.LLM` for `cfg` in this process (writes the model dir if needed)."""
    cfg.ensure_model_dir()
    os.environ.update(engine_env(cfg))
    hide_media_wheels()
    from vllm import LLM

    return LLM(**engine_kwargs(cfg))


def shutdown_llm(llm) -> None:
    """Stop the engine's background processes now (not at interpreter exit)."""
    engine = getattr(llm, "llm_engine", None)
    core = getattr(engine, "engine_core", None)
    if core is not None:
        core.shutdown()
    gc.collect()


@contextlib.contextmanager
def open_llm(cfg: EngineConfig) -> Iterator[Any]:
    """`with open_llm(cfg) as llm:` an engine that is shut down on exit."""
    llm = build_llm(cfg)
    try:
        yield llm
    finally:
        shutdown_llm(llm)
        del llm
        gc.collect()


def random_prompts(num: int, seed: int, min_len: int = 20, max_len: int = 300, vocab: int = 1000) -> list[list[int]]:
    """`num` prompts of random token ids in [10, vocab), lengths in [min_len, max_len), from `seed`."""
    rng = random.Random(seed)
    return [[rng.randrange(10, vocab) for _ in range(rng.randrange(min_len, max_len))] for _ in range(num)]


@dataclass
class BatchTiming:
    """One batch of requests generated together: seconds, prompt and output tokens."""

    seconds: float
    num_requests: int
    prompt_tokens: int
    output_tokens: int

    @property
    def output_tokens_per_s(self) -> float:
        return self.output_tokens / self.seconds

    @property
    def tokens_per_s(self) -> float:
        return (self.prompt_tokens + self.output_tokens) / self.seconds


@dataclass
class EngineTiming:
    """Seconds to start an engine, and each batch generated on it in order (the first one includes warm-up)."""

    start_s: float
    batches: list[BatchTiming]


def time_engine(cfg: EngineConfig, batches: list[list[list[int]]], max_tokens: int) -> EngineTiming:
    """Start an engine for `cfg`, greedy-generate `max_tokens` per prompt batch by batch, shut it down; time it."""
    t0 = time.perf_counter()
    with open_llm(cfg) as llm:
        start_s = time.perf_counter() - t0
        from vllm import SamplingParams

        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, detokenize=False)
        timings = []
        for prompts in batches:
            t1 = time.perf_counter()
            outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
            timings.append(BatchTiming(time.perf_counter() - t1, len(prompts), sum(map(len, prompts)),
                                       sum(len(o.outputs[0].token_ids) for o in outputs)))
    return EngineTiming(start_s, timings)


def engine_config(backend: VllmBackendConfig, model: ModelConfig, toggles: dict[str, Any],
                  model_cache: str = "") -> EngineConfig:
    """The EngineConfig of a run: the backend's engine settings, the model group's model, the toggle vector.
    `model_cache`: the directory model directories go in ("" = the default cache)."""
    return EngineConfig(model=model, model_cache=model_cache, toggles=toggles, skip_tokenizer_init=True,
                        **backend.engine_settings())
