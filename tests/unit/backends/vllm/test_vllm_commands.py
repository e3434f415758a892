"""A cell's commands for a GPU node (`backend.print_commands=true`): the server command of every toggle mode each
node's platform wires parses with vLLM 0.32's own server parser into the engine arguments, the clients' with their
own parsers; every toggle's off is a setting on every platform; nothing starts."""

from __future__ import annotations

import contextlib
import json
import shlex
from pathlib import Path

import pytest

from ablations.backends.vllm.cells.commands import COMMANDS_FILE, gpu_commands, node_config, server_command, server_env
from ablations.backends.vllm.config import ModelConfig, VllmBackendConfig
from ablations.backends.vllm.launch.engine import engine_kwargs
from ablations.backends.vllm.launch.runtime import hide_media_wheels
from ablations.config import compose_app
from ablations.hardware import HardwareConfig
from ablations.run import run
from ablations.workload.trace import Request, Trace
from opts.registry import OPTIMIZATIONS

NODES = ["mi355x_x8", "b300_x8", "h200_x8"]
CHECKPOINT = "/models/Kimi-K3"


def node(name: str) -> HardwareConfig:
    return compose_app([f"hardware={name}"]).hardware


@pytest.fixture(scope="module")
def parsers():
    with contextlib.suppress(RuntimeError):
        hide_media_wheels()
    from vllm.benchmarks.serve import add_cli_args
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    bench = FlexibleArgumentParser()
    add_cli_args(bench)
    return make_arg_parser(FlexibleArgumentParser()), AsyncEngineArgs, bench


@pytest.mark.parametrize("hardware", NODES)
def test_every_wired_toggle_mode_prints_a_server_command_vllm_parses(parsers, hardware):
    server_parser, engine_args, _ = parsers
    hw, model = node(hardware), ModelConfig(name="kimi_k3", checkpoint=CHECKPOINT)
    checked, refused = 0, []
    for name, opt in OPTIMIZATIONS.items():
        for mode in opt.config_cls.MODES:
            try:
                cfg = node_config(VllmBackendConfig(), model, hw, {name: {"mode": mode}})
            except ValueError as err:     # a mode this platform does not wire: refused, naming it
                assert name in str(err) and hw.platform in str(err), err
                refused.append(f"{name}={mode}")
                continue
            command = server_command(cfg)
            assert command[:5] == ["python", "-m", "vllm.entrypoints.cli.main", "serve", CHECKPOINT]
            engine = engine_args.from_cli_args(server_parser.parse_args(["--model", CHECKPOINT, *command[5:]]))
            kwargs = engine_kwargs(cfg)
            assert (engine.model, engine.tensor_parallel_size, engine.load_format, engine.enforce_eager) == (
                CHECKPOINT, hw.num_devices, "auto", False), (name, mode)
            assert engine.speculative_config == kwargs.get("speculative_config"), (name, mode)
            assert engine.additional_config == kwargs.get("additional_config", {}), (name, mode)
            env = server_env(cfg)
            assert env["VLLM_SERVER_DEV_MODE"] == "1"
            assert all(env[k] == v for s in cfg.settings().values() for k, v in s.env.items()), (name, mode)
            checked += 1
    assert checked + len(refused) == sum(len(o.config_cls.MODES) for o in OPTIMIZATIONS.values())
    assert checked >= len(OPTIMIZATIONS), refused


def test_every_off_is_a_setting_on_rocm_and_a_mode_it_does_not_wire_is_refused(tmp_path, parsers):
    hw, model = node("mi355x_x8"), ModelConfig(name="kimi_k3", checkpoint=CHECKPOINT)
    trace = Trace(tuple(Request(0, 40, 4, (1, 2, 3), "a", t, 10.0 * t) for t in range(3)), 16, "t")
    toggles = {"fusion": {"mode": "off"}, "aiter_mla": {"mode": "on"}}
    commands = gpu_commands(VllmBackendConfig(concurrencies=[1, 2]), model, hw, toggles, trace, tmp_path)
    assert commands["toggles"]["fusion"]["mode"] == "off" and "stock" not in commands
    assert commands["toggles"]["aiter_mla"]["mode"] == "on" and commands["server_env"]["VLLM_ROCM_USE_AITER"] == "1"
    bench_parser = parsers[2]
    for point in commands["points"]:
        assert point["vllm_bench"][:5] == ["python", "-m", "vllm.entrypoints.cli.main", "bench", "serve"]
        args = bench_parser.parse_args(point["vllm_bench"][5:])
        assert (args.max_concurrency, args.dataset_name, args.num_prompts) == (point["concurrency"], "timed_trace", 3)
        aiperf = point["aiperf"]
        assert aiperf[aiperf.index("--num-sessions") + 1] == "1"
        assert aiperf[aiperf.index("--tokenizer") + 1] == CHECKPOINT
    assert (tmp_path / "aiperf_trace.jsonl").is_file() and (tmp_path / "serve_trace.jsonl").is_file()
    with pytest.raises(ValueError, match=r"moe_dedup=sp on rocm: vLLM's AMD K3 model never passes"):
        node_config(VllmBackendConfig(), model, hw, {"moe_dedup": {"mode": "sp"}})


def test_print_commands_writes_the_script_and_starts_nothing(tmp_path):
    app = compose_app(["backend=vllm", "backend.mode=serve", "backend.client=aiperf", "backend.print_commands=true",
                       "hardware=b300_x8", "model=kimi_k3", f"model.checkpoint={CHECKPOINT}", "workload=agentx_small",
                       "opts/cache_retention=evict"])
    result = run(app, tmp_path)
    lines = (tmp_path / COMMANDS_FILE).read_text().splitlines()
    server = next(line for line in lines if " serve /models/Kimi-K3 " in line)
    assert server.startswith("VLLM_SERVER_DEV_MODE=1 python -m vllm.entrypoints.cli.main serve /models/Kimi-K3 ")
    assert "--tensor-parallel-size 8" in server
    commands = [Path(line.split()[0]).name for line in lines if not line.startswith("#")][1:]
    assert commands == ["until", "curl"] + ["curl", "aiperf"] * 3, "wait, warm up, each point"
    rows = [json.loads(line) for line in (tmp_path / "aiperf_trace.jsonl").read_text().splitlines()]
    warmup = json.loads((tmp_path / "warmup_0.json").read_text())     # the first request, as a cell sends it first
    assert f"-d @{tmp_path / 'warmup_0.json'}" in lines[-7] and "/v1/completions" in lines[-7]
    assert (len(warmup["prompt"]), warmup["max_tokens"], warmup["model"]) == (
        len(rows[0]["payload"]["prompt"]), rows[0]["output_length"], rows[0]["payload"]["model"])
    longest = max(len(r["payload"]["prompt"]) + r["output_length"] for r in rows)
    assert longest <= app.backend.max_prompt_tokens + app.backend.max_tokens <= int(
        shlex.split(server)[shlex.split(server).index("--max-model-len") + 1]), "every request fits the server"
    assert shlex.split(server)[-3:] == ["--port", "8000", "&"]
    assert result["commands"]["platform"] == "cuda" and "cell" not in result and not (tmp_path / "server.log").exists()


def test_a_checkpoint_is_not_run_on_the_cpu(tmp_path):
    app = compose_app(["backend=vllm", "model=kimi_k3", f"model.checkpoint={CHECKPOINT}", "workload=agentx_small"])
    with pytest.raises(ValueError, match=r"model.checkpoint: '/models/Kimi-K3' is a full-size model"):
        run(app, tmp_path)


def test_hardware_figures_need_their_source():
    with pytest.raises(ValueError, match=r"hardware x: peak_bf16_tflops = 100 has no source"):
        HardwareConfig(name="x", platform="cuda", peak_bf16_tflops=100)
    with pytest.raises(ValueError, match=r"hardware x: platform: invalid value 'tpu'"):
        HardwareConfig(name="x", platform="tpu")
    with pytest.raises(ValueError, match=r"hardware x: sources: flops is not a figure"):
        HardwareConfig(name="x", sources={"flops": "somewhere"})
    assert all(node(n).sources for n in NODES)
