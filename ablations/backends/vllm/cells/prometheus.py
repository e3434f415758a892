"""vLLM's own counters, read from a server's `/metrics` (Prometheus text): prefix-cache queries and hits,
spec-decode drafts, draft tokens and accepted tokens (in all and per position), preemptions, prompt and generated
tokens, finished requests."""

from __future__ import annotations

from typing import Any

from prometheus_client.parser import text_string_to_metric_families

COUNTERS = {
    "prefix_cache_queries": "vllm:prefix_cache_queries",
    "prefix_cache_hits": "vllm:prefix_cache_hits",
    "spec_decode_num_drafts": "vllm:spec_decode_num_drafts",
    "spec_decode_num_draft_tokens": "vllm:spec_decode_num_draft_tokens",
    "spec_decode_num_accepted_tokens": "vllm:spec_decode_num_accepted_tokens",
    "num_preemptions": "vllm:num_preemptions",
    "prompt_tokens": "vllm:prompt_tokens",
    "generation_tokens": "vllm:generation_tokens",
    "requests_finished": "vllm:request_success",
}
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"


def read_counters(text: str) -> dict[str, Any]:
    """The COUNTERS (summed over labels; 0 when vLLM did not export one) and the accepted tokens per draft
    position (`accepted_per_pos`, a list from position 0)."""
    totals: dict[str, float] = {}
    per_pos: dict[int, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            name = sample.name.removesuffix("_total")
            if name == PER_POSITION:
                position = int(sample.labels.get("position", 0))
                per_pos[position] = per_pos.get(position, 0.0) + sample.value
            else:
                totals[name] = totals.get(name, 0.0) + sample.value
    out: dict[str, Any] = {key: totals.get(name, 0.0) for key, name in COUNTERS.items()}
    out["accepted_per_pos"] = [per_pos[p] for p in sorted(per_pos)]
    return out


def difference(after: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    """What happened between two reads: each counter's increase, per position too."""
    out = {k: after[k] - before.get(k, 0.0) for k in COUNTERS}
    prior = before.get("accepted_per_pos", [])
    out["accepted_per_pos"] = [v - (prior[i] if i < len(prior) else 0.0)
                               for i, v in enumerate(after["accepted_per_pos"])]
    return out
