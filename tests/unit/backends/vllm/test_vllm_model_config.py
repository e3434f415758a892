"""Model and engine configs: validation names field, value and choices; the generator; server flags."""

from __future__ import annotations

import contextlib
import json

import pytest

from ablations.backends.vllm.config import ModelConfig
from ablations.backends.vllm.launch.engine import EngineConfig, engine_kwargs, rank_cores, server_args
from ablations.backends.vllm.launch.runtime import hide_media_wheels
from ablations.backends.vllm.launch.tiny_model import STAMP_FILE, tokenizer_vocab, write_model_dir
from opts.registry import OPTIMIZATIONS


@pytest.mark.parametrize(("field", "value", "hint"), [
    ("architecture", "Llama", "KimiK3ForConditionalGeneration"),
    ("dtype", "float16", "bfloat16"),
    ("kda_layers", [0, 2], "1-based"),
    ("kv_lora_rank", 256, "512"),
    ("hidden_act", "situ", "silu"),
    ("num_experts_per_token", 9, "1..num_experts"),
])
def test_bad_model_values_are_named(field, value, hint):
    with pytest.raises(ValueError) as err:
        ModelConfig(**{field: value})
    text = str(err.value)
    assert f"ModelConfig.{field}" in text and repr(value) in text and hint in text


def test_unknown_model_field_is_named():
    with pytest.raises(ValueError, match="kda_layer"):
        ModelConfig.from_dict({"kda_layer": [1]})


def test_default_model_mixes_kda_and_mla():
    cfg = ModelConfig()
    assert cfg.kda_layers == [1, 3] and cfg.full_attn_layers == [2, 4] and cfg.num_nextn_predict_layers == 1


def test_generator_writes_k3_wrapper_dir_and_refreshes_on_change(tmp_path):
    path = write_model_dir(ModelConfig(), tmp_path / "m")
    config = json.loads((path / "config.json").read_text())
    assert config["architectures"] == ["KimiK3ForConditionalGeneration"]
    text = config["text_config"]
    assert text["linear_attn_config"]["kda_layers"] == [1, 3] and text["linear_attn_config"]["use_full_rank_gate"]
    assert text["routed_expert_hidden_size"] == 128 and text["num_nextn_predict_layers"] == 1
    assert (path / "tokenizer.json").exists() and (path / "preprocessor_config.json").exists()
    stamp = (path / STAMP_FILE).read_text()
    write_model_dir(ModelConfig(), path)
    assert (path / STAMP_FILE).read_text() == stamp
    write_model_dir(ModelConfig(kda_layers=[1, 2, 3]), path)
    text = json.loads((path / "config.json").read_text())["text_config"]
    assert text["linear_attn_config"]["kda_layers"] == [1, 2, 3]


def test_tokenizer_covers_every_model_id(tmp_path):
    from tokenizers import Tokenizer

    path = write_model_dir(ModelConfig(), tmp_path / "m")
    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    assert tok.get_vocab_size() == len(tokenizer_vocab(1024)) == 1024
    ids = tok.encode("Hello, K3!").ids
    assert tok.decode(ids) == "Hello, K3!"


@pytest.mark.parametrize(("values", "field"), [
    ({"num_speculative_tokens": -1}, "num_speculative_tokens"),
    ({"spec_method": "eagle"}, "spec_method"),
    ({"num_speculative_tokens": 2, "rejection_sample_method": "synthetic", "synthetic_acceptance_rates": [0.5, 0.9]},
     "synthetic_acceptance_rates"),
    ({"synthetic_acceptance_rates": [1.0]}, "synthetic_acceptance_rates"),
    ({"num_gpu_blocks_override": 0}, "num_gpu_blocks_override"),
    ({"num_gpu_blocks_override": True}, "num_gpu_blocks_override"),
    ({"num_speculative_tokens": 1, "model": ModelConfig(num_nextn_predict_layers=0)}, "spec_method"),
    ({"tensor_parallel_size": 0}, "tensor_parallel_size"),
    ({"tensor_parallel_size": 2, "multiprocess": False}, "tensor_parallel_size"),
    ({"data_parallel_size": 0}, "data_parallel_size"),
    ({"num_speculative_tokens": 2, "toggles": {"draft_length": {"mode": "off"}}}, "num_speculative_tokens"),
    ({"toggles": {"draft_length": {"mode": "on"}}, "model": ModelConfig(num_nextn_predict_layers=0)}, "toggles"),
])
def test_bad_engine_values_are_named(values, field):
    with pytest.raises(ValueError, match=f"EngineConfig.{field}"):
        EngineConfig(**values)


def test_server_flags_cover_every_engine_argument(tmp_path):
    cfg = EngineConfig(model_dir=str(tmp_path), enable_prefix_caching=True, num_speculative_tokens=2,
                       max_num_batched_tokens=64)
    kwargs, args = engine_kwargs(cfg), server_args(cfg)
    assert kwargs["speculative_config"] == {"method": "mtp", "num_speculative_tokens": 2,
                                            "attention_backend": "CPU_MLA"}
    assert json.loads(args[args.index("--speculative-config") + 1]) == kwargs["speculative_config"]
    assert "--enable-prefix-caching" in args and args[args.index("--max-num-batched-tokens") + 1] == "64"
    assert kwargs["load_format"] == "k3_fan_in" and kwargs["limit_mm_per_prompt"] == {"image": 0}
    assert "num_gpu_blocks_override" not in kwargs and "--num-gpu-blocks-override" not in args


def test_num_gpu_blocks_override_reaches_engine_and_server(tmp_path):
    cfg = EngineConfig(model_dir=str(tmp_path), num_gpu_blocks_override=200)
    args = server_args(cfg)
    assert engine_kwargs(cfg)["num_gpu_blocks_override"] == 200
    assert args[args.index("--num-gpu-blocks-override") + 1] == "200"


def test_every_cpu_host_runs_cpu_mla(tmp_path):
    """S24: asked for explicitly, so a host with AMX does not switch to AMX_MLA (no float32 kernels)."""
    cfg = EngineConfig(model_dir=str(tmp_path))
    args = server_args(cfg)
    assert engine_kwargs(cfg)["attention_backend"] == "CPU_MLA"
    mtp = EngineConfig(model_dir=str(tmp_path), num_speculative_tokens=1)
    assert engine_kwargs(mtp)["speculative_config"]["attention_backend"] == "CPU_MLA", "the draft picks its own"
    assert args[args.index("--attention-backend") + 1] == "CPU_MLA"
    all_kda = EngineConfig(model_dir=str(tmp_path), model=ModelConfig(kda_layers=[1, 2, 3, 4]))
    assert "attention_backend" not in engine_kwargs(all_kda)


def test_tensor_parallel_size_reaches_engine_and_server(tmp_path):
    cfg = EngineConfig(model_dir=str(tmp_path), tensor_parallel_size=2)
    args = server_args(cfg)
    assert engine_kwargs(cfg)["tensor_parallel_size"] == 2
    assert args[args.index("--tensor-parallel-size") + 1] == "2"
    assert "tensor_parallel_size" not in engine_kwargs(EngineConfig(model_dir=str(tmp_path)))


def test_data_parallel_size_reaches_engine_and_server(tmp_path):
    cfg = EngineConfig(model_dir=str(tmp_path), data_parallel_size=2, toggles={"draft_length": {"mode": "off"}})
    args = server_args(cfg)
    assert engine_kwargs(cfg)["data_parallel_size"] == 2
    assert args[args.index("--data-parallel-size") + 1] == "2"
    assert "data_parallel_size" not in engine_kwargs(EngineConfig(model_dir=str(tmp_path)))


def test_draft_length_on_is_refused_above_data_parallel_size_1(tmp_path):
    """vLLM 0.32 drops the per-batch-size K at data_parallel_size > 1: the cell would silently run a fixed K."""
    with pytest.raises(ValueError, match=r"EngineConfig.data_parallel_size: invalid value 2; valid: 1 with "
                                         r"draft_length=on: vLLM 0.32 drops num_speculative_tokens_per_batch_size"):
        EngineConfig(model_dir=str(tmp_path), data_parallel_size=2, toggles={"draft_length": {"mode": "on"}})
    assert EngineConfig(model_dir=str(tmp_path), data_parallel_size=1, toggles={"draft_length": {"mode": "on"}})


def test_the_draft_length_toggle_sets_the_speculative_config(tmp_path):
    cfg = EngineConfig(model_dir=str(tmp_path), toggles={"draft_length": {"mode": "off", "k": 4}})
    spec = engine_kwargs(cfg)["speculative_config"]
    assert (spec["method"], spec["num_speculative_tokens"], spec["rejection_sample_method"]) == ("mtp", 4, "synthetic")
    assert json.loads(server_args(cfg)[server_args(cfg).index("--speculative-config") + 1]) == spec
    assert "speculative_config" not in engine_kwargs(EngineConfig(model_dir=str(tmp_path),
                                                                  toggles={"draft_length": {"mode": "k0"}}))


def test_cpu_ranks_get_their_own_cores():
    assert rank_cores(2, [0, 1]) == "0|1" and rank_cores(2, [0, 1, 2, 3]) == "0,1|2,3"
    with pytest.raises(ValueError, match=r"EngineConfig.tensor_parallel_size: invalid value 4; .* has 2"):
        rank_cores(4, [0, 1])


def _server_parser():
    with contextlib.suppress(RuntimeError):
        hide_media_wheels()
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    return make_arg_parser(FlexibleArgumentParser()), AsyncEngineArgs


@pytest.mark.parametrize("platform", ["cpu", "rocm", "cuda"])
def test_every_server_argument_of_every_toggle_mode_parses_with_vllms_own_parser(tmp_path, platform):
    """What a serving cell (or a GPU user's command) passes to `vllm.entrypoints.openai.api_server`, for each
    mode of each toggle on each platform, parsed by the server's own parser into the engine's arguments."""
    parser, engine_args = _server_parser()
    checked, refused = 0, []
    for name, opt in OPTIMIZATIONS.items():
        for mode in opt.config_cls.MODES:
            extra = {"tensor_parallel_size": 2} if name == "moe_dedup" else {}
            try:
                cfg = EngineConfig(model_dir=str(tmp_path), platform=platform, toggles={name: {"mode": mode}},
                                   **extra)
            except ValueError as err:    # a mode this platform does not wire: refused, naming it
                assert name in str(err) and platform in str(err), err
                refused.append(f"{name}={mode}")
                continue
            args = server_args(cfg)
            parsed = parser.parse_args(args)
            engine = engine_args.from_cli_args(parsed)
            kwargs = engine_kwargs(cfg)
            assert (engine.model, engine.max_model_len, engine.seed) == (
                str(tmp_path), kwargs["max_model_len"], kwargs["seed"]), (name, mode)
            assert engine.speculative_config == kwargs.get("speculative_config"), (name, mode)
            assert engine.additional_config == kwargs.get("additional_config", {}), (name, mode)
            assert engine.tensor_parallel_size == kwargs.get("tensor_parallel_size", 1), (name, mode)
            checked += 1
    assert checked + len(refused) == sum(len(o.config_cls.MODES) for o in OPTIMIZATIONS.values())
    assert checked >= len(OPTIMIZATIONS) + 4, refused
