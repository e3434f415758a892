"""Fixed-length workloads as InferenceX and `vllm bench serve --dataset-name random` run them: every request a
prompt of random tokens of one input length (ISL) answered by one output length (OSL), nothing shared between
prompts, replayed in a closed loop: each request its own session, so at `concurrency` c the next request is sent as
soon as one of the c in flight finishes."""

from __future__ import annotations

from dataclasses import dataclass

from ablations.workload.trace import Request, Trace, num_blocks

FIXED_BLOCK_SIZE = 64


@dataclass(frozen=True)
class FixedLengths:
    """`num_requests` requests of `input_length` prompt tokens and `output_length` answer tokens (ignore-EOS, as the
    benchmarks run them), hashed in blocks of `block_size` tokens that no two prompts share."""

    input_length: int
    output_length: int
    num_requests: int
    block_size: int = FIXED_BLOCK_SIZE

    def __post_init__(self) -> None:
        for name in ("input_length", "output_length", "num_requests", "block_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"FixedLengths.{name}: invalid value {value!r}; valid: an integer >= 1")

    @property
    def label(self) -> str:
        """"1k/1k", "8k/1k", "1000/500": the lengths as the benchmarks name them."""
        def short(n: int) -> str:
            return f"{n // 1024}k" if n % 1024 == 0 else f"{n // 1000}k" if n % 1000 == 0 else str(n)
        return f"{short(self.input_length)}/{short(self.output_length)}"


def fixed_trace(lengths: FixedLengths) -> Trace:
    """The workload's trace: request i is session "r<i>" of one turn, its blocks hashed with ids of its own, all
    at time 0 (a closed loop releases them as concurrency allows)."""
    per = num_blocks(lengths.input_length, lengths.block_size)
    requests = tuple(Request(0.0, lengths.input_length, lengths.output_length, tuple(range(i * per, (i + 1) * per)),
                             session=f"r{i}", turn=0) for i in range(lengths.num_requests))
    return Trace(requests, lengths.block_size, source=f"fixed {lengths.label} x {lengths.num_requests}")
