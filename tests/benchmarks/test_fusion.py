"""fusion under pytest-benchmark: the KDA decode step, the MLA q/kv norms and the attention residual at K3's
per-rank shapes, off (separate passes) and on (one fused pass); bytes, kernels and allocations in extra_info."""

from opts.base import BenchCase

OPTIMIZATION = "fusion"


def test_fusion(bench_case: BenchCase, bench_side: str, run_bench) -> None:
    run_bench(bench_case, bench_side)
