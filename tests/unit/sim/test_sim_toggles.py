"""Each toggle the simulator models acts on the default case (Kimi K3 on MI355X, agentx) through its mechanism
and in the direction the mechanism predicts; kda_overlap changes nothing without speculation."""

from __future__ import annotations

from functools import cache

import pytest

from ablations.backends.sim.cell import run_point, sim_setup
from ablations.backends.sim.config import SimBackendConfig
from ablations.config import compose_app
from ablations.workload import load_workload
from opts.registry import OPTIMIZATIONS, make_config

CONCURRENCY = 3        # the default case's bracket of 50 tok/s/user lies between 3 and 4 live sessions


@cache
def default_case():
    app = compose_app(["backend=sim", "model=kimi_k3", "hardware=mi355x_x8", "workload=agentx"])
    return app.hardware, load_workload(app.workload)


def point(**modes: str) -> dict:
    """The default case at CONCURRENCY with `modes` (every other toggle off); each computed once per session."""
    return _point(tuple(sorted(modes.items())))


@cache
def _point(modes: tuple[tuple[str, str], ...]) -> dict:
    hw, trace = default_case()
    toggles = {name: make_config(name, mode=dict(modes).get(name, "off")) for name in OPTIMIZATIONS}
    out = run_point(sim_setup(SimBackendConfig(), "kimi_k3", hw, toggles), trace, CONCURRENCY, 0)
    out.pop("wall_s")
    return out


@pytest.mark.slow
def test_aiter_mla_on_decodes_faster_with_the_same_work():
    off, on = point(), point(aiter_mla="on")
    # the vendor kernel class reads the same bytes at a higher efficiency: every decode step is shorter
    assert on["interactivity"] > off["interactivity"]
    assert on["throughput_per_gpu"] > off["throughput_per_gpu"]
    assert on["engine"]["drafts"] == pytest.approx(off["engine"]["drafts"], rel=0.05)


def mean_mixed_step_s(p: dict) -> float:
    return p["engine"]["mixed_s"] / p["engine"]["num_mixed_steps"]


@pytest.mark.slow
def test_kda_overlap_on_shortens_the_steps_that_prefill_and_verify():
    off, on = point(), point(kda_overlap="on")
    # one chunked pass instead of a recurrent and a chunked one: 3 launches fewer per KDA layer in every step that
    # prefills beside verifications (69 layers x 3 x 5 us), the chunked kernel's FLOPs for the verified rows
    assert off["engine"]["num_mixed_steps"] > 1000
    assert mean_mixed_step_s(on) < mean_mixed_step_s(off) - 0.5e-3
    assert on["throughput_per_gpu"] > off["throughput_per_gpu"]


def close(a, b, rel: float = 1e-9) -> bool:
    """Equal JSON trees, numbers within `rel` (two fits of one linear cost differ in their last bits)."""
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(close(a[k], b[k], rel) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(close(x, y, rel) for x, y in zip(a, b, strict=True))
    if isinstance(a, float):
        return a == pytest.approx(b, rel=rel)
    return a == b


@pytest.mark.slow
def test_kda_overlap_changes_nothing_without_speculation():
    off, on = point(draft_length="k0"), point(draft_length="k0", kda_overlap="on")
    assert off["engine"]["drafts"] == 0
    assert close(on, off)
    assert not close(point(kda_overlap="on"), point())


@pytest.mark.slow
def test_moe_dedup_on_reads_less_per_step_and_leaves_more_cache():
    off, on = point(), point(moe_dedup="on")
    hw, _ = default_case()
    toggles = {name: make_config(name, mode="on" if name == "moe_dedup" else "off") for name in OPTIMIZATIONS}
    stock = {name: make_config(name, mode="off") for name in OPTIMIZATIONS}
    more, less = (sim_setup(SimBackendConfig(), "kimi_k3", hw, t) for t in (toggles, stock))
    # each rank holds 1/8 of W_up (3584 x 7168 bf16 per MoE layer and the MTP layer's): 93 x 51.4 MB x 7/8 more cache
    assert more.cache_gb - less.cache_gb == pytest.approx(93 * 3584 * 7168 * 2 * 7 / 8 / 1e9, rel=1e-6)
    assert on["interactivity"] > off["interactivity"]
    assert on["throughput_per_gpu"] > off["throughput_per_gpu"]


def setup(**modes: str):
    hw, _ = default_case()
    toggles = {name: make_config(name, mode=modes.get(name, "off")) for name in OPTIMIZATIONS}
    return sim_setup(SimBackendConfig(), "kimi_k3", hw, toggles)


def test_mtp_disables_the_fused_kda_decode():
    # vLLM decides at construction: with speculation configured the fused KDA decode is never used
    speculative, plain = setup(fusion="on").steps.mech, setup(fusion="on", draft_length="k0").steps.mech
    assert speculative.fused_mla_norm and not speculative.fused_kda_decode
    assert plain.fused_mla_norm and plain.fused_kda_decode
    assert not setup(draft_length="k0").steps.mech.fused_kda_decode


def gain(on: dict, off: dict) -> float:
    return on["throughput_per_gpu"] / off["throughput_per_gpu"]


@pytest.mark.slow
def test_fusion_on_saves_launches_and_more_of_them_without_speculation():
    off, on = point(), point(fusion="on")
    # with MTP only the q/kv norms fuse: one launch fewer per MLA layer in every step and MTP pass
    assert on["interactivity"] > off["interactivity"]
    assert on["throughput_per_gpu"] > off["throughput_per_gpu"]
    # without it every decode-only step also runs one KDA decode kernel instead of five per layer
    plain_off, plain_on = point(draft_length="k0"), point(draft_length="k0", fusion="on")
    assert plain_on["interactivity"] > plain_off["interactivity"]
    assert gain(plain_on, plain_off) > gain(on, off) > 1
