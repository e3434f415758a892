"""`python -m ablations.calibrate`: measure this device and write the hardware profile the simulator prices it with.

What it measures (README.md of the simulator, "Calibration"):
- the peaks: memory bandwidth (a 256 MB copy, bytes read + written), BF16 FLOP/s (the fastest of two large square
  GEMMs), the cost of one kernel launch (the per-call time of a one-element op), the device's memory;
- each kernel class's efficiency, the fraction of the roofline its kernels reach: the optimization packages'
  microbenchmarks (`opts/<name>/sim.py`'s `CALIBRATION` names the class of each side of their cases), and the two
  classes no package benchmarks, `gemm` and `moe`, from probes of K3's shapes here. A class's efficiency is its
  rows' roofline seconds over their measured seconds, summed: the large cases weigh most, where the launch cost
  (priced apart) matters least.

Everything else (the node's device count, link, price, host overhead) is kept from the base profile, with its
source. The profile is written as `conf/hardware/<name>.yaml` (default: the base's own file), so `hardware=<name>`
runs the simulator on it.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import yaml

from ablations.config import CONF_DIR as CONF_ROOT
from ablations.config import compose_app
from ablations.hardware import FIGURES, HardwareConfig
from opts import bench, registry
from opts.base import BenchCase
from opts.k3 import K3

CONF_DIR = CONF_ROOT / "hardware"
GEMM_TOKENS = (1, 64, 512)          # tokens through a projection of K3's hidden (7168 -> 3584)
MOE_TOKENS_PER_EXPERT = (1, 8, 64)  # rows per expert through 8 of K3's experts (latent 3584 -> 2 x 3072)
MOE_PROBE_EXPERTS = 8
PEAK_GEMM_SIZES = (512, 1024, 2048, 4096)
# A probe whose untimed first call takes longer than this is timed by that call alone, and its larger sizes are
# skipped: a CPU without native BF16 GEMMs runs 2048^3 in ~100 s (this 2-core EPYC), a GPU runs every size in ms.
PROBE_CAP_S = 1.0
MEASURED = "measured by python -m ablations.calibrate"


@dataclass(frozen=True)
class Peaks:
    """The device's peaks: bytes/s a copy moves, BF16 FLOP/s of a large GEMM, seconds per kernel launch, GB."""

    bandwidth: float
    flops: float
    launch_s: float
    memory_gb: float


@dataclass(frozen=True)
class Row:
    """One timed case of a kernel path as a kernel class runs it: the path ("<package> <side>", or "<class>
    probe"), the case, seconds, bytes and FLOPs."""

    kernel_class: str
    path: str
    case: str
    seconds: float
    bytes: float
    flops: float

    def roofline_s(self, peaks: Peaks) -> float:
        return max(self.bytes / peaks.bandwidth, self.flops / peaks.flops)


@dataclass(frozen=True)
class Fit:
    """A kernel class's efficiency: its rows' roofline seconds over their measured seconds (`raw`), at most 1;
    `rows` counted, `paths` the "<package> <side>"s (or probes) they came from."""

    efficiency: float
    raw: float
    rows: int
    paths: tuple[str, ...]

    def source(self, when: str) -> str:
        clipped = (f"; measured {self.raw:.3g}, faster than the copy/GEMM peaks (cache-resident), so 1"
                   if self.raw > 1 else "")
        return f"{MEASURED}, {when}: {self.rows} timed rows of {', '.join(self.paths)}{clipped}"


def _times(fn: Callable[[], object], device: str, rounds: int, cap_s: float | None = None) -> list[float]:
    """Seconds of `rounds` calls of `fn` after one untimed call (the device synchronized around each); where the
    first call took over `cap_s`, that call's seconds alone."""
    bench.synchronize(device)
    start = time.perf_counter()
    fn()
    bench.synchronize(device)
    first = time.perf_counter() - start
    if cap_s is not None and first > cap_s:
        return [first]
    times = []
    for _ in range(rounds):
        bench.synchronize(device)
        start = time.perf_counter()
        fn()
        bench.synchronize(device)
        times.append(time.perf_counter() - start)
    return times


def gemm_flops(device: str, sizes: tuple[int, ...] = PEAK_GEMM_SIZES, rounds: int = 3) -> float:
    """BF16 FLOP/s of the fastest square GEMM of `sizes`."""
    best = 0.0
    for n in sizes:
        a = torch.randn(n, n, device=device).to(torch.bfloat16)
        b = torch.randn(n, n, device=device).to(torch.bfloat16)
        times = _times(lambda a=a, b=b: a @ b, device, rounds, PROBE_CAP_S)
        best = max(best, 2 * n ** 3 / min(times))
        if len(times) < rounds:                      # over the cap: a larger size would take longer still
            break
    return best


def launch_seconds(device: str, calls: int = 2000) -> float:
    """Seconds per call of a one-element add: the fixed cost of one kernel (dispatch on a CPU, launch on a GPU)."""
    x = torch.zeros(1, device=device)
    y = torch.ones(1, device=device)

    def many() -> None:
        for _ in range(calls):
            torch.add(x, y, out=x)

    return statistics.median(_times(many, device, 5)) / calls


def memory_gb(device: str) -> float:
    """The device's memory in GB (10^9 bytes): the GPU's, or the host's RAM."""
    if device.startswith("cuda"):
        return torch.cuda.get_device_properties(torch.device(device)).total_memory / 1e9
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9


def measure_peaks(device: str) -> Peaks:
    """The device's copy bandwidth, GEMM peak, launch cost and memory."""
    return Peaks(bench.copy_bandwidth(device), gemm_flops(device), launch_seconds(device), memory_gb(device))


def probe_rows(device: str, rounds: int = 5) -> list[Row]:
    """`gemm` and `moe` rows, which no package benchmarks: a projection of K3's hidden at `GEMM_TOKENS` tokens, and
    8 of K3's experts' gate/up GEMM (batched) at `MOE_TOKENS_PER_EXPERT` rows each, BF16. Sizes after one whose
    first call exceeds `PROBE_CAP_S` are skipped."""
    rows = []
    hidden, out = K3.hidden, K3.hidden // 2
    weight = torch.randn(hidden, out, device=device).to(torch.bfloat16)
    for t in GEMM_TOKENS:
        x = torch.randn(t, hidden, device=device).to(torch.bfloat16)
        times = _times(lambda x=x: x @ weight, device, rounds, PROBE_CAP_S)
        rows.append(Row("gemm", "gemm probe", f"{t}x{hidden}x{out}", statistics.median(times),
                        2 * (t * hidden + hidden * out + t * out), 2 * t * hidden * out))
        if len(times) < rounds:
            break
    e, latent, inter = MOE_PROBE_EXPERTS, K3.expert_latent, 2 * K3.moe_intermediate
    experts = torch.randn(e, latent, inter, device=device).to(torch.bfloat16)
    for t in MOE_TOKENS_PER_EXPERT:
        x = torch.randn(e, t, latent, device=device).to(torch.bfloat16)
        times = _times(lambda x=x: torch.bmm(x, experts), device, rounds, PROBE_CAP_S)
        rows.append(Row("moe", "moe probe", f"{e}x{t}x{latent}x{inter}", statistics.median(times),
                        2 * e * (t * latent + latent * inter + t * inter), 2 * e * t * latent * inter))
        if len(times) < rounds:
            break
    return rows


def calibration_of(name: str) -> dict[str, dict[str, str]]:
    """The package's `CALIBRATION` (case-name prefix -> {side: kernel class}); {} where it has none."""
    return getattr(importlib.import_module(f"opts.{name}.sim"), "CALIBRATION", {})


def _classes(calibration: dict[str, dict[str, str]], case: str) -> dict[str, str]:
    for prefix, sides in calibration.items():
        if case.startswith(prefix):
            return sides
    return {}


def package_rows(name: str, device: str, budget_s: float, progress: Callable[[str], None] | None = print
                 ) -> list[Row]:
    """The rows of one package's quick microbenchmarks whose sides its `CALIBRATION` names, each case checked
    (on against off) and timed by `opts.bench`."""
    calibration = calibration_of(name)
    opt = registry.get(name)
    cases = [c for c in opt.bench_cases(True, device)
             if isinstance(c, BenchCase) and _classes(calibration, c.name)]
    copy_bw = bench.copy_bandwidth(device)
    rows = []
    for i, case in enumerate(cases, 1):
        result = bench.run_case(case, device, copy_bw, budget_s)
        for side, kernel_class in _classes(calibration, case.name).items():
            rows.append(Row(kernel_class, f"{name} {side}", case.name, result[f"{side}_s"], case.bytes, case.flops))
        if progress:
            progress(f"  {name} [{i}/{len(cases)}] {bench.format_row(result)}")
    return rows


def fit(rows: list[Row], peaks: Peaks) -> dict[str, Fit]:
    """Each kernel class's efficiency: the sum of its rows' roofline seconds over the sum of their seconds."""
    fits = {}
    for kernel_class in sorted({r.kernel_class for r in rows}):
        mine = [r for r in rows if r.kernel_class == kernel_class]
        raw = sum(r.roofline_s(peaks) for r in mine) / sum(r.seconds for r in mine)
        paths = tuple(sorted({r.path for r in mine}))
        fits[kernel_class] = Fit(min(raw, 1.0), raw, len(mine), paths)
    return fits


def calibrated(base: HardwareConfig, peaks: Peaks, fits: dict[str, Fit], device: str, name: str,
               when: str) -> HardwareConfig:
    """`base` with the measured figures and efficiencies in place of its own, each source saying how and where."""
    sources = dict(base.sources)
    sources.update({
        "memory": f"{MEASURED}, {when}: the device's memory",
        "bandwidth_tb_s": f"{MEASURED}, {when}: a 256 MB copy, bytes read + written",
        "peak_bf16_tflops": f"{MEASURED}, {when}: the fastest of "
                            f"{', '.join(f'{n}^3' for n in PEAK_GEMM_SIZES)} BF16 GEMMs",
        "launch_us": f"{MEASURED}, {when}: per-call time of a one-element add",
    })
    sources.update({f"efficiency.{k}": f.source(when) for k, f in fits.items()})
    return replace(base, name=name, device=device, memory=round(peaks.memory_gb, 1), memory_unit="GB",
                   bandwidth_tb_s=round(peaks.bandwidth / 1e12, 5), peak_bf16_tflops=round(peaks.flops / 1e12, 4),
                   launch_us=round(peaks.launch_s * 1e6, 2),
                   efficiency={**base.efficiency, **{k: round(f.efficiency, 4) for k, f in fits.items()}},
                   sources=sources)


def profile_yaml(hw: HardwareConfig, header: str) -> str:
    """The profile as a `conf/hardware` option: a comment, the schema default, every field."""
    body = {k: v for k, v in asdict(hw).items() if k in ("name", "platform", "device", "num_devices", "memory_unit",
                                                            "capability") or
            k in FIGURES or k in ("efficiency", "stock_classes", "sources", "ranges")}
    defaults = yaml.safe_dump({"defaults": ["/hardware_schema@_here_", "_self_"]}, sort_keys=False)
    return f"# {header}\n{defaults}\n{yaml.safe_dump(body, sort_keys=False, width=120)}"


def load_base(name: str) -> HardwareConfig:
    """The hardware option `name` as composed by Hydra (its schema checked)."""
    return compose_app([f"hardware={name}"]).hardware


def run(base_name: str, out: Path, device: str, packages: tuple[str, ...], budget_s: float, name: str | None = None,
        progress: Callable[[str], None] | None = print) -> dict:
    """Measure, fit and write the profile to `out`; returns the record (peaks, rows, fits, profile)."""
    base = load_base(base_name)
    say = progress or (lambda _line: None)
    say(f"calibrate {device} ({bench.device_name(device)}), base profile {base_name}")
    peaks = measure_peaks(device)
    say(f"  copy {peaks.bandwidth / 1e9:.1f} GB/s, BF16 GEMM {peaks.flops / 1e12:.3f} TFLOP/s, "
        f"launch {peaks.launch_s * 1e6:.1f} us, memory {peaks.memory_gb:.1f} GB")
    rows = probe_rows(device)
    say(f"  probes: {', '.join(f'{r.kernel_class} {r.case} {r.seconds * 1e3:.2f} ms' for r in rows)}")
    for i, package in enumerate(packages, 1):
        say(f"[{i}/{len(packages)}] {package}")
        rows += package_rows(package, device, budget_s, progress)
    fits = fit(rows, peaks)
    when = datetime.date.today().isoformat()
    hw = calibrated(base, peaks, fits, bench.device_name(device), name or base.name, when)
    HardwareConfig(**asdict(hw))                     # the schema's checks, before anything is written
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(profile_yaml(hw, f"{hw.name}: calibrated by python -m ablations.calibrate on {hw.device}, "
                                    f"{when} (base profile: {base_name})."))
    for k, f in fits.items():
        say(f"  efficiency.{k} = {f.efficiency:.3f} ({f.rows} rows)")
    say(f"wrote {out}")
    return {"peaks": asdict(peaks), "rows": [asdict(r) for r in rows],
            "fits": {k: asdict(f) for k, f in fits.items()}, "profile": asdict(hw)}


def calibrated_packages() -> tuple[str, ...]:
    """The packages whose `CALIBRATION` names a kernel class for some microbenchmark."""
    return tuple(n for n in registry.names() if calibration_of(n))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ablations.calibrate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--hardware", default=None, help="the base profile: its device count, link, "
                        "price and host overhead are kept (default on a CPU: cpu; on a GPU: required)")
    parser.add_argument("--name", default=None, help="the written profile's name (default: the base's)")
    parser.add_argument("--out", type=Path, default=None, help="file to write (default: conf/hardware/<name>.yaml)")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when visible, else cpu)")
    parser.add_argument("--packages", nargs="+", default=None, help="packages whose microbenchmarks to fit "
                        "(default: every one with a CALIBRATION)")
    parser.add_argument("--budget-s", type=float, default=1.0, help="seconds of timing per case (default: 1)")
    parser.add_argument("--json", type=Path, default=None, help="also write the peaks, rows and fits here")
    args = parser.parse_args(argv)
    try:
        device = bench.check_device(args.device or bench.default_device())
        if args.hardware is None and device != "cpu":
            raise ValueError("--hardware: give the base profile of this GPU's node (e.g. mi355x_x8): its device "
                             "count, link and price are kept")
        base_name = args.hardware or "cpu"
        known = calibrated_packages()
        packages = tuple(args.packages) if args.packages else known
        for p in packages:
            if p not in known:
                raise ValueError(f"--packages: {p!r} has no CALIBRATION; valid choices: {', '.join(known)}")
        out = args.out or CONF_DIR / f"{args.name or base_name}.yaml"
        if args.json:
            bench.check_writable(args.json)
        record = run(base_name, out, device, packages, args.budget_s, args.name,
                     progress=lambda line: print(line, file=sys.stderr, flush=True))
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.json:
        args.json.write_text(json.dumps(record, indent=1) + "\n")
    print(yaml.safe_dump({"efficiency": record["profile"]["efficiency"]}, sort_keys=False), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
