"""Microbenchmark harness: off and on timed side by side, interleaved, on identical inputs."""

from __future__ import annotations

import gc
import json
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from opts.base import BenchCase, BenchPair, Optimization


def default_device() -> str:
    """"cuda" when a GPU (CUDA or ROCm) is visible, else "cpu"."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def device_name(device: str) -> str:
    """A readable name of the device, for results."""
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    return f"cpu: {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _timed(fn: Callable[[], Any], device: str) -> float:
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start


def compare(pair: BenchPair, device: str, *, budget_s: float = 1.0, min_rounds: int = 3,
            max_rounds: int = 200) -> tuple[float, float]:
    """Median seconds per call of (off, on), alternating the two so drift hits both alike."""
    pair.off()
    pair.on()
    off_times: list[float] = []
    on_times: list[float] = []
    deadline = time.perf_counter() + budget_s
    while len(off_times) < max_rounds and (len(off_times) < min_rounds or time.perf_counter() < deadline):
        if len(off_times) % 2:
            on_times.append(_timed(pair.on, device))
            off_times.append(_timed(pair.off, device))
        else:
            off_times.append(_timed(pair.off, device))
            on_times.append(_timed(pair.on, device))
    return statistics.median(off_times), statistics.median(on_times)


def copy_bandwidth(device: str, nbytes: int = 256 << 20, rounds: int = 5) -> float:
    """Bytes per second that `dst.copy_(src)` moves (bytes read + bytes written), best of `rounds`."""
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = min(_timed(lambda: dst.copy_(src), device) for _ in range(rounds))
    return 2 * nbytes / best


def run_case(case: BenchCase, device: str, copy_bw: float, budget_s: float) -> dict[str, Any]:
    """Time one case and return its result row."""
    pair = case.setup()
    off_s, on_s = compare(pair, device, budget_s=budget_s)
    del pair
    gc.collect()
    return {
        "case": case.name,
        "off_s": off_s,
        "on_s": on_s,
        "ratio": off_s / on_s,
        "bytes": case.bytes,
        "flops": case.flops,
        "off_GBps": case.bytes / off_s / 1e9,
        "on_GBps": case.bytes / on_s / 1e9,
        "copy_GBps": copy_bw / 1e9,
        "off_frac_of_copy_bw": case.bytes / off_s / copy_bw,
        "on_frac_of_copy_bw": case.bytes / on_s / copy_bw,
        "device": device_name(device),
        **case.info,
    }


def run(opt: Optimization, *, quick: bool = False, device: str | None = None, only: str | None = None,
        budget_s: float = 1.0, progress: Callable[[str], None] | None = print) -> dict[str, Any]:
    """Run an optimization's microbenchmarks; `only` keeps the case named so, else those whose name contains it."""
    device = device or default_device()
    cases = opt.bench_cases(quick, device)
    if only is not None:
        names = [c.name for c in cases]
        cases = [c for c in cases if c.name == only] or [c for c in cases if only in c.name]
        if not cases:
            raise ValueError(f"{opt.name}: no benchmark case matches {only!r}; cases: {', '.join(names)}")
    copy_bw = copy_bandwidth(device)
    if progress:
        progress(f"{opt.name} on {device_name(device)}: copy bandwidth {copy_bw / 1e9:.1f} GB/s, "
                 f"{len(cases)} cases")
    rows = []
    for i, case in enumerate(cases, 1):
        rows.append(run_case(case, device, copy_bw, budget_s))
        if progress:
            progress(f"[{i}/{len(cases)}] {format_row(rows[-1])}")
    return {
        "optimization": opt.name,
        "device": device_name(device),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "quick": quick,
        "copy_GBps": copy_bw / 1e9,
        "cases": rows,
    }


def format_row(row: dict[str, Any]) -> str:
    return (f"{row['case']:<40} off {row['off_s'] * 1e3:9.3f} ms  on {row['on_s'] * 1e3:9.3f} ms  "
            f"x{row['ratio']:.2f}  on {row['on_GBps']:7.2f} GB/s ({row['on_frac_of_copy_bw']:.0%} of copy bw)")


def write_json(result: dict[str, Any], path: str | Path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(result, indent=2) + "\n")
