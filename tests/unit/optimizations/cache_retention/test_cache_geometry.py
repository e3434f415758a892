"""The hybrid cache's geometry as vLLM lays it out for K3 and for the tiny model."""

import pytest

from opts.k3 import K3
from opts.k3.cache.geometry import K3_TP8, TINY, group_layout, k3_geometry


def test_tiny_model_on_vllm_cpu():
    """fp32: KDA state page 3*4*64*3*4 (conv) + 4*64*64*4 (recurrent) = 74752 B fits 128 tokens * 576 * 4 B = 294912,
    so B = 128; 2 KDA and 2 MLA layers make one group of 2: 589824 B a block, 2^30 / 589824 = 1820.4 -> 1820 blocks
    (vLLM-CPU's count for 1 GiB)."""
    assert (TINY.block_size, TINY.num_attn_groups, TINY.num_state_groups) == (128, 1, 1)
    assert TINY.block_bytes == 589824
    assert TINY.num_blocks(2**30) == 1820
    assert (TINY.state_bytes, TINY.latent_bytes_per_token) == (2 * 74752, 2 * 2304)


def test_k3_at_tp8():
    """bf16 latent, 12 KDA heads a rank: state page 3*12*128*3*2 + 12*128*128*4 = 814080 B, 5.52 pages of 128 tokens *
    1152 B, so B = 6 * 128 = 768; 69 KDA and 24 MLA layers: groups of 24, 3 KDA groups and 1 MLA group."""
    assert (K3_TP8.block_size, K3_TP8.num_state_groups, K3_TP8.num_attn_groups) == (768, 3, 1)
    assert K3_TP8.block_bytes == 768 * 1152 * 24
    assert K3_TP8.state_bytes == 69 * 814080
    assert K3_TP8.num_blocks(2**30) == 50
    assert k3_geometry(K3, tp=8) == K3_TP8


@pytest.mark.parametrize(("num_state", "num_attn", "layout"), [(69, 24, (24, 3, 1)), (2, 2, (2, 1, 1)),
                                                               (24, 69, (24, 1, 3)), (3, 4, (4, 1, 1))])
def test_group_layout(num_state, num_attn, layout):
    """Groups of the larger count when it is under 1.5x the smaller (2, 2 and 3, 4), else of the smaller (69 vs 24)."""
    assert group_layout(num_state, num_attn) == layout
