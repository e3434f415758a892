"""The `hardware` group: the node a run is for (conf/hardware/*.yaml). Its platform picks each toggle's vLLM
setting when a cell's commands are printed for it (`backend.print_commands`), its device count the tensor
parallelism; its vendor figures and GPU-hour price are what the simulator and tokens per dollar read. Every
figure carries its source (or the word "assumed") in `sources`."""

from __future__ import annotations

from dataclasses import dataclass, field

from opts.vllm_setting import PLATFORMS

FIGURES = ("memory_gb", "bandwidth_tb_s", "peak_bf16_tflops", "peak_fp4_tflops", "price_per_gpu_hour",
           "link_bandwidth_gb_s", "link_latency_us", "launch_us", "host_overhead_us", "host_us_per_token",
           "host_us_per_request", "host_us_per_decode", "host_first_step_us")
# The host's figures, fitted together where an engine's steps are measured (python -m ablations.fidelity).
HOST_FIGURES = ("host_overhead_us", "host_us_per_token", "host_us_per_request", "host_us_per_decode",
                "host_first_step_us")
# What the simulator cannot do without (besides an efficiency per kernel class); the link only with two devices
# or more (one device never all-reduces).
MODEL_FIGURES = ("memory_gb", "bandwidth_tb_s", "peak_bf16_tflops", "link_bandwidth_gb_s")
# The simulator's kernel classes: each reaches its own fraction of peak FLOP/s and of memory bandwidth. A profile
# gives every one; an optional class only where a toggle's kernel runs as it (aiter_mla on: "attention_vendor").
KERNEL_CLASSES = ("gemm", "moe", "attention", "recurrent", "elementwise")
OPTIONAL_KERNEL_CLASSES = ("attention_vendor",)


@dataclass
class HardwareConfig:
    """A node: `num_devices` of `device` on `platform` (cpu, rocm, cuda). Per device: HBM `memory_gb` (10^9 bytes,
    the vendor's figure as printed), memory bandwidth `bandwidth_tb_s` (10^12 bytes/s), dense BF16 and FP4 peaks
    in TFLOP/s; `price_per_gpu_hour` in USD; the link each device reaches the others over
    (`link_bandwidth_gb_s`: one direction, 10^9 bytes/s; `link_latency_us` per hop); a kernel launch
    (`launch_us`) and the host's work per engine step (`host_overhead_us`), per token it schedules
    (`host_us_per_token`), per request it schedules (`host_us_per_request`: a prefill chunk or a decode), per
    decode or verification on top of that (`host_us_per_decode`: on vLLM-CPU most of a decode's time lies outside
    the kernels the simulator prices, `python -m ablations.fidelity`) and once, in the engine's first step
    (`host_first_step_us`: vLLM-CPU's first forward initialises lazily; 0 where an engine is warmed up before it
    serves); `efficiency[kernel class]`, the fraction of peak and of bandwidth a class reaches. A figure of 0 is
    unknown; a known one, and every efficiency, names its source (or says assumed) in `sources[figure]` /
    `sources["efficiency.<class>"]`."""

    name: str = "cpu"
    platform: str = "cpu"
    device: str = "CPU"
    num_devices: int = 1
    memory_gb: float = 0.0
    bandwidth_tb_s: float = 0.0
    peak_bf16_tflops: float = 0.0
    peak_fp4_tflops: float = 0.0
    price_per_gpu_hour: float = 0.0
    link_bandwidth_gb_s: float = 0.0
    link_latency_us: float = 0.0
    launch_us: float = 0.0
    host_overhead_us: float = 0.0
    host_us_per_token: float = 0.0
    host_us_per_request: float = 0.0
    host_us_per_decode: float = 0.0
    host_first_step_us: float = 0.0
    efficiency: dict[str, float] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        where = f"hardware {self.name}"
        if self.platform not in PLATFORMS:
            raise ValueError(f"{where}: platform: invalid value {self.platform!r}; valid choices: "
                             f"{', '.join(PLATFORMS)}")
        if isinstance(self.num_devices, bool) or not isinstance(self.num_devices, int) or self.num_devices < 1:
            raise ValueError(f"{where}: num_devices: invalid value {self.num_devices!r}; valid: an integer >= 1")
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
        valid = set(FIGURES) | {f"efficiency.{name}" for name in KERNEL_CLASSES + OPTIONAL_KERNEL_CLASSES}
        unknown = sorted(set(self.sources) - valid)
        if unknown:
            raise ValueError(f"{where}: sources: {', '.join(unknown)} is not a figure; valid: {', '.join(FIGURES)}, "
                             "efficiency.<kernel class>")

    @property
    def is_modelled(self) -> bool:
        """Whether the simulator can run on this node: peak, bandwidth, memory, link (with two devices or more) and
        every kernel class's efficiency known."""
        return not self.missing_figures

    @property
    def missing_figures(self) -> list[str]:
        """What the simulator needs and this profile lacks: figures, then `efficiency.<class>`es."""
        figures = [k for k in MODEL_FIGURES if not getattr(self, k)
                   and not (k == "link_bandwidth_gb_s" and self.num_devices == 1)]
        return figures + [f"efficiency.{c}" for c in KERNEL_CLASSES if c not in self.efficiency]
