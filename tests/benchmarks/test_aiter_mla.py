"""aiter_mla under pytest-benchmark: one K3 MLA decode step, off (gather then attend) and on (split-KV)."""

from opts.base import BenchCase

OPTIMIZATION = "aiter_mla"


def test_aiter_mla(bench_case: BenchCase, bench_side: str, run_bench) -> None:
    run_bench(bench_case, bench_side)
