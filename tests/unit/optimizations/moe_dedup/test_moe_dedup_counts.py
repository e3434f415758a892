"""Per-rank counts, checked by hand at K3's shapes: the up-projection (off's / TP on), the collectives' payloads
and ring bytes, sp's split of the tokens, one rank (every mode is off), tiered's choice, bad input."""

from __future__ import annotations

import pytest

from opts.moe_dedup.config import MoeDedupConfig
from opts.moe_dedup.counts import mode_counts
from opts.moe_dedup.shape import K3_MOE, TEST_SHAPE

H, L, E, K, I = 7168, 3584, 896, 16, 3072


@pytest.mark.parametrize("tp", [2, 4, 8])
@pytest.mark.parametrize("tokens", [1, 64, 8192])
def test_on_up_projection_is_off_over_tp(tp: int, tokens: int) -> None:
    off = mode_counts("off", tp=tp, num_tokens=tokens)
    on = mode_counts("on", tp=tp, num_tokens=tokens)
    assert off.parts["up"].flops == 2 * tokens * L * H
    assert on.parts["up"].flops * tp == off.parts["up"].flops
    assert off.parts["up"].bytes_read == (H * L + tokens * L) * 2
    assert on.parts["up"].bytes_read == (H // tp * L + tokens * L + tokens * H // tp) * 2
    assert on.parts["up"].bytes_written == tokens * H // tp * 2
    assert off.parts["up"].duplicated and not on.parts["up"].duplicated
    assert off.duplicated_flops - on.duplicated_flops == off.parts["up"].flops + off.parts["add"].flops
    assert off.flops - on.flops == off.parts["up"].flops - on.parts["up"].flops + off.parts["add"].flops
    for part in ("router", "down", "experts", "shared", "norm"):
        assert on.parts[part] == off.parts[part], part


def test_collectives_at_tp8_by_hand() -> None:
    off = mode_counts("off", tp=8, num_tokens=64)
    on = mode_counts("on", tp=8, num_tokens=64)
    latent, hidden = 64 * L * 2, 64 * H * 2
    assert off.parts["latent_all_reduce"].payload_bytes == latent == 458_752
    assert off.parts["latent_all_reduce"].comm_bytes == 2 * 7 * latent // 8 == 802_816
    assert off.parts["shared_all_reduce"].payload_bytes == on.parts["final_all_reduce"].payload_bytes == hidden
    assert on.parts["final_all_reduce"].comm_bytes == 2 * 7 * hidden // 8 == 1_605_632
    assert off.comm_bytes == on.comm_bytes == 802_816 + 1_605_632
    assert [p for p in on.parts if p.endswith(("all_reduce", "gather", "scatter"))] == ["latent_all_reduce",
                                                                                          "final_all_reduce"]
    assert off.parts["experts"].flops == 6 * 64 * K * L * (I // 8)
    assert off.parts["shared"].flops == 6 * 64 * H * (2 * I // 8)
    assert off.parts["router"].flops == 2 * 64 * H * E


def test_sp_splits_the_tokens() -> None:
    sp = mode_counts("sp", tp=8, num_tokens=1001)   # 126 tokens per rank, 1008 after padding
    assert sp.parts["up"].flops == 2 * 126 * L * H
    assert sp.parts["shared"].flops == 6 * 126 * H * 2 * I
    assert sp.parts["experts"].flops == 6 * 126 * K * L * I
    assert sp.parts["output_all_gather"].payload_bytes == 1008 * H * 2
    assert sp.parts["output_all_gather"].comm_bytes == 7 * 1008 * H * 2 // 8
    assert sp.parts["combine_reduce_scatter"].payload_bytes == 1008 * L * 2
    assert sp.parts["dispatch_all_gather"].payload_bytes == 1008 * (L * 2 + K * (8 + 2))
    assert sp.duplicated_flops == 0
    tail = mode_counts("sp", tp=8, num_tokens=1001, scope="tail")
    assert set(tail.parts) == {"combine_reduce_scatter", "norm", "up", "add", "output_all_gather"}


def test_one_rank_every_mode_is_off() -> None:
    off = mode_counts("off", tp=1, num_tokens=64)
    assert not any(p.comm_bytes or p.payload_bytes for p in off.parts.values())
    assert off.duplicated_flops == 0
    for mode in ("on", "sp", "tiered"):
        other = mode_counts(mode, tp=1, num_tokens=64)
        assert other.effective_mode == "off"
        assert other.parts == off.parts
        assert (other.flops, other.bytes, other.comm_bytes) == (off.flops, off.bytes, off.comm_bytes)


def test_tiered_follows_its_threshold() -> None:
    assert mode_counts("tiered", tp=8, num_tokens=256).effective_mode == "off"
    assert mode_counts("tiered", tp=8, num_tokens=257).effective_mode == "on"
    config = MoeDedupConfig(mode="tiered", tier_threshold=8)
    assert mode_counts(config, tp=8, num_tokens=9).parts == mode_counts("on", tp=8, num_tokens=9).parts
    assert mode_counts(config, tp=8, num_tokens=8).parts == mode_counts("off", tp=8, num_tokens=8).parts


def test_tail_scope_and_elem_bytes() -> None:
    tail = mode_counts("off", tp=2, num_tokens=3, shape=TEST_SHAPE, scope="tail", elem_bytes=4)
    assert list(tail.parts) == ["latent_all_reduce", "norm", "up", "shared_all_reduce", "add"]
    assert tail.parts["latent_all_reduce"].payload_bytes == 3 * 128 * 4
    assert tail.to_dict()["flops"] == tail.flops == 4 * 3 * 128 + 2 * 3 * 128 * 256 + 3 * 256


def test_bad_input_is_named() -> None:
    with pytest.raises(ValueError, match=r"scope: invalid value 'all'; valid choices: tail, layer"):
        mode_counts("off", tp=8, num_tokens=1, scope="all")
    with pytest.raises(ValueError, match=r"num_tokens: invalid value 0"):
        mode_counts("off", tp=8, num_tokens=0)
    with pytest.raises(ValueError, match=r"MoeDedupConfig.mode: invalid value 'fast'"):
        mode_counts("fast", tp=8, num_tokens=1)
    with pytest.raises(ValueError, match=r"world_size: invalid value 5; it must divide moe_intermediate \(3072\)"):
        mode_counts("off", tp=5, num_tokens=1)
    with pytest.raises(ValueError, match=r"world_size: invalid value 3; it must divide num_experts \(896\)"):
        mode_counts("sp", tp=3, num_tokens=1)
    with pytest.raises(ValueError, match=r"world_size: invalid value 3; it must divide hidden \(7168\)"):
        mode_counts("on", tp=3, num_tokens=1)
    assert mode_counts("off", tp=3, num_tokens=1, shape=K3_MOE).tp == 3
