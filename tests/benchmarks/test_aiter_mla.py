"""aiter_mla under pytest-benchmark: one K3 MLA decode step, off (split-KV) and on (the vendor kernel) together."""

import pytest

from opts.aiter_mla.dispatch import missing
from opts.base import BenchCase

OPTIMIZATION = "aiter_mla"


def test_aiter_mla(bench_case: BenchCase, run_bench) -> None:
    reason = missing(bench_case.info["on_backend"])
    if reason:
        pytest.skip(reason)
    run_bench(bench_case)
