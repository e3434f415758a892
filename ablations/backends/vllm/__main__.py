"""Run the tiny K3 model on vLLM(-CPU) with one command.

    python -m ablations.backends.vllm generate [--prompt TEXT | --token-ids 5,6,7] [--max-tokens N] [--mtp K]
    python -m ablations.backends.vllm serve [--port 8000] [--log vllm_server.log] [--mtp K]
    python -m ablations.backends.vllm model [--dir DIR]

The model directory is written on first use (~/.cache/k3-ablate/models, or K3_ABLATE_MODEL_DIR).
`--set field=value` changes a ModelConfig field (e.g. --set dtype=bfloat16 --set kda_layers=[1,2,3]).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path

from ablations.backends.vllm.config import ModelConfig
from ablations.backends.vllm.engine import EngineConfig


def parse_value(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def model_config(settings: list[str]) -> ModelConfig:
    values = {}
    for item in settings:
        name, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--set {item!r}: expected field=value")
        values[name] = parse_value(value)
    return ModelConfig.from_dict(values)


def engine_config(args: argparse.Namespace, skip_tokenizer_init: bool = False) -> EngineConfig:
    return EngineConfig(
        model=model_config(args.set),
        model_dir=args.dir or "",
        enable_prefix_caching=not args.no_prefix_caching,
        num_speculative_tokens=args.mtp,
        max_model_len=args.max_model_len,
        skip_tokenizer_init=skip_tokenizer_init,
    )


def cmd_model(args: argparse.Namespace) -> int:
    print(engine_config(args).ensure_model_dir())
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    from ablations.backends.vllm.engine import open_llm

    token_ids = [int(t) for t in args.token_ids.split(",")] if args.token_ids else None
    cfg = engine_config(args, skip_tokenizer_init=token_ids is not None)
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
    from ablations.backends.vllm.server import start_server

    cfg = engine_config(args)
    print(f"starting vLLM's OpenAI server (log: {args.log}) ...", flush=True)
    server = start_server(cfg, args.log, port=args.port)
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
    print(f"server stopped (exit code {code}); log kept at {Path(args.log).resolve()}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m ablations.backends.vllm", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, func, help_text in (
        ("model", cmd_model, "write the tiny model directory and print its path"),
        ("generate", cmd_generate, "greedy-generate offline with vllm.LLM"),
        ("serve", cmd_serve, "run vLLM's OpenAI server on 127.0.0.1 until Ctrl-C"),
    ):
        p = sub.add_parser(name, help=help_text)
        p.set_defaults(func=func)
        p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="ModelConfig override")
        p.add_argument("--dir", default="", help="model directory (default: the cache)")
        p.add_argument("--mtp", type=int, default=0, metavar="K", help="MTP draft tokens per step (0: off)")
        p.add_argument("--no-prefix-caching", action="store_true")
        p.add_argument("--max-model-len", type=int, default=2048)
    gen = sub.choices["generate"]
    gen.add_argument("--prompt", default="Kimi K3 runs on vLLM-CPU.")
    gen.add_argument("--token-ids", default="", help="comma-separated prompt token ids (no tokenizer)")
    gen.add_argument("--max-tokens", type=int, default=32)
    serve = sub.choices["serve"]
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--log", default="vllm_server.log")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
