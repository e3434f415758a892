"""kda_overlap in the simulator: on, a step that prefills and verifies runs its KDA verification rows inside the
prefill's chunked pass (one pass: the chunked kernel's FLOPs for those rows and one set of launches) instead of a
recurrent pass and then a chunked one (off); streams, the two passes at once on two GPU streams (one pass's time
over both passes' FLOPs and bytes: a compute-bound chunked pass hides a memory-bound recurrent one). Without
speculation there are no verification rows: nothing changes."""

from __future__ import annotations

from opts.base import ToggleConfig
from opts.sim_setting import SimSetting, not_modelled
from opts.vllm_setting import check_platform

# The kernel class each side of this package's microbenchmarks runs as, by case-name prefix ("": every case):
# the calibration fits the class's efficiency on those rows (chunked and recurrent KDA passes).
CALIBRATION = {"": {"off": "recurrent", "on": "recurrent"}}


def sim_setting(config: ToggleConfig, platform: str) -> SimSetting:
    """What `config` changes in the simulated engine on `platform`."""
    check_platform(platform)
    if config.mode == "off":
        return SimSetting()
    if config.mode == "on":
        return SimSetting(packed_kda=True)
    if config.mode == "streams" and platform != "cpu":
        return SimSetting(kda_streams=True)
    raise not_modelled("kda_overlap", config.mode, ("off", "on"), why="a GPU mode: a CPU has no streams")
