"""kda_overlap's benchmark cases: the K3 shapes, the analytic counts, and pairs that compute the same step."""

import torch

from opts.kda_overlap import OPTIMIZATION
from opts.kda_overlap.cases import make_case, step_bytes, step_flops
from opts.kda_overlap.inputs import StepShape


def test_cases_are_k3_per_rank_shapes():
    full = OPTIMIZATION.bench_cases(False, "cpu")
    assert [c.name for c in full] == ["mixed_2x2048_prefill+32x4_verify", "verify_only_32x4", "prefill_only_2x2048"]
    mixed = full[0].info["shape"]
    assert mixed == {"prefill_lens": [2048, 2048], "verify_lens": [4] * 32, "num_heads": 12, "dk": 128, "dv": 128}
    quick = OPTIMIZATION.bench_cases(True, "cpu")
    assert len(quick) == 3 and all(c.name.startswith("quick_") for c in quick)
    assert all(c.bytes > 0 and c.flops > 0 for c in full + quick)


def test_counts_by_hand():
    # 1 head, dk = dv = 2: a 3-token prefill segment, a 2-token verification row and an empty one, fp32.
    shape = StepShape((3,), (2, 0), num_heads=1, dk=2, dv=2)
    # tokens: 5 x (q, k, g: 2 each; v: 2; beta: 1) x 4 B in, 5 x 2 x 4 B of o out = 180 + 40
    # states: 3 starting states read, 1 prefill final + 2 verification positions written, 16 B each = 96
    assert step_bytes(shape) == 220 + 96
    # prefill chunk L=3: 4·9·2 + 9·4 + 4·3·4 + 2·9·2 + 2·3·4 = 216; verification row L=2: 32+16+32+16+24 = 120
    assert step_flops(shape) == 216 + 120


def test_a_case_runs_off_and_on_on_the_same_step():
    case = make_case("tiny", StepShape((70,), (4, 0, 4), 3, 16, 16), "cpu")
    pair = case.setup()
    off, on = pair.off(), pair.on()
    assert off is not on
    for name in ("o", "prefill_final_state", "verify_states"):
        torch.testing.assert_close(getattr(on, name), getattr(off, name), rtol=2e-5, atol=2e-5)

