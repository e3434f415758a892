"""A cell reports, per toggle, which counted routes ran; a route the engine never runs by design is named idle
with the reason, and a toggle whose running routes never fired fails the cell by name."""

from __future__ import annotations

from ablations.backends.vllm.cells.cell import fired, not_fired
from ablations.backends.vllm.launch.engine import EngineConfig
from opts.fusion import vllm as fusion_vllm
from opts.kda_overlap import vllm as kda_overlap_vllm
from opts.moe_dedup import vllm as moe_dedup_vllm


def test_fusion_in_a_speculating_engine_needs_only_its_norm_route():
    cfg = EngineConfig(toggles={"fusion": {"mode": "on"}, "draft_length": {"mode": "off"}})
    report = fired(cfg, {fusion_vllm.MLA_COUNTER: 7})
    routes = report["fusion"]["routes"]
    assert routes[fusion_vllm.MLA_COUNTER] == {"calls": 7}
    assert routes[fusion_vllm.KDA_COUNTER]["calls"] == 0 and "no plain decode step" in routes[
        fusion_vllm.KDA_COUNTER]["idle"]
    assert report["fusion"]["fired"] is True and report["draft_length"]["fired"] is None
    assert not_fired(report) == []


def test_without_speculation_both_fusion_routes_must_fire():
    cfg = EngineConfig(toggles={"fusion": {"mode": "on"}, "draft_length": {"mode": "k0"}})
    report = fired(cfg, {fusion_vllm.MLA_COUNTER: 7})
    assert report["fusion"]["fired"] is False
    assert not_fired(report) == [f"fusion=on never fired ({fusion_vllm.KDA_COUNTER}: 0 calls)"]


def test_a_toggle_that_never_ran_is_named():
    cfg = EngineConfig(toggles={"kda_overlap": {"mode": "on"}, "draft_length": {"mode": "off"}})
    report = fired(cfg, {})
    assert not_fired(report) == [f"kda_overlap=on never fired ({kda_overlap_vllm.PACKED_COUNTER}: 0 calls)"]
    assert not_fired(fired(cfg, {kda_overlap_vllm.PACKED_COUNTER: 3})) == []


def test_moe_dedups_tail_is_idle_on_one_rank_and_must_fire_on_two():
    one = fired(EngineConfig(toggles={"moe_dedup": {"mode": "off"}}), {})
    assert one["moe_dedup"]["fired"] is None and "tensor-parallel size 1" in one["moe_dedup"]["routes"][
        moe_dedup_vllm.REPLICATED_COUNTER]["idle"]
    two = fired(EngineConfig(toggles={"moe_dedup": {"mode": "off"}}, tensor_parallel_size=2), {})
    assert not_fired(two) == [f"moe_dedup=off never fired ({moe_dedup_vllm.REPLICATED_COUNTER}: 0 calls)"]
