"""The node self-check, `python -m ablations.backends.vllm node-check`: on a GPU node, every mode of every toggle
its platform wires, on the tiny K3 (built from its config, as on the CPU), one engine per mode.

Each mode's engine sets that toggle on top of the platform's stock vector (every toggle with a stock mode there,
at it) and greedy-generates the same prompts as the stock engine. A mode passes when
- its counted routes fired (`cell.fired`: every counter of its setting's patches called, those the engine never
  runs by design, `Patch.idle_with`, left out),
- its greedy tokens equal the stock engine's,
- every vLLM process of the engine that read a toggle vector read this cell's and installed its setting's patches.
One line per mode, then a summary; the exit code is 1 when a mode fails. A mode the platform does not wire is
listed with the reason and not run. On a machine without a GPU it refuses: the CPU's modes are what the e2e
tests check (`make test`). It has not been run on a GPU node from this repository's machines.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ablations.backends.vllm.cells.cell import fired, not_fired
from ablations.backends.vllm.config import ModelConfig
from ablations.backends.vllm.in_vllm.counters import counting_into, read_counts, wait_flushed
from ablations.backends.vllm.in_vllm.toggles import read_records
from ablations.backends.vllm.launch.engine import EngineConfig, open_llm, random_prompts
from ablations.backends.vllm.launch.runtime import hide_media_wheels
from opts.registry import OPTIMIZATIONS, make_config

NUM_PROMPTS, MAX_TOKENS = 8, 16
SMALL_BUDGET = 64       # tokens per step: prefill chunks beside decodes (and verification rows, with MTP)
NUM_SPEC_TOKENS = 2
# toggles whose modes act only beside speculative decoding: their engines run MTP
NEEDS_MTP = ("kda_overlap",)
# fields a mode is checked with besides its mode: real rejection sampling, so greedy tokens must match stock
CHECK_FIELDS = {"draft_length": {"sampling": "standard"}}


@dataclass(frozen=True)
class ModeCheck:
    """One toggle mode to check: the engine that runs it and the stock engine its tokens are compared with."""

    toggle: str
    mode: str
    engine: EngineConfig
    stock: EngineConfig


@dataclass
class ModeResult:
    """What one mode's engine did: the problems found (none: it passed), its time."""

    toggle: str
    mode: str
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.problems

    def line(self) -> str:
        verdict = "ok" if self.ok else "FAILED: " + "; ".join(self.problems)
        return f"{self.toggle}={self.mode}: {verdict} ({self.seconds:.0f} s)"


def gpu_platform() -> str | None:
    """"rocm" or "cuda" when torch sees a GPU here, else None."""
    import torch

    if not torch.cuda.is_available():
        return None
    return "rocm" if torch.version.hip else "cuda"


def refusal() -> str | None:
    """Why node-check cannot run here, or None on a GPU node."""
    if gpu_platform() is None:
        return ("node-check runs on a GPU node (ROCm or CUDA) and torch sees no GPU here; on a CPU the e2e tests "
                "check the CPU's modes (make test)")
    return None


def stock_vector(platform: str) -> dict[str, dict[str, str]]:
    """Every toggle with a stock mode on `platform`, at it: a vector that sets nothing."""
    return {name: {"mode": opt.stock_modes[platform]} for name, opt in OPTIMIZATIONS.items()
            if platform in opt.stock_modes}


def base_engine(toggle: str, platform: str, model: ModelConfig) -> EngineConfig:
    """The stock engine a toggle's modes are set on: the tiny K3, prefix caching and a small token budget (steps
    that mix prefill chunks with decodes), MTP for a toggle that acts only beside it."""
    spec = NUM_SPEC_TOKENS if toggle in NEEDS_MTP else 0
    return EngineConfig(model=model, platform=platform, skip_tokenizer_init=True, enable_prefix_caching=True,
                        max_num_batched_tokens=SMALL_BUDGET, num_speculative_tokens=spec,
                        toggles=stock_vector(platform))


def mode_checks(platform: str, model: ModelConfig) -> tuple[list[ModeCheck], list[str]]:
    """The modes `platform` wires (each with its engine and stock engine), and one line per mode it does not
    wire, with the reason."""
    checks, skipped = [], []
    for name, opt in OPTIMIZATIONS.items():
        stock = base_engine(name, platform, model)
        for mode in opt.config_cls.MODES:
            fields = {"mode": mode, **CHECK_FIELDS.get(name, {})}
            try:
                opt.vllm_setting(make_config(name, **fields), platform)
            except ValueError as err:
                skipped.append(f"{name}={mode}: not wired on {platform} ({err})")
                continue
            checks.append(ModeCheck(name, mode, replace(stock, toggles={**stock.toggles, name: fields}), stock))
    return checks, skipped


@dataclass
class EngineRun:
    """One engine's greedy tokens, the kernel calls counted in its processes, and their patch records."""

    tokens: list[list[int]]
    counts: dict[str, int]
    records: list[dict[str, Any]]
    seconds: float


def run_engine(cfg: EngineConfig, prompts: list[list[int]], directory: Path, max_tokens: int = MAX_TOKENS
               ) -> EngineRun:
    """Start `cfg`'s engine (its processes writing counts and records into `directory`), greedy-generate
    `prompts`, stop it."""
    hide_media_wheels()
    from vllm import SamplingParams

    t0 = time.perf_counter()
    with counting_into(directory), open_llm(cfg) as llm:
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, detokenize=False)
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        wait_flushed()
    tokens = [list(out.outputs[0].token_ids) for out in outputs]
    return EngineRun(tokens, read_counts(directory), read_records(directory), time.perf_counter() - t0)


def judge(check: ModeCheck, run: EngineRun, stock_tokens: list[list[int]]) -> list[str]:
    """The problems of `check`'s engine run: routes that never fired, greedy tokens unlike stock's, processes
    that did not read the cell's vector or install its patches."""
    problems = not_fired({check.toggle: fired(check.engine, run.counts)[check.toggle]})
    differ = [i for i, (a, b) in enumerate(zip(run.tokens, stock_tokens, strict=True)) if a != b]
    if differ:
        i = differ[0]
        at = next((j for j, (a, b) in enumerate(zip(run.tokens[i], stock_tokens[i], strict=False)) if a != b), 0)
        problems.append(f"greedy tokens differ from stock in {len(differ)} of {len(stock_tokens)} prompts (first: "
                        f"prompt {i}, token {at})")
    readers = [r for r in run.records if r.get("toggles")]
    if not readers:
        problems.append("no vLLM process recorded a toggle vector")
    targets = {p.target for p in check.engine.settings()[check.toggle].patches}
    for record in readers:
        mode = (record["toggles"].get(check.toggle) or {}).get("mode")
        if mode != check.mode:
            problems.append(f"process {record.get('pid')} read {check.toggle}={mode}")
        missing = targets - {p["target"] for p in record.get("patches", [])}
        if missing:
            problems.append(f"process {record.get('pid')} did not install {', '.join(sorted(missing))}")
    return problems


def run_checks(checks: list[ModeCheck], out_dir: Path, num_prompts: int = NUM_PROMPTS,
               report: Callable[[str], None] = print) -> list[ModeResult]:
    """Run every check (the stock engines once each), reporting one line per mode as it finishes."""
    prompts = random_prompts(num_prompts, seed=0)
    stock_runs: list[tuple[EngineConfig, EngineRun]] = []      # EngineConfig holds dicts: compared, not hashed
    results = []
    for k, check in enumerate(checks):
        stock = next((run for cfg, run in stock_runs if cfg == check.stock), None)
        if stock is None:
            stock = run_engine(check.stock, prompts, out_dir / f"stock_{len(stock_runs)}")
            stock_runs.append((check.stock, stock))
        run = run_engine(check.engine, prompts, out_dir / f"{k:02d}_{check.toggle}_{check.mode}")
        result = ModeResult(check.toggle, check.mode, judge(check, run, stock.tokens), run.seconds)
        report(f"[{k + 1}/{len(checks)}] {result.line()}")
        results.append(result)
    return results


def summary(results: list[ModeResult], skipped: list[str]) -> str:
    """The last line: modes passed, failed, not wired."""
    failed = [f"{r.toggle}={r.mode}" for r in results if not r.ok]
    return (f"node-check: {len(results) - len(failed)} of {len(results)} modes passed"
            + (f"; failed: {', '.join(failed)}" if failed else "") + f"; {len(skipped)} not wired here")


def node_check(out_dir: Path, model: ModelConfig | None = None, report: Callable[[str], None] = print) -> int:
    """Check every wired mode on this GPU node, reporting a line per mode and the summary; 0 when all pass, 1
    when one fails. Off a GPU, a RuntimeError with the reason (`refusal`)."""
    why = refusal()
    if why is not None:
        raise RuntimeError(why)
    platform = gpu_platform()
    # bf16: the dtype the GPU kernels the toggles switch take (ROCm's fused KDA decode needs it)
    checks, skipped = mode_checks(platform, model or ModelConfig(dtype="bfloat16"))
    for line in skipped:
        report(line)
    results = run_checks(checks, out_dir, report=report)
    report(summary(results, skipped))
    return 0 if all(r.ok for r in results) else 1
