"""A written timed_trace replays unchanged in vLLM's `timed_trace` dataset and fits aiperf's `mooncake_trace`.

vLLM is driven in-process through the same parser and `get_samples` that `vllm bench serve` uses, with
`--timed-trace-chunk-hash-size <block size> --timed-trace-sec-multiplier 0.001` (timestamps are ms).
"""

from __future__ import annotations

import json

import pytest

from ablations.backends.vllm.launch.runtime import hide_media_wheels
from ablations.workload import Trace, generate, preset, write_trace


def _tokenizer():
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, "[PAD]": 1, **{f"w{i}": i + 2 for i in range(1022)}}
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="[UNK]")),
                                   unk_token="[UNK]", pad_token="[PAD]")


@pytest.fixture(scope="module")
def small() -> Trace:
    return generate(preset("agentx_small"), seed=2)


@pytest.fixture(scope="module")
def vllm_samples(small, tmp_path_factory):
    path = write_trace(small, tmp_path_factory.mktemp("vllm") / "timed.jsonl", "timed_trace")
    hide_media_wheels()
    from vllm.benchmarks.datasets.datasets import add_dataset_parser, get_samples
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_dataset_parser(parser)
    args = parser.parse_args(["--dataset-name", "timed_trace", "--dataset-path", str(path),
                              "--timed-trace-chunk-hash-size", str(small.block_size),
                              "--timed-trace-sec-multiplier", "0.001", "--num-prompts", str(10**6)])
    return get_samples(args, _tokenizer())


def test_vllm_builds_prompts_of_the_right_length_and_timing(small, vllm_samples):
    assert len(vllm_samples) == len(small.requests)
    for sample, request in zip(vllm_samples, small.requests, strict=True):
        assert sample.prompt_len == len(sample.prompt) == request.input_length
        assert sample.expected_output_len == request.output_length
        assert sample.timestamp == pytest.approx(request.timestamp_ms / 1000)


def _assert_shared_prefix(a: list[int], b: list[int], num_blocks: int, block_size: int) -> None:
    cut = num_blocks * block_size
    assert a[:cut] == b[:cut]
    assert a[cut:cut + block_size] != b[cut:cut + block_size]


def test_vllm_prompts_share_exactly_the_prefixes_the_hash_ids_say(small, vllm_samples):
    block = small.block_size
    tokens = {(r.session, r.turn): s.prompt for r, s in zip(small.requests, vllm_samples, strict=True)}
    requests = {(r.session, r.turn): r for r in small.requests}
    for session in small.sessions.values():
        for turn in range(1, session.num_turns):
            before = requests[session.session_id, turn - 1]
            _assert_shared_prefix(tokens[session.session_id, turn - 1], tokens[session.session_id, turn],
                                  before.input_length // block, block)
        if session.parent is not None:
            parent_first = requests[session.parent[0], 0]
            _assert_shared_prefix(tokens[session.parent[0], 0], tokens[session.session_id, 0],
                                  parent_first.input_length // block, block)
    firsts = [tokens[s.session_id, 0] for s in small.root_sessions]
    system_blocks = preset("agentx_small").system_prompt_tokens // block
    for other in firsts[1:]:
        _assert_shared_prefix(firsts[0], other, system_blocks, block)


# aiperf 0.13.0, aiperf/dataset/loader/models.py `MooncakeTrace` and generator/prompt.py
# `_build_token_sequence`: exactly one input mode (`input_length` here); `timestamp` int|float in ms;
# `session_id`/`delay` would make rows turns of multi-turn conversations; `extra` is merged into the
# request body; `type` must be "mooncake_trace"; other keys are allowed (extra="allow") and unused.
AIPERF_FIELDS = {"input_length": int, "output_length": int, "hash_ids": list, "timestamp": (int, float)}
AIPERF_MEANINGFUL_EXTRAS = {"text_input", "messages", "tools", "payload", "delay", "session_id", "extra", "type",
                            "context_mode"}


def test_written_rows_fit_aiperfs_mooncake_trace_schema(small, tmp_path):
    path = write_trace(small, tmp_path / "timed.jsonl", "timed_trace")
    sizes: dict[int, int] = {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        assert not set(row) & AIPERF_MEANINGFUL_EXTRAS
        for name, kind in AIPERF_FIELDS.items():
            assert isinstance(row[name], kind) and not isinstance(row[name], bool)
        assert all(isinstance(h, int) for h in row["hash_ids"])
        length, ids, block = row["input_length"], row["hash_ids"], row["block_size"]
        assert (len(ids) - 1) * block < length <= len(ids) * block  # aiperf's exact-tile / last-block-partial
        for index, h in enumerate(ids):  # aiperf materializes one block per id: one size per id
            size = block if index < len(ids) - 1 else length - (len(ids) - 1) * block
            assert sizes.setdefault(h, size) == size
