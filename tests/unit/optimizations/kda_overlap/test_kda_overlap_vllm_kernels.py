"""vllm_kernels: vLLM's KDA kernel conventions over the package's off and on code.

The adapters must run exactly `step_off` / `step_on` (bit-exact against a MixedStep built by hand from vLLM's
arguments), honour vLLM's slots (initial slot from num_accepted, null rows, the state after every position),
and on must equal off within the package's 1e-5 (fp32) on a mixed step.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from kda_vllm_cases import ACCEPTED, VERIFY_CU, VERIFY_SLOTS, D, H, mixed_case

from opts.k3 import kda_gate, l2_normalize
from opts.kda_overlap import MixedStep, reference_step, step_off, step_on
from opts.kda_overlap.in_vllm import kernels as vk

LIVE_ROWS = [0, 1, 4]
NULL_TOKENS = [6, 7, 8]
TOL = {"atol": 1e-5, "rtol": 1e-5}


def by_hand(call: dict, tokens: list[int]) -> tuple[torch.Tensor, ...]:
    """(q, k, v, g, beta) of `tokens` as the package takes them, from a kernel call's vLLM arguments."""
    idx = torch.tensor(tokens, dtype=torch.long)
    bias = call.get("dt_bias", call.get("g_bias"))
    q, k = (l2_normalize(call[name][0, idx].float()) for name in ("q", "k"))
    g = kda_gate(call["raw_g"][0, idx], call["A_log"], bias, call["lower_bound"])
    return q, k, call["v"][0, idx].float(), g, torch.sigmoid(call["raw_beta"][0, idx].float())


def verify_by_hand(case) -> tuple[MixedStep, list[int]]:
    tokens = [t for r in LIVE_ROWS for t in range(VERIFY_CU[r], VERIFY_CU[r + 1])]
    sources = [VERIFY_SLOTS[r][ACCEPTED[r] - 1] for r in LIVE_ROWS]
    state = case.cache[sources].transpose(-1, -2)
    empty = torch.empty(0, H, D, D)
    return MixedStep(*by_hand(case.verify, tokens), (), (3,) * len(LIVE_ROWS), empty, state), tokens


def prefill_by_hand(case, initial: torch.Tensor) -> MixedStep:
    bounds = case.prefill["cu_seqlens"].tolist()
    lens = [b - a for a, b in itertools.pairwise(bounds)]
    kept = [n for n, length in enumerate(lens) if length]
    return MixedStep(*by_hand(case.prefill, list(range(bounds[-1]))), tuple(lens[n] for n in kept), (),
                     initial[kept].transpose(-1, -2), torch.empty(0, H, D, D))


@pytest.mark.parametrize("lower_bound", [None, -3.0])
def test_verification_runs_step_off_and_writes_every_kept_position(lower_bound):
    case = mixed_case(seed=1, lower_bound=lower_bound)
    before = case.cache.clone()
    out = torch.full((1, VERIFY_CU[-1], H, D), float("nan"))
    got, cache = vk.fused_recurrent_kda(**case.verify, initial_state=case.cache, out=out)
    assert got is out and cache is case.cache
    batch, tokens = verify_by_hand(mixed_case(seed=1, lower_bound=lower_bound))
    want = step_off(batch)
    assert torch.equal(out[0, tokens], want.o)
    assert torch.equal(out[0, NULL_TOKENS], torch.zeros(3, H, D))
    written = {}
    for i, r in enumerate(LIVE_ROWS):
        for t, slot in enumerate(VERIFY_SLOTS[r]):
            if slot > 0:
                written[slot] = want.verify_states[3 * i + t].transpose(-1, -2)
    for slot in range(case.cache.shape[0]):
        assert torch.equal(case.cache[slot], written.get(slot, before[slot])), f"slot {slot}"


@pytest.mark.parametrize("prefill_lens", [(70, 1, 9), (70, 0, 9)])
def test_prefill_runs_step_off(prefill_lens):
    case = mixed_case(seed=2, prefill_lens=prefill_lens)
    h0 = case.cache[case.prefill_slots]
    out = torch.full_like(case.prefill["v"], float("nan"))
    got, final = vk.chunk_kda_with_fused_gate(**case.prefill, initial_state=h0, output_final_state=True,
                                              use_qk_l2norm_in_kernel=True, out=out)
    want = step_off(prefill_by_hand(case, h0))
    assert got is out and torch.equal(out[0], want.o)
    kept = [n for n, length in enumerate(prefill_lens) if length]
    assert torch.equal(final[kept], want.prefill_final_state.transpose(-1, -2))
    for n in set(range(len(prefill_lens))) - set(kept):
        assert torch.equal(final[n], h0[n])


def test_prefill_without_initial_state_starts_from_zero():
    case = mixed_case(seed=3)
    got, final = vk.chunk_kda_with_fused_gate(**case.prefill, output_final_state=True, use_qk_l2norm_in_kernel=True)
    zero = torch.zeros(3, H, D, D)
    want = step_off(prefill_by_hand(case, zero))
    assert torch.equal(got[0], want.o) and torch.equal(final, want.prefill_final_state.transpose(-1, -2))


@pytest.mark.parametrize("chunk_size", [16, 64])
def test_mixed_on_runs_step_on_and_equals_off(chunk_size):
    case = mixed_case(seed=4)
    h0 = case.cache[case.prefill_slots]
    prefill = vk.Prefill.from_vllm(**case.prefill, initial_state=h0, use_qk_l2norm_in_kernel=True)
    verify = vk.Verify.from_vllm(**case.verify, initial_state=case.cache)
    o_p, finals, o_v, states = vk.mixed_on(prefill, verify, chunk_size)
    p_batch, (v_batch, _) = prefill_by_hand(case, h0), verify_by_hand(case)
    both = MixedStep(*(torch.cat([getattr(p_batch, n), getattr(v_batch, n)]) for n in ("q", "k", "v", "g", "beta")),
                     p_batch.prefill_lens, v_batch.verify_lens, p_batch.prefill_state, v_batch.verify_state)
    want = step_on(both, chunk_size=chunk_size)
    p = p_batch.q.shape[0]
    assert torch.equal(o_p, want.o[:p]) and torch.equal(o_v, want.o[p:])
    assert torch.equal(finals, want.prefill_final_state) and torch.equal(states, want.verify_states)
    off_p, off_final = vk.prefill_off(prefill, chunk_size)
    off_v, off_states = vk.verify_off(verify)
    for got, off in ((o_p, off_p), (finals, off_final), (o_v, off_v), (states, off_states)):
        torch.testing.assert_close(got, off, **TOL)
    ref = reference_step(both.to(torch.float64, state_dtype=torch.float64))
    torch.testing.assert_close(want.o.double(), ref.o, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(states.double(), ref.verify_states, atol=2e-5, rtol=2e-5)


def test_a_verification_row_longer_than_a_chunk_is_refused():
    case = mixed_case(seed=5)
    prefill = vk.Prefill.from_vllm(**case.prefill, use_qk_l2norm_in_kernel=True)
    verify = vk.Verify.from_vllm(**case.verify, initial_state=case.cache)
    with pytest.raises(ValueError, match=r"needs <= chunk_size \(2\) tokens, got 3"):
        vk.mixed_on(prefill, verify, chunk_size=2)


def test_other_scales_and_batches_are_refused():
    case = mixed_case(seed=6)
    with pytest.raises(NotImplementedError, match="only scale=dk"):
        vk.chunk_kda_with_fused_gate(**case.prefill, scale=1.0)
    two = {**case.prefill, "q": case.prefill["q"].expand(2, -1, -1, -1)}
    with pytest.raises(ValueError, match=r"q: expected a batch of 1"):
        vk.chunk_kda_with_fused_gate(**two)


def test_the_cpu_fix_runs_these_kernels():
    """The backend's S4 prefill and verification kernels are this package's off (so stock = off)."""
    from ablations.backends.vllm.in_vllm.cpu import KERNELS, kda

    assert kda.chunk_kda_with_fused_gate is vk.chunk_kda_with_fused_gate
    assert kda.fused_recurrent_kda is vk.fused_recurrent_kda
    installed = {target.rsplit(":", 1)[1]: new for target, new, *_ in KERNELS}
    assert installed["chunk_kda_with_fused_gate"] is vk.chunk_kda_with_fused_gate
    assert installed["fused_recurrent_kda"] is vk.fused_recurrent_kda
