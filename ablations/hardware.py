"""The `hardware` group: the node a run is for (conf/hardware/*.yaml). Its platform picks each toggle's vLLM
setting when a cell's commands are printed for it (`backend.print_commands`), its device count the tensor
parallelism; its vendor figures and GPU-hour price are what the simulator and tokens per dollar read. Every
figure carries its source (or the word "assumed") in `sources`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from opts.vllm_setting import PLATFORMS

# The all-reduce algorithms a node's figures can price (`ablations/backends/sim/collectives.py` picks one as vLLM
# does): FlashInfer's all-reduce (CUDA), vLLM's custom all-reduce in one stage and in two, PyTorch symmetric memory
# (CUDA), NCCL / RCCL.
ALGORITHMS = ("flashinfer", "ar_1stage", "ar_2stage", "symm_mem", "ccl")
COLLECTIVE_FIGURES = tuple(f"{a}_{f}" for a in ALGORITHMS for f in ("us", "busbw_gb_s"))
FIGURES = ("memory", "bandwidth_tb_s", "peak_bf16_tflops", "peak_fp8_tflops", "peak_fp4_tflops",
           "price_per_gpu_hour", "link_bandwidth_gb_s", *COLLECTIVE_FIGURES, "launch_us", "graph_launch_us",
           "graph_node_us", "kernel_floor_us", "host_overhead_us", "host_us_per_token", "host_us_per_request",
           "host_us_per_decode", "host_first_step_us")
PRECISIONS = {"bf16": "peak_bf16_tflops", "fp8": "peak_fp8_tflops", "fp4": "peak_fp4_tflops"}
# The host's figures, fitted together where an engine's steps are measured (python -m ablations.fidelity).
HOST_FIGURES = ("host_overhead_us", "host_us_per_token", "host_us_per_request", "host_us_per_decode",
                "host_first_step_us")
# What the simulator cannot do without (besides an efficiency per kernel class); the link only with two devices
# or more (one device never all-reduces).
MODEL_FIGURES = ("memory", "bandwidth_tb_s", "peak_bf16_tflops", "link_bandwidth_gb_s", "ccl_us",
                 "ccl_busbw_gb_s")
LINK_FIGURES = ("link_bandwidth_gb_s", "ccl_us", "ccl_busbw_gb_s")
# The simulator's kernel classes: each reaches its own fraction of peak FLOP/s and of memory bandwidth. A profile
# gives every one; an optional class only where a toggle's kernel runs as it (aiter_mla on: "attention_vendor").
KERNEL_CLASSES = ("gemm", "moe", "attention", "recurrent", "elementwise")
OPTIONAL_KERNEL_CLASSES = ("attention_vendor", "attention_blackwell")


MEMORY_UNITS = {"GB": 1e9, "GiB": 2.0**30, "MiB": 2.0**20}


@dataclass
class HardwareConfig:
    """A node: `num_devices` of `device` on `platform` (cpu, rocm, cuda). Per device: HBM `memory` in `memory_unit` (GB,
    10^9 bytes, GiB, 2^30, or MiB, 2^20: the unit the vendor means: AMD's "288 GB" is 288 GiB, NVIDIA's B300 "288 GB" is
    288·10^9 bytes; NVIDIA's H200 "141 GB" is neither, its total given in MiB as nvidia-smi prints it), memory bandwidth
    `bandwidth_tb_s` (10^12 bytes/s), dense BF16, FP8 and FP4 peaks in TFLOP/s; `price_per_gpu_hour` in USD; the link
    each device reaches the others over (`link_bandwidth_gb_s`: one direction, 10^9 bytes/s, the ceiling of every
    all-reduce's bus bandwidth); each all-reduce algorithm's latency (`<algorithm>_us`) and bus bandwidth
    (`<algorithm>_busbw_gb_s`, as nccl-tests reports it: an all-reduce of P bytes takes latency + 2·(n − 1)/n · P /
    busbw); a kernel launched eagerly (`launch_us`), a captured graph's replay (`graph_launch_us`) and each kernel node
    in it (`graph_node_us`); the shortest a kernel runs however little it has to do (`kernel_floor_us`: a pass of n
    kernels takes at least n times it; 0: no floor); the host's work per engine step (`host_overhead_us`), per token it
    schedules (`host_us_per_token`), per request it schedules (`host_us_per_request`: a prefill chunk or a decode), per
    decode or verification on top of that (`host_us_per_decode`: on vLLM-CPU most of a decode's time lies outside the
    kernels the simulator prices, `python -m ablations.fidelity`) and once, in the engine's first step
    (`host_first_step_us`: vLLM-CPU's first forward initialises lazily; 0 where an engine is warmed up before it
    serves); `capability`, the device's compute capability as vLLM reads it (B300 10.3, H200 9.0, MI355X's gfx950 9.5):
    it picks the all-reduce size limits and the largest graph vLLM captures; `efficiency[kernel class]`, the fraction of
    peak and of bandwidth a class reaches; `stock_classes[cost name]`, the kernel class stock vLLM runs a pass as on
    this node where it is not the generic one (B300: the MLA decode as `attention_blackwell`, the kernel vLLM selects on
    Blackwell). A figure of 0 is unknown; a known one, every efficiency and every stock class names its source (or says
    assumed) in `sources[figure]` / `sources["efficiency.<class>"]` / `sources["stock_classes.<name>"]`; an assumed
    value has `ranges[key] = [low, high]`, the values it could take, the reason in its source."""

    name: str = "cpu"
    platform: str = "cpu"
    device: str = "CPU"
    num_devices: int = 1
    memory: float = 0.0
    memory_unit: str = "GB"
    bandwidth_tb_s: float = 0.0
    peak_bf16_tflops: float = 0.0
    peak_fp8_tflops: float = 0.0
    peak_fp4_tflops: float = 0.0
    price_per_gpu_hour: float = 0.0
    link_bandwidth_gb_s: float = 0.0
    flashinfer_us: float = 0.0
    flashinfer_busbw_gb_s: float = 0.0
    ar_1stage_us: float = 0.0
    ar_1stage_busbw_gb_s: float = 0.0
    ar_2stage_us: float = 0.0
    ar_2stage_busbw_gb_s: float = 0.0
    symm_mem_us: float = 0.0
    symm_mem_busbw_gb_s: float = 0.0
    ccl_us: float = 0.0
    ccl_busbw_gb_s: float = 0.0
    launch_us: float = 0.0
    graph_launch_us: float = 0.0
    graph_node_us: float = 0.0
    kernel_floor_us: float = 0.0
    host_overhead_us: float = 0.0
    host_us_per_token: float = 0.0
    host_us_per_request: float = 0.0
    host_us_per_decode: float = 0.0
    host_first_step_us: float = 0.0
    capability: str = ""
    efficiency: dict[str, float] = field(default_factory=dict)
    stock_classes: dict[str, str] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    ranges: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        where = f"hardware {self.name}"
        if self.platform not in PLATFORMS:
            raise ValueError(f"{where}: platform: invalid value {self.platform!r}; valid choices: "
                             f"{', '.join(PLATFORMS)}")
        if isinstance(self.num_devices, bool) or not isinstance(self.num_devices, int) or self.num_devices < 1:
            raise ValueError(f"{where}: num_devices: invalid value {self.num_devices!r}; valid: an integer >= 1")
        if self.memory_unit not in MEMORY_UNITS:
            raise ValueError(f"{where}: memory_unit: invalid value {self.memory_unit!r}; valid choices: "
                             f"{', '.join(MEMORY_UNITS)}")
        for name in FIGURES:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ValueError(f"{where}: {name}: invalid value {value!r}; valid: a number >= 0 (0: unknown)")
            if value and not str(self.sources.get(name, "")).strip():
                raise ValueError(f"{where}: {name} = {value} has no source; valid: sources.{name} names where the "
                                 "figure comes from, or says assumed")
        for name, value in self.efficiency.items():
            if name not in KERNEL_CLASSES + OPTIONAL_KERNEL_CLASSES:
                raise ValueError(f"{where}: efficiency: {name!r} is not a kernel class; valid: "
                                 f"{', '.join(KERNEL_CLASSES + OPTIONAL_KERNEL_CLASSES)}")
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
                raise ValueError(f"{where}: efficiency.{name}: invalid value {value!r}; valid: a fraction in (0, 1]")
            if not str(self.sources.get(f"efficiency.{name}", "")).strip():
                raise ValueError(f"{where}: efficiency.{name} = {value} has no source; valid: "
                                 f"sources.efficiency.{name} names where it comes from, or says assumed")
        for name, kernel in self.stock_classes.items():
            if kernel not in self.efficiency:
                raise ValueError(f"{where}: stock_classes.{name}: {kernel!r} has no efficiency; valid: "
                                 f"{', '.join(sorted(self.efficiency))}")
            if not str(self.sources.get(f"stock_classes.{name}", "")).strip():
                raise ValueError(f"{where}: stock_classes.{name} = {kernel} has no source; valid: "
                                 f"sources.stock_classes.{name} names the vLLM code that selects it")
        if self.link_bandwidth_gb_s:
            for algorithm in ALGORITHMS:
                busbw = getattr(self, f"{algorithm}_busbw_gb_s")
                if busbw > self.link_bandwidth_gb_s:
                    raise ValueError(f"{where}: {algorithm}_busbw_gb_s: {busbw:g} is above the link's "
                                     f"{self.link_bandwidth_gb_s:g} GB/s (link_bandwidth_gb_s); valid: at most that")
        valid = (set(FIGURES) | {f"efficiency.{name}" for name in KERNEL_CLASSES + OPTIONAL_KERNEL_CLASSES}
                 | {f"stock_classes.{name}" for name in self.stock_classes})
        unknown = sorted(set(self.sources) - valid)
        if unknown:
            raise ValueError(f"{where}: sources: {', '.join(unknown)} is not a figure; valid: {', '.join(FIGURES)}, "
                             "efficiency.<kernel class>, stock_classes.<cost name>")
        self._check_ranges(where)

    def _check_ranges(self, where: str) -> None:
        for key, bounds in self.ranges.items():
            if key not in self.sources or key.startswith("stock_classes."):
                raise ValueError(f"{where}: ranges.{key}: not a figure or efficiency this profile gives")
            bounds = list(bounds)
            if (len(bounds) != 2 or any(isinstance(b, bool) or not isinstance(b, int | float) for b in bounds)
                    or not 0 <= bounds[0] <= bounds[1]):
                raise ValueError(f"{where}: ranges.{key}: invalid value {bounds!r}; valid: [low, high] with "
                                 "0 <= low <= high (the profile's own value between them)")
            if key.startswith("efficiency.") and bounds[1] > 1:
                raise ValueError(f"{where}: ranges.{key}: high {bounds[1]:g} is above 1; valid: a fraction")
            self.ranges[key] = [float(b) for b in bounds]
        missing = sorted(k for k in self.assumed if k not in self.ranges)
        if missing:
            raise ValueError(f"{where}: {missing[0]} is assumed and has no range; valid: ranges.{missing[0]} = "
                             "[low, high], the values it could take (say why in its source)")

    def value(self, key: str) -> float:
        """A figure ("launch_us") or an efficiency ("efficiency.gemm") by its key."""
        if key.startswith("efficiency."):
            return self.efficiency[key.removeprefix("efficiency.")]
        if key not in FIGURES:
            raise ValueError(f"hardware {self.name}: {key}: not a figure; valid: {', '.join(FIGURES)}, "
                             "efficiency.<class>")
        return getattr(self, key)

    @property
    def assumed(self) -> list[str]:
        """The figures and efficiencies whose source says assumed (each has a range)."""
        return sorted(k for k, source in self.sources.items()
                      if "assumed" in str(source).lower() and not k.startswith("stock_classes."))

    @property
    def capture_ceiling(self) -> int:
        """The most tokens vLLM captures a graph for on this device: 1024 on compute capability 10.x, else 512
        (`config/vllm.py:2292-2550`)."""
        return 1024 if self.capability.startswith("10.") else 512

    @property
    def memory_bytes(self) -> float:
        """The device's memory in bytes."""
        return self.memory * MEMORY_UNITS[self.memory_unit]

    def peak_flops(self, precision: str) -> float:
        """FLOP/s at the dense peak of `precision` (bf16, fp8, fp4); a precision the profile has no peak for is a
        ValueError naming the figure."""
        if precision not in PRECISIONS:
            raise ValueError(f"precision: invalid value {precision!r}; valid: {', '.join(PRECISIONS)}")
        value = getattr(self, PRECISIONS[precision])
        if not value:
            raise ValueError(f"hardware {self.name}: a kernel computes in {precision} and {PRECISIONS[precision]} is "
                             f"not given; add it with its source to conf/hardware/{self.name}.yaml")
        return value * 1e12

    @property
    def is_modelled(self) -> bool:
        """Whether the simulator can run on this node: peak, bandwidth, memory, link (with two devices or more) and
        every kernel class's efficiency known."""
        return not self.missing_figures

    @property
    def missing_figures(self) -> list[str]:
        """What the simulator needs and this profile lacks: figures, then `efficiency.<class>`es."""
        figures = [k for k in MODEL_FIGURES if not getattr(self, k)
                   and not (k in LINK_FIGURES and self.num_devices == 1)]
        return figures + [f"efficiency.{c}" for c in KERNEL_CLASSES if c not in self.efficiency]
