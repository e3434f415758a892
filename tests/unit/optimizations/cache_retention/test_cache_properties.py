"""Properties of every policy on a generated session trace (agentx_small) at a few capacities."""

import pytest

from ablations.workload import generate, preset
from ablations.workload.cache_stream import cache_stream
from opts.cache_retention.config import CacheRetentionConfig
from opts.cache_retention.reference import run_belady, run_unbounded
from opts.cache_retention.retention import run
from opts.k3.cache.geometry import K3_TP8, TINY
from opts.k3.cache.stream import CacheStream

MODES = ("off", "evict", "resume", "on")


@pytest.fixture(scope="module", params=[0, 1], ids=["seed0", "seed1"])
def stream(request) -> CacheStream:
    return cache_stream(generate(preset("agentx_small"), seed=request.param))


@pytest.mark.parametrize("geometry", [TINY, K3_TP8], ids=["tiny", "k3_tp8"])
@pytest.mark.parametrize("fraction", [0.1, 0.25, 1.0])
def test_no_policy_beats_the_unbounded_cache_on_any_request(stream, geometry, fraction):
    unbounded = run_unbounded(stream, geometry)
    num_blocks = max(40, int(fraction * unbounded.info["working_set_blocks"]))
    results = {mode: run(stream, geometry, num_blocks, CacheRetentionConfig(mode=mode)) for mode in MODES}
    results["belady"] = run_belady(stream, geometry, num_blocks)
    for name, stats in results.items():
        above = [i for i, (hit, bound) in enumerate(zip(stats.hits, unbounded.hits, strict=True)) if hit > bound]
        assert not above, f"{name} at {num_blocks} blocks: requests {above[:5]} hit more than unbounded"
        assert all(0 <= hit < prompt for hit, prompt in zip(stats.hits, stats.prompt_tokens, strict=True))


@pytest.mark.parametrize("geometry", [TINY, K3_TP8], ids=["tiny", "k3_tp8"])
def test_at_the_working_set(stream, geometry):
    """Off never evicts at the working set: it is off at 10x the working set, request for request. On is no worse."""
    working_set = run_unbounded(stream, geometry).info["working_set_blocks"]
    off = run(stream, geometry, working_set, CacheRetentionConfig(mode="off"))
    large = run(stream, geometry, 10 * working_set, CacheRetentionConfig(mode="off"))
    on = run(stream, geometry, working_set, CacheRetentionConfig(mode="on"))
    assert off.num_evictions == 0 and off.num_waits == 0
    assert off.hits == large.hits
    assert on.hit_tokens >= off.hit_tokens and on.hit_rate > off.hit_rate
