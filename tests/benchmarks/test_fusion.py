"""fusion under pytest-benchmark: the KDA decode step and the MLA q/kv norms at K3's per-rank shapes, off
(vLLM's separate passes, each compiled like the fused one) and on (one fused pass), checked then timed
together; the attention residual's cases are counterfactual (vLLM has no unfused path), named so and marked
`counterfactual` in extra_info. Bytes, kernels and allocations of both paths in extra_info."""

from opts.base import BenchCase

OPTIMIZATION = "fusion"


def test_fusion(bench_case: BenchCase, run_bench) -> None:
    run_bench(bench_case)
