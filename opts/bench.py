"""Microbenchmark harness: off and on checked against each other, then timed side by side, interleaved."""

from __future__ import annotations

import dataclasses
import gc
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from opts.base import BenchCase, BenchPair, Optimization
from opts.machine import cpu_isa, cpu_model


def default_device() -> str:
    """"cuda" when a GPU (CUDA or ROCm) is visible, else "cpu"."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def check_device(device: str) -> str:
    """`device` if this machine has it, else a ValueError naming the devices it has."""
    valid = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    kind = device.split(":", 1)[0]
    if kind not in ("cpu", "cuda"):
        raise ValueError(f"--device: invalid value {device!r}; valid choices here: {', '.join(valid)}")
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device: {device!r} but no CUDA or ROCm device is visible; valid choices here: "
                         f"{', '.join(valid)}")
    return device


def device_name(device: str) -> str:
    """A readable name of the device, for results: the GPU's name, or the CPU's model, ISA and threads."""
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    return f"cpu: {cpu_model()} ({cpu_isa()}), {torch.get_num_threads()} threads"


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def output_tensors(out: Any) -> list[tuple[str, torch.Tensor]]:
    """The tensors in a path's return value, named: a tensor, a tuple/list of them, or an object's tensor fields."""
    if out is None:
        return []
    if isinstance(out, torch.Tensor):
        return [("out", out)]
    if isinstance(out, tuple | list):
        return [(f"[{i}]{'' if name == 'out' else '.' + name}", t)
                for i, item in enumerate(out) for name, t in output_tensors(item)]
    if dataclasses.is_dataclass(out):
        items = [(f.name, getattr(out, f.name)) for f in dataclasses.fields(out)]
    else:
        items = sorted(vars(out).items())
    return [(name, value) for name, value in items if isinstance(value, torch.Tensor)]


def check_outputs(case: BenchCase, off_out: Any, on_out: Any) -> float:
    """Assert on's outputs equal off's within the case's tolerance; returns the largest absolute difference."""
    off_t, on_t = output_tensors(off_out), output_tensors(on_out)
    if [n for n, _ in off_t] != [n for n, _ in on_t] or not off_t:
        raise AssertionError(f"{case.name}: off returned {[n for n, _ in off_t]}, on returned "
                             f"{[n for n, _ in on_t]}; both must return the same, non-empty outputs")
    worst = 0.0
    for (name, off), (_, on) in zip(off_t, on_t, strict=True):
        torch.testing.assert_close(on, off, atol=case.atol, rtol=case.rtol, equal_nan=False,
                                   msg=lambda m, name=name: f"{case.name}: on != off in {name}: {m}")
        if off.numel():
            worst = max(worst, (on.double() - off.double()).abs().max().item())
    return worst


@dataclass(frozen=True)
class Timing:
    """Interleaved timings of one pair: seconds per call of each side, and the off/on ratio of each round."""

    off_s: list[float]
    on_s: list[float]

    @property
    def off_median_s(self) -> float:
        return statistics.median(self.off_s)

    @property
    def on_median_s(self) -> float:
        return statistics.median(self.on_s)

    @property
    def ratio(self) -> float:
        """Median over rounds of off/on, each round's two calls sharing that moment's load."""
        return statistics.median(a / b for a, b in zip(self.off_s, self.on_s, strict=True))


def _timed(fn: Callable[[], Any], device: str) -> float:
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start


class Rounds:
    """One call = one round of a pair: off then on, or on then off (flipped every round, so drift hits both
    alike); keeps each side's seconds. The one off/on timing loop of the project (`compare`, the benchmarks)."""

    def __init__(self, pair: BenchPair, device: str) -> None:
        self.pair, self.device = pair, device
        self.off_s: list[float] = []
        self.on_s: list[float] = []

    def __call__(self) -> None:
        if len(self.off_s) % 2:
            self.on_s.append(_timed(self.pair.on, self.device))
            self.off_s.append(_timed(self.pair.off, self.device))
        else:
            self.off_s.append(_timed(self.pair.off, self.device))
            self.on_s.append(_timed(self.pair.on, self.device))

    def timing(self) -> Timing:
        return Timing(list(self.off_s), list(self.on_s))


def compare(pair: BenchPair, device: str, *, budget_s: float = 1.0, min_rounds: int = 3,
            max_rounds: int = 200, warm: bool = True) -> Timing:
    """Time off and on in alternating rounds for `budget_s` (at least `min_rounds`, at most `max_rounds`).

    `warm` runs each side once first, untimed.
    """
    if warm:
        pair.off()
        pair.on()
    rounds = Rounds(pair, device)
    deadline = time.perf_counter() + budget_s
    while len(rounds.off_s) < max_rounds and (len(rounds.off_s) < min_rounds or time.perf_counter() < deadline):
        rounds()
    return rounds.timing()


def checked_pair(case: BenchCase, device: str) -> tuple[BenchPair, float]:
    """Set the case up, run off and on once each and check them against each other: (pair, max abs diff)."""
    pair = case.setup()
    off_out = pair.off()
    synchronize(device)
    on_out = pair.on()
    synchronize(device)
    return pair, check_outputs(case, off_out, on_out)


def copy_bandwidth(device: str, nbytes: int = 256 << 20, rounds: int = 5) -> float:
    """Bytes per second that `dst.copy_(src)` moves (bytes read + bytes written), best of `rounds`."""
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = min(_timed(lambda: dst.copy_(src), device) for _ in range(rounds))
    return 2 * nbytes / best


def run_case(case: BenchCase, device: str, copy_bw: float, budget_s: float) -> dict[str, Any]:
    """Check one case's on against its off, time both, and return its result row."""
    pair, max_abs_diff = checked_pair(case, device)
    timing = compare(pair, device, budget_s=budget_s, warm=False)
    del pair
    gc.collect()
    off_s, on_s = timing.off_median_s, timing.on_median_s
    return {
        "case": case.name,
        "off_s": off_s,
        "on_s": on_s,
        "ratio": off_s / on_s,
        "ratio_per_round": timing.ratio,
        "rounds": len(timing.off_s),
        "max_abs_diff": max_abs_diff,
        "atol": case.atol,
        "rtol": case.rtol,
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


def select_cases(opt: Optimization, quick: bool, device: str, only: str | None) -> list[BenchCase]:
    """The optimization's cases; `only` keeps the case named so, else those whose name contains it."""
    cases = opt.bench_cases(quick, device)
    if only is None:
        return cases
    names = [c.name for c in cases]
    chosen = [c for c in cases if c.name == only] or [c for c in cases if only in c.name]
    if not chosen:
        raise ValueError(f"{opt.name}: no benchmark case matches {only!r}; cases: {', '.join(names)}")
    return chosen


def machine_info(device: str) -> dict[str, Any]:
    """Where a result was measured: device, CPU model and ISA, torch and its threads."""
    return {
        "device": device_name(device),
        "cpu_model": cpu_model(),
        "isa": cpu_isa(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }


def run(opt: Optimization, *, quick: bool = False, device: str | None = None, only: str | None = None,
        budget_s: float = 1.0, progress: Callable[[str], None] | None = print) -> dict[str, Any]:
    """Run an optimization's microbenchmarks, each case checked (on against off) before it is timed."""
    device = check_device(device or default_device())
    cases = select_cases(opt, quick, device, only)
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
        **machine_info(device),
        "quick": quick,
        "copy_GBps": copy_bw / 1e9,
        "cases": rows,
    }


def format_row(row: dict[str, Any]) -> str:
    return (f"{row['case']:<40} off {row['off_s'] * 1e3:9.3f} ms  on {row['on_s'] * 1e3:9.3f} ms  "
            f"x{row['ratio']:.2f}  on {row['on_GBps']:7.2f} GB/s ({row['on_frac_of_copy_bw']:.0%} of copy bw)")


def make_out_dir(path: str | Path) -> Path:
    """`--out`: the folder `path`, created; a file there, or a folder that cannot be made, is a ValueError."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ValueError(f"--out: {str(path)!r} is a file; give a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ValueError(f"--out: cannot create {str(path)!r}: {err.strerror or err}") from None
    return path


def check_writable(path: str | Path) -> Path:
    """`path` as a Path if a file can be written there (its folder exists and is writable), else a ValueError."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"--json: {str(path)!r} is a directory; give a file path")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise ValueError(f"--json: folder {str(parent)!r} does not exist")
    try:
        if path.exists():
            with open(path, "a"):
                pass
        else:
            with tempfile.NamedTemporaryFile(dir=parent):
                pass
    except OSError as err:
        raise ValueError(f"--json: cannot write {str(path)!r}: {err.strerror}") from None
    return path


def write_json(result: dict[str, Any], path: str | Path) -> None:
    Path(path).write_text(json.dumps(result, indent=2) + "\n")
