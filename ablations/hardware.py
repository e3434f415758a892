"""The `hardware` group: the node a run is for (conf/hardware/*.yaml). Its platform picks each toggle's vLLM
setting when a cell's commands are printed for it (`backend.print_commands`), its device count the tensor
parallelism; its vendor figures and GPU-hour price are what the simulator and tokens per dollar read. Every
figure carries its source (or the word "assumed") in `sources`."""

from __future__ import annotations

from dataclasses import dataclass, field

from opts.vllm_setting import PLATFORMS

FIGURES = ("memory_gb", "bandwidth_tb_s", "peak_bf16_tflops", "peak_fp4_tflops", "price_per_gpu_hour")


@dataclass
class HardwareConfig:
    """A node: `num_devices` of `device` on `platform` (cpu, rocm, cuda). Per device: HBM `memory_gb`, memory
    bandwidth `bandwidth_tb_s`, dense BF16 and FP4 peaks in TFLOP/s; `price_per_gpu_hour` in USD. A figure
    of 0 is unknown; a known one names its source in `sources[figure]`."""

    name: str = "cpu"
    platform: str = "cpu"
    device: str = "CPU"
    num_devices: int = 1
    memory_gb: float = 0.0
    bandwidth_tb_s: float = 0.0
    peak_bf16_tflops: float = 0.0
    peak_fp4_tflops: float = 0.0
    price_per_gpu_hour: float = 0.0
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
        unknown = sorted(set(self.sources) - set(FIGURES))
        if unknown:
            raise ValueError(f"{where}: sources: {', '.join(unknown)} is not a figure; valid: {', '.join(FIGURES)}")
