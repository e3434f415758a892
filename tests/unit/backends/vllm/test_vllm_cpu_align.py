"""The align-mode state moves (cpu/mamba_align.py) against vLLM.

What is copied comes from vLLM's own copy specs (`get_conv_copy_spec` / `get_temporal_copy_spec`,
model_executor/layers/mamba/mamba_utils.py:384-423, applied as `collect_mamba_copy_meta` does,
v1/worker/mamba_utils.py:1345-1384); the layout tables are filled as `_populate_metadata` fills them
(:983-1080); when to copy is transcribed from the Triton kernels (postprocess :445-475, precopy :603-612);
the conv-dim-first window shift from `_copy_mamba_state_block` (:256-304).
"""

from __future__ import annotations

import torch

from ablations.backends.vllm.in_vllm.cpu import mamba_align

BLOCKS, DIM, STATE_LEN, BLOCK_SIZE = 20, 3, 5, 4


def make_states(seed: int = 0):
    """Group 0: a conv state (SD: [blocks, state_len, dim]) and a recurrent state; group 1: another conv state."""
    g = torch.Generator().manual_seed(seed)
    conv = torch.randn(BLOCKS, STATE_LEN, DIM, generator=g)
    ssm = torch.randn(BLOCKS, 2, 4, 4, generator=g)
    conv2 = torch.randn(BLOCKS, STATE_LEN, DIM, generator=g)
    return [conv, ssm, conv2]


KINDS = ["conv", "temporal", "conv"]
GROUPS = [0, 0, 1]


def state_row(state, kind, dim_first):
    """(conv width, inner size, dim rows, dim row stride in bytes) of one state, as `_populate_metadata` sets them."""
    if kind != "conv":
        return 0, state[0].numel(), 0, 0
    if dim_first:
        return state.size(2), 1, state.size(1), state.stride(1) * state.element_size()
    return state.size(1), state.stride(1), 0, 0


def layout(states, tables, dim_first=False):
    """The state-layout tables of MambaSpecDecodeGPUContext (v1/worker/mamba_utils.py:983-1080)."""
    widths, inner, rows, row_strides = zip(*(state_row(s, k, dim_first) for s, k in zip(states, KINDS, strict=True)),
                                           strict=True)
    return dict(
        block_table_ptrs=torch.tensor([t.data_ptr() for t in tables]),
        block_table_stride_req=tables[0].stride(0),
        state_base_addrs=torch.tensor([s.data_ptr() for s in states]),
        state_block_strides=torch.tensor([s.stride(0) * s.element_size() for s in states]),
        state_elem_sizes=torch.tensor([s.element_size() for s in states], dtype=torch.int32),
        state_inner_sizes=torch.tensor(inner),
        state_conv_widths=torch.tensor(widths, dtype=torch.int32),
        state_group_indices=torch.tensor(GROUPS, dtype=torch.int32),
        state_dim_row_count=torch.tensor(rows, dtype=torch.int32),
        state_dim_row_stride=torch.tensor(row_strides),
    )


def block_tables():
    """Four requests (rows) per group, disjoint blocks, a padded row stride."""
    t0 = torch.arange(1, 17, dtype=torch.int32).view(4, 4)
    t0 = torch.cat([t0, torch.zeros(4, 2, dtype=torch.int32)], dim=1)
    return [t0, (t0 + 3) % BLOCKS]


def assert_same(states, want):
    for got, expected in zip(states, want, strict=True):
        assert torch.equal(got, expected)


def vllm_copy(states, tables, row, src_col, dst_col, bias):
    """Every state of request `row` moved as vLLM's V1 path does: its copy spec's source bytes to the
    destination block's start."""
    from vllm.model_executor.layers.mamba.mamba_utils import get_conv_copy_spec, get_temporal_copy_spec

    specs = [get_conv_copy_spec if kind == "conv" else get_temporal_copy_spec for kind in KINDS]
    for state, spec_fn, group in zip(states, specs, GROUPS, strict=True):
        block_ids = tables[group][row].tolist()
        spec = spec_fn(state, block_ids, src_col, bias + 1)
        start = (spec.start_addr - state.data_ptr()) // state.element_size()
        data = state.view(-1)[start : start + spec.num_elements].clone()
        state[block_ids[dst_col]].view(-1)[: spec.num_elements] = data


def test_precopy_matches_vllm_copy_specs(vllm, monkeypatch):
    monkeypatch.setenv("VLLM_SSM_CONV_STATE_LAYOUT", "SD")
    states, tables = make_states(), block_tables()
    want = [s.clone() for s in states]
    dst_col, src_col, bias = torch.tensor([2, 3, 1]), torch.tensor([0, -1, 1]), torch.tensor([1, 0, 0])
    idx_mapping = torch.tensor([2, -1, 0, 1])  # batch -> row; -1: padding
    for row in (2, 0, 1):
        if src_col[row] >= 0 and src_col[row] != dst_col[row]:
            vllm_copy(want, tables, row, int(src_col[row]), int(dst_col[row]), int(bias[row]))
    mamba_align.precopy_mamba_align_fused_kernel(dst_col, src_col, bias, idx_mapping=idx_mapping, num_reqs=4,
                                                 HAS_IDX_MAPPING=True, **layout(states, tables))
    assert_same(states, want)
    assert not torch.equal(states[0], make_states()[0])


def postprocess_reference(states, tables, rows, accepted, src_col, running, accepted_out):
    """postprocess_mamba_fused_kernel's decisions (v1/worker/mamba_utils.py:445-475) for `rows`, where `running`
    is computed + scheduled - drafts (V1) or new_computed - accepted + 1 (V2); copies by vLLM's specs."""
    for row in rows:
        new_computed = int(running[row]) + int(accepted[row]) - 1
        aligned = new_computed // BLOCK_SIZE * BLOCK_SIZE
        if aligned < int(running[row]):
            continue
        bias, dst = aligned - int(running[row]), aligned // BLOCK_SIZE - 1
        if int(src_col[row]) == dst:
            accepted_out[row] = 1
            if bias == 0:
                continue
        vllm_copy(states, tables, row, int(src_col[row]), dst, bias)


def run_postprocess(states, tables, accepted, src_col, scheduled, computed, draft, accepted_out, idx_mapping,
                    num_reqs, **flags):
    lay = layout(states, tables)
    mamba_align.postprocess_mamba_fused_kernel(
        accepted, src_col, scheduled, computed, draft, lay["block_table_ptrs"], lay["block_table_stride_req"],
        lay["state_base_addrs"], lay["state_block_strides"], lay["state_elem_sizes"], lay["state_inner_sizes"],
        lay["state_conv_widths"], lay["state_group_indices"], lay["state_dim_row_count"], lay["state_dim_row_stride"],
        accepted_out, idx_mapping, num_reqs, block_size=BLOCK_SIZE, **flags,
    )


def test_postprocess_matches_vllm_decisions_and_copy_specs(vllm, monkeypatch):
    """4-token blocks, 2 drafts. Rows: the boundary inside the running block (a shifted self-copy), a boundary
    state taken from another column, no boundary reached, the running state itself on a boundary."""
    monkeypatch.setenv("VLLM_SSM_CONV_STATE_LAYOUT", "SD")
    states, tables = make_states(seed=1), block_tables()
    want = [s.clone() for s in states]
    accepted = torch.tensor([3, 2, 2, 1], dtype=torch.int32)
    src_col = torch.tensor([0, 2, 0, 2], dtype=torch.int32)
    scheduled, computed, draft = torch.tensor([3, 3, 3, 3]), torch.tensor([2, 6, 0, 7]), torch.tensor([2, 2, 2, 2])
    want_out = accepted.clone()
    postprocess_reference(want, tables, range(4), accepted, src_col, computed + scheduled - draft, want_out)
    got_out = accepted.clone()
    run_postprocess(states, tables, accepted, src_col, scheduled, computed, draft, got_out, None, 4)
    assert got_out.tolist() == want_out.tolist() == [1, 2, 2, 1]
    assert_same(states, want)
    assert not torch.equal(states[1], make_states(seed=1)[1])


def test_postprocess_with_precomputed_counts_and_row_mapping(vllm, monkeypatch):
    """The V2 form: num_computed already advanced, batch rows mapped to requests; request 2 is not scheduled."""
    monkeypatch.setenv("VLLM_SSM_CONV_STATE_LAYOUT", "SD")
    states, tables = make_states(seed=2), block_tables()
    want = [s.clone() for s in states]
    accepted = torch.tensor([2, 3, 2], dtype=torch.int32)
    src_col = torch.tensor([1, 0, 0], dtype=torch.int32)
    new_computed = torch.tensor([8, 5, 8])
    want_out = accepted.clone()
    postprocess_reference(want, tables, [1, 0], accepted, src_col, new_computed - accepted + 1, want_out)
    got_out = accepted.clone()
    run_postprocess(states, tables, accepted, src_col, None, new_computed, None, got_out, torch.tensor([1, 0]), 2,
                    HAS_IDX_MAPPING=True, PRECOMPUTED_NEW_COMPUTED=True)
    assert got_out.tolist() == want_out.tolist() == [1, 1, 2]
    assert_same(states, want)


def test_precopy_shifts_dim_first_conv_windows_per_row():
    """DS conv layout ([blocks, dim, state_len]): each dim row's tokens [bias, width) land at [0, width - bias)."""
    g = torch.Generator().manual_seed(3)
    states = [torch.randn(BLOCKS, DIM, STATE_LEN, generator=g), torch.randn(BLOCKS, 2, 4, 4, generator=g),
              torch.randn(BLOCKS, DIM, STATE_LEN, generator=g)]
    tables = block_tables()
    want = [s.clone() for s in states]
    for state, kind, group in zip(want, KINDS, GROUPS, strict=True):
        src, dst = int(tables[group][0, 0]), int(tables[group][0, 3])
        if kind == "conv":
            state[dst, :, : STATE_LEN - 2] = state[src, :, 2:].clone()
        else:
            state[dst] = state[int(tables[group][0, 2])].clone()
    mamba_align.precopy_mamba_align_fused_kernel(
        torch.tensor([3]), torch.tensor([0]), torch.tensor([2]), idx_mapping=None, num_reqs=1,
        CONV_STATE_DIM_FIRST=True, HAS_IDX_MAPPING=False, **layout(states, tables, dim_first=True),
    )
    assert_same(states, want)
