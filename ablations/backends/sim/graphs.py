"""How a step's kernels are launched, as vLLM 0.32 runs them (README.md, "Graphs"): a decode step (every request
decoding or verifying the same number of tokens) replays a captured full graph, target pass and each MTP pass one
graph each; a step that prefills runs piecewise (CUDA: K3 is one of vLLM's breakable-graph architectures, its MLA
and KDA attention eager between captured pieces of everything else) or eagerly (ROCm: no K3 module is compiled,
so vLLM falls back to FULL_DECODE_ONLY); a step of more tokens than the largest captured size, or with graphs off,
launches every kernel eagerly.

Seconds: a full graph's replay costs `graph_launch_us` and `graph_node_us` per kernel in it; a piecewise step one
replay per piece plus `launch_us` per eager attention kernel and `graph_node_us` per captured one; eager,
`launch_us` per kernel."""

from __future__ import annotations

from dataclasses import dataclass

from ablations.backends.sim.config import GRAPH_MODES
from ablations.hardware import HardwareConfig

# The passes that run vLLM's splitting ops (attention), eager in a piecewise step.
SPLITTING = ("kda_prefill", "kda_recurrent", "kda_streams", "mla_prefill", "mla_decode")


def is_splitting(name: str) -> bool:
    """Whether a cost name (a target pass, an MTP pass or a later one) runs a splitting op."""
    return name.removeprefix("later_").removeprefix("mtp_") in SPLITTING


@dataclass(frozen=True)
class Graphs:
    """vLLM's graph settings: `mode` (CompilationConfig.cudagraph_mode: full_and_piecewise, full_decode_only,
    piecewise or none) and
    `max_tokens`, the largest batch captured (max_cudagraph_capture_size); `pieces` per target pass and per MTP
    pass (the attention layers + 1)."""

    mode: str = "none"
    max_tokens: int = 0
    target_pieces: int = 1
    mtp_pieces: int = 1

    def __post_init__(self) -> None:
        if self.mode not in GRAPH_MODES:
            raise ValueError(f"cudagraph_mode: invalid value {self.mode!r}; valid choices: {', '.join(GRAPH_MODES)}")

    def step_mode(self, tokens: int, prefills: bool) -> str:
        """How a step of `tokens` tokens (prefilling or not) launches: full, piecewise or eager."""
        if self.mode == "none" or tokens > self.max_tokens or (prefills and self.mode == "full_decode_only"):
            return "eager"
        if prefills or self.mode == "piecewise":
            return "piecewise"
        return "full"

    def replays(self, mode: str, num_drafts: int) -> int:
        """Graph replays of a step launched in `mode` with `num_drafts` MTP passes."""
        if mode == "full":
            return 1 + num_drafts
        if mode == "piecewise":
            return self.target_pieces + num_drafts * self.mtp_pieces
        return 0


EAGER = Graphs()          # no graphs: every kernel launched on its own (vLLM-CPU)


def kernel_seconds(name: str, mode: str, hw: HardwareConfig) -> float:
    """Seconds to launch one kernel of the cost `name` in a step launched in `mode`."""
    if mode == "eager" or (mode == "piecewise" and is_splitting(name)):
        return hw.launch_us * 1e-6
    return hw.graph_node_us * 1e-6
