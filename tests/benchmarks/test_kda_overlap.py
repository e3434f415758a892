"""kda_overlap under pytest-benchmark: a K3 mixed step, a verification-only and a prefill-only step, off
(verification recurrent, then prefill chunked) and on (one packed chunked pass), checked then timed together."""

from opts.base import BenchCase

OPTIMIZATION = "kda_overlap"


def test_kda_overlap(bench_case: BenchCase, run_bench) -> None:
    run_bench(bench_case)
