"""Run the tiny K3 model on vLLM(-CPU) with one command.

    python -m ablations.backends.vllm generate [--prompt TEXT | --token-ids 5,6,7] [--max-tokens N] [--mtp K]
    python -m ablations.backends.vllm serve [--port 8000] [--log FILE] [--mtp K]
    python -m ablations.backends.vllm report [--requests 16] [--max-tokens 16]
    python -m ablations.backends.vllm model [--dir DIR]
    python -m ablations.backends.vllm patches [opts/kda_overlap=on ...] [--platform cpu|rocm|cuda]
    python -m ablations.backends.vllm node-check [--out DIR]      # on a GPU node: every wired toggle mode, checked

The model directory is written on first use (~/.cache/k3-ablate/models, or K3_ABLATE_MODEL_DIR).
`--set field=value` changes a ModelConfig field (e.g. --set dtype=bfloat16 --set kda_layers=[1,2,3]).
The server's log goes to outputs/vllm/vllm_server.log unless --log says otherwise.
Bad options end with one line `error: ...` and exit code 2, before any engine starts.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import sys
import time
from pathlib import Path

from ablations.backends.vllm.config import ModelConfig
from ablations.backends.vllm.launch.engine import EngineConfig
from opts.cli import int_at_least
from opts.vllm_setting import PLATFORMS

DEFAULT_LOG = Path("outputs") / "vllm" / "vllm_server.log"
ENGINE_FIELD_OPTIONS = {
    "num_speculative_tokens": "--mtp",
    "spec_method": "--mtp",
    "max_model_len": "--max-model-len",
}


class UsageError(Exception):
    """A bad command-line value; `main` prints it as one `error: ...` line and returns 2."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str):
        raise UsageError(message.removeprefix("argument "))


def port_number(text: str) -> int:
    value = int_at_least(1, "a port in 1..65535")(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port in 1..65535")
    return value


def token_id_list(text: str) -> list[int]:
    parts = text.split(",")
    if not all(re.fullmatch(r"\s*\d+\s*", p) for p in parts):
        raise argparse.ArgumentTypeError(f"invalid value {text!r}; valid: comma-separated token ids, e.g. 5,6,7")
    return [int(p) for p in parts]


def setting(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"invalid value {text!r}; valid: FIELD=VALUE, e.g. dtype=bfloat16")
    return name, value


def parse_value(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def model_config(settings: list[tuple[str, str]]) -> ModelConfig:
    """The ModelConfig with every `--set` applied; UsageError names the offending settings."""
    try:
        return ModelConfig.from_dict({name: parse_value(value) for name, value in settings})
    except ValueError as err:
        named = [f"{n}={v}" for n, v in settings if re.search(rf"\b{re.escape(n)}\b", str(err))]
        shown = named or [f"{n}={v}" for n, v in settings]
        raise UsageError(f"--set {' '.join(shown)}: {err}") from None


def engine_config(args: argparse.Namespace, skip_tokenizer_init: bool = False) -> EngineConfig:
    """The engine the options describe; UsageError names the option behind an invalid combination."""
    if args.dir and Path(args.dir).exists() and not Path(args.dir).is_dir():
        raise UsageError(f"--dir {args.dir}: invalid value; valid: a directory (this is a file)")
    model = model_config(args.set)
    try:
        return EngineConfig(
            model=model,
            model_dir=args.dir,
            enable_prefix_caching=not args.no_prefix_caching,
            num_speculative_tokens=args.mtp,
            max_model_len=args.max_model_len,
            skip_tokenizer_init=skip_tokenizer_init,
        )
    except ValueError as err:
        option = next((o for f, o in ENGINE_FIELD_OPTIONS.items() if f"EngineConfig.{f}:" in str(err)), "")
        value = getattr(args, option.removeprefix("--").replace("-", "_"), None) if option else None
        raise UsageError(f"{option} {value}: {err}" if option else str(err)) from None


def check_prompt(cfg: EngineConfig, token_ids: list[int] | None, text: str, max_tokens: int) -> None:
    """Token ids inside the vocabulary, prompt + output within --max-model-len (before any engine starts)."""
    vocab = cfg.model.vocab_size
    if token_ids is not None:
        bad = [t for t in token_ids if t >= vocab]
        if bad:
            raise UsageError(f"--token-ids {','.join(map(str, token_ids))}: ids {bad} are outside the vocabulary; "
                             f"valid: 0..{vocab - 1} (vocab_size {vocab})")
        length, option = len(token_ids), "--token-ids"
    else:
        from ablations.backends.vllm.launch.tiny_model import prompt_length

        length, option = prompt_length(cfg.ensure_model_dir(), text), "--prompt"
    if length + max_tokens > cfg.max_model_len:
        raise UsageError(f"{option}: {length} prompt tokens + --max-tokens {max_tokens} exceed --max-model-len "
                         f"{cfg.max_model_len}; valid: at most {cfg.max_model_len} together")


def check_port_free(port: int) -> None:
    from ablations.backends.vllm.launch.server import HOST

    with socket.socket() as s:
        try:
            s.bind((HOST, port))
        except OSError as err:
            raise UsageError(f"--port {port}: cannot listen on {HOST}:{port} ({err.strerror}); "
                             "valid: a free port") from None


def cmd_model(args: argparse.Namespace) -> int:
    print(engine_config(args).ensure_model_dir())
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    from ablations.backends.vllm.launch.engine import open_llm

    token_ids = args.token_ids
    cfg = engine_config(args, skip_tokenizer_init=token_ids is not None)
    check_prompt(cfg, token_ids, args.prompt, args.max_tokens)
    t0 = time.perf_counter()
    with open_llm(cfg) as llm:
        started = time.perf_counter() - t0
        from vllm import SamplingParams

        params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True,
                                detokenize=token_ids is None)
        prompt = {"prompt_token_ids": token_ids} if token_ids is not None else args.prompt
        t1 = time.perf_counter()
        out = llm.generate([prompt], params, use_tqdm=False)[0].outputs[0]
        took = time.perf_counter() - t1
    print(f"model dir: {cfg.resolved_model_dir()}")
    print(f"engine start {started:.1f} s, {len(out.token_ids)} tokens in {took:.2f} s")
    print("token ids:", list(out.token_ids))
    if token_ids is None:
        print("text:", repr(out.text))
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from ablations.backends.vllm.launch.server import start_server

    cfg = engine_config(args)
    log = Path(args.log).resolve()
    if log.is_dir():
        raise UsageError(f"--log {args.log}: invalid value; valid: a file path (this is a directory)")
    check_port_free(args.port)
    print(f"starting vLLM's OpenAI server (log: {log}) ...", flush=True)
    try:
        server = start_server(cfg, log, port=args.port)
    except RuntimeError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(f"ready at {server.url}  model={server.model}")
    print(f"  curl {server.url}/v1/completions -H 'Content-Type: application/json' "
          f"-d '{{\"model\": \"{server.model}\", \"prompt\": \"Hello\", \"max_tokens\": 8}}'")
    print("Ctrl-C stops it.", flush=True)
    stop = []
    for sig in (signal.SIGINT, signal.SIGTERM):  # explicit: a background job starts with SIGINT ignored
        signal.signal(sig, lambda *_: stop.append(1))
    while server.is_running() and not stop:
        time.sleep(0.5)
    code = server.stop()
    print(f"server stopped (exit code {code}); log kept at {log}", flush=True)
    return 0 if stop else 1


def cmd_report(args: argparse.Namespace) -> int:
    from ablations.backends.vllm.launch.engine import random_prompts, time_engine
    from opts.machine import cpu_isa, cpu_model

    cfg = engine_config(args, skip_tokenizer_init=True)
    vocab = min(1000, cfg.model.vocab_size)
    batches = [random_prompts(args.requests, seed=seed, vocab=vocab) for seed in (0, 1)]
    check_prompt(cfg, max((p for b in batches for p in b), key=len), "", args.max_tokens)
    load = os.getloadavg()[0]
    timing = time_engine(cfg, batches, args.max_tokens)
    print(f"machine: {cpu_model()}, {os.cpu_count()} cores, ISA {cpu_isa()}; "
          f"load average before the run {load:.2f} (other jobs running if well above 0)")
    print(f"engine start: {timing.start_s:.1f} s")
    for label, batch in zip(("first batch", "second batch (new prompts)"), timing.batches, strict=True):
        print(f"{label}: {batch.num_requests} requests x {args.max_tokens} tokens, {batch.prompt_tokens} prompt "
              f"tokens: {batch.seconds:.2f} s, {batch.output_tokens_per_s:.1f} output tokens/s, "
              f"{batch.tokens_per_s:.0f} prompt+output tokens/s")
    return 0


def toggle_overrides(items: list[str]) -> dict[str, dict]:
    """`opts/<name>=<mode>` and `opts.<name>.<field>=<value>` (the Hydra app's spelling) as a toggle vector."""
    from opts.registry import names

    vector: dict[str, dict] = {}
    for item in items:
        key, sep, value = item.partition("=")
        group, _, name = key.partition("/")
        if sep and group == "opts" and name and "." not in name:
            vector.setdefault(name, {})["mode"] = value
            continue
        parts = key.split(".")
        if sep and len(parts) == 3 and parts[0] == "opts":
            vector.setdefault(parts[1], {})[parts[2]] = parse_value(value)
            continue
        raise UsageError(f"{item!r}: invalid toggle override; valid: opts/<name>=<mode> or "
                         f"opts.<name>.<field>=<value>, names: {', '.join(names())}")
    return vector


def cmd_patches(args: argparse.Namespace) -> int:
    from ablations.backends.vllm.in_vllm.cpu import PATCHES
    from ablations.backends.vllm.in_vllm.plugin import SHUTDOWN_PATCHES
    from ablations.backends.vllm.in_vllm.steps import STEP_PATCHES
    from ablations.backends.vllm.in_vllm.toggles import SCHEDULER_PATCH, WORKER_PATCH, toggle_patches
    from opts.registry import parse_vector

    try:
        vector = parse_vector(toggle_overrides(args.overrides), "toggles")
        toggled = toggle_patches(vector, args.platform)
    except ValueError as err:
        raise UsageError(str(err)) from None
    fixes = PATCHES if args.platform == "cpu" else []
    rows = [(patch.target, patch.why + (f" [counted: {patch.counter}]" if patch.counter else ""))
            for patch in [*SHUTDOWN_PATCHES, *fixes, *STEP_PATCHES, SCHEDULER_PATCH, WORKER_PATCH, *toggled]]
    shown = ", ".join(f"{name}={config.mode}" for name, config in vector.items()) or "none"
    print(f"{len(rows)} patches on {args.platform} with toggles {shown}: "
          f"{len(SHUTDOWN_PATCHES)} on every platform, {len(fixes)} CPU fixes, {len(STEP_PATCHES)} step records, "
          "the toggle hooks, "
          f"{len(toggled)} from the toggles, installed where a worker or a scheduler is built (target -> why):")
    width = max(len(target) for target, _ in rows)
    for target, why in rows:
        print(f"{target:<{width}}  {why}")
    return 0


def cmd_node_check(args: argparse.Namespace) -> int:
    from ablations.backends.vllm.cells.node_check import node_check, refusal

    why = refusal()
    if why is not None:
        print(f"error: {why}", file=sys.stderr)
        return 2
    return node_check(Path(args.out))


def build_parser() -> Parser:
    parser = Parser(prog="python -m ablations.backends.vllm", description=__doc__,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, func, help_text in (
        ("model", cmd_model, "write the tiny model directory and print its path"),
        ("generate", cmd_generate, "greedy-generate offline with vllm.LLM"),
        ("serve", cmd_serve, "run vLLM's OpenAI server on 127.0.0.1 until Ctrl-C"),
        ("report", cmd_report, "time engine start and one batch of requests; print them with the CPU and ISA"),
    ):
        p = sub.add_parser(name, help=help_text)
        p.set_defaults(func=func)
        p.add_argument("--set", action="append", default=[], type=setting, metavar="FIELD=VALUE",
                       help="ModelConfig override")
        p.add_argument("--dir", default="", help="model directory (default: the cache)")
        p.add_argument("--mtp", type=int_at_least(0, "0 (off) or a positive integer"), default=0, metavar="K",
                       help="MTP draft tokens per step (0: off)")
        p.add_argument("--no-prefix-caching", action="store_true")
        p.add_argument("--max-model-len", type=int_at_least(1, "a positive integer"), default=2048)
    gen = sub.choices["generate"]
    gen.add_argument("--prompt", default="Kimi K3 runs on vLLM-CPU.")
    gen.add_argument("--token-ids", type=token_id_list, default=None, help="comma-separated prompt token ids")
    gen.add_argument("--max-tokens", type=int_at_least(1, "a positive integer"), default=32)
    serve = sub.choices["serve"]
    serve.add_argument("--port", type=port_number, default=8000)
    serve.add_argument("--log", default=str(DEFAULT_LOG), help=f"server log (default: {DEFAULT_LOG})")
    patches = sub.add_parser("patches", help="list the patches the plugin installs for a toggle vector: target -> why")
    patches.set_defaults(func=cmd_patches)
    patches.add_argument("overrides", nargs="*", metavar="OVERRIDE",
                         help="toggle overrides: opts/<name>=<mode>, opts.<name>.<field>=<value>")
    patches.add_argument("--platform", choices=PLATFORMS, default="cpu")
    check = sub.add_parser("node-check", help="on a GPU node: run every toggle mode its platform wires on the tiny "
                           "K3 and check routes, greedy tokens and the vector in every process")
    check.set_defaults(func=cmd_node_check)
    check.add_argument("--out", default=str(Path("outputs") / "node_check"),
                       help="where each engine's processes write their counts and patch records")
    report = sub.choices["report"]
    report.add_argument("--requests", type=int_at_least(1, "a positive integer"), default=16)
    report.add_argument("--max-tokens", type=int_at_least(1, "a positive integer"), default=16)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command; a bad option prints one `error: ...` line and returns 2."""
    try:
        args = build_parser().parse_args(argv)
        return args.func(args)
    except UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
