"""kda_overlap: off and on equal each other and the float64 reference; on keeps every verification state."""

import dataclasses

import pytest
import torch

import opts.kda_overlap.packed as packed
from opts.kda_overlap import (
    OPTIMIZATION,
    KdaOverlapConfig,
    MixedStep,
    StepOutput,
    reference_step,
    step_off,
    step_on,
    step_streams,
)
from opts.kda_overlap.inputs import StepShape, random_kda_tensors, random_state, random_step
from opts.kda_overlap.packed import PackPlan, chunk_kda_packed
from opts.kda_overlap.reference import chunk_kda, recurrent_kda_states

F64 = torch.float64
# lengths 1 and not a multiple of the chunk, a long prefill over many chunks, a row with nothing to verify,
# rows of several lengths, 3 heads (not a power of two), dk != dv, non-zero initial states everywhere
SHAPE = StepShape(prefill_lens=(1, 70, 37), verify_lens=(4, 0, 4, 3, 1, 4), num_heads=3, dk=32, dv=16)
# (o, states) tolerances against the float64 reference; o is rounded to the tokens' dtype
TOLERANCES = {torch.float32: (2e-5, 2e-5), torch.bfloat16: (1.6e-2, 2e-5)}
FIELDS = ("o", "prefill_final_state", "verify_states")


def poisoned(batch):
    out = StepOutput.empty(batch, fill=float("nan"))
    assert torch.isnan(out.o).all()
    return out


def assert_matches(out, ref, dtype):
    o_tol, state_tol = TOLERANCES[dtype]
    assert out.o.dtype == dtype and out.verify_states.dtype == torch.float32
    for name in FIELDS:
        got = getattr(out, name)
        assert not torch.isnan(got).any(), f"{name}: entries left unwritten"
        tol = o_tol if name == "o" else state_tol
        torch.testing.assert_close(got.to(F64), getattr(ref, name), rtol=tol, atol=tol, msg=name)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("chunk_size", [16, 64])
def test_off_and_on_equal_the_float64_reference(dtype, chunk_size):
    batch = random_step(SHAPE, dtype=dtype, seed=11)
    ref = reference_step(batch.to(F64, state_dtype=F64))
    outs = {}
    for fn in (step_off, step_on):
        outs[fn.__name__] = fn(batch, chunk_size=chunk_size, out=poisoned(batch))
        assert_matches(outs[fn.__name__], ref, dtype)
    for name in FIELDS:
        torch.testing.assert_close(getattr(outs["step_on"], name), getattr(outs["step_off"], name),
                                   rtol=2e-5, atol=TOLERANCES[dtype][0], msg=name)


def test_verification_states_are_the_recurrent_states_at_each_position():
    batch = random_step(SHAPE, seed=4)
    out = step_on(batch, out=poisoned(batch))
    row = 3                                                         # three tokens to verify
    start = batch.token_bounds[batch.num_prefill + row]
    sl = slice(start, start + batch.verify_lens[row])
    _, states = recurrent_kda_states(*(x.to(F64) for x in batch.token_slices(sl)),
                                     initial_state=batch.verify_state[row:row + 1].to(F64))
    vs = batch.verify_bounds
    torch.testing.assert_close(out.verify_states[vs[row]:vs[row + 1]].to(F64), states[0], rtol=2e-5, atol=2e-5)
    # rolling back to the first accepted position resumes exactly: continuing from it equals the reference
    _, resumed = recurrent_kda_states(*(x[:, 1:].to(F64) for x in batch.token_slices(sl)),
                                      initial_state=out.verify_states[vs[row]][None].to(F64))
    torch.testing.assert_close(resumed[0, -1], states[0, -1], rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("shape", [StepShape((130, 64), (), 3, 16, 16), StepShape((), (4, 4, 0, 4), 3, 16, 16)],
                         ids=["prefill_only", "verify_only"])
def test_single_kind_steps(shape):
    batch = random_step(shape, seed=2)
    ref = reference_step(batch.to(F64, state_dtype=F64))
    for fn in (step_off, step_on):
        assert_matches(fn(batch, chunk_size=32, out=poisoned(batch)), ref, torch.float32)


def test_packed_kernel_equals_the_varlen_reference():
    # sequences with different numbers of full chunks shrink the active set step by step; one is empty
    lens = [130, 64, 0, 200, 5]
    gen = torch.Generator().manual_seed(8)
    q, k, v, g, beta = random_kda_tensors((sum(lens),), 3, 16, 8, dtype=torch.float32, generator=gen)
    s0 = random_state(len(lens), 3, 16, 8, generator=gen)
    plan = PackPlan.build(lens, 16)
    o = torch.full((sum(lens), 3, 8), float("nan"))
    finals = torch.full_like(s0, float("nan"))
    chunk_kda_packed(q, k, v, g, beta, plan, [s0[:2], s0[2:]], scale=0.25, o_out=o, final_out=[finals[:2], finals[2:]])
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()])
    ref_o, ref_s = chunk_kda(*(x[None].to(F64) for x in (q, k, v, g, beta)), scale=0.25, initial_state=s0.to(F64),
                             output_final_state=True, cu_seqlens=cu)
    torch.testing.assert_close(o.to(F64), ref_o[0], rtol=2e-5, atol=2e-5)
    torch.testing.assert_close(finals.to(F64), ref_s, rtol=2e-5, atol=2e-5)


def test_fast_decay_takes_the_pairwise_path(monkeypatch):
    # log decays of about -8 per token: a 16-token subchunk spans e^120, past fp32; the guard must catch it
    batch = random_step(StepShape((80,), (4, 4), 2, 16, 16), seed=5, decay=60.0)
    ref = reference_step(batch.to(F64, state_dtype=F64))
    assert_matches(step_on(batch, chunk_size=64, out=poisoned(batch)), ref, torch.float32)
    monkeypatch.setattr(packed, "MAX_SPAN", float("inf"))
    unguarded = step_on(batch, chunk_size=64, out=poisoned(batch))
    assert not torch.isfinite(unguarded.o).all()


def _count_kernel_calls(monkeypatch):
    import opts.kda_overlap.naive as naive
    import opts.kda_overlap.step as step

    calls = {"recurrent": 0, "packed_rows": []}
    recurrent, packed_kernel = naive.recurrent_kda_rows, step.chunk_kda_packed

    def counted_recurrent(*args, **kwargs):
        calls["recurrent"] += 1
        return recurrent(*args, **kwargs)

    def counted_packed(q, *args, **kwargs):
        calls["packed_rows"].append(q.shape[0])
        return packed_kernel(q, *args, **kwargs)

    monkeypatch.setattr(naive, "recurrent_kda_rows", counted_recurrent)
    monkeypatch.setattr(naive, "chunk_kda_packed", counted_packed)
    monkeypatch.setattr(step, "chunk_kda_packed", counted_packed)
    return calls


@pytest.mark.parametrize("mode", ["off", "on"])
def test_off_runs_two_passes_and_on_one(mode, monkeypatch):
    batch = random_step(StepShape((20,), (2, 0, 3), 2, 8, 8), seed=1)
    calls = _count_kernel_calls(monkeypatch)
    out = {"off": step_off, "on": step_on}[mode](batch, chunk_size=16, out=poisoned(batch))
    assert not torch.isnan(out.verify_states).any()
    if mode == "on":   # one packed pass over all 25 tokens, no recurrent pass
        assert calls == {"recurrent": 0, "packed_rows": [25]}
    else:              # verification recurrent, then the 20 prefill tokens chunked
        assert calls == {"recurrent": 1, "packed_rows": [20]}
    assert OPTIMIZATION.config(mode=mode).is_on == (mode == "on")


def test_bench_cases_time_off_against_on(monkeypatch):
    case = OPTIMIZATION.bench_cases(True, "cpu")[0]
    assert "mixed" in case.name
    pair = case.setup()
    calls = _count_kernel_calls(monkeypatch)
    pair.on()
    assert calls["recurrent"] == 0 and len(calls["packed_rows"]) == 1
    pair.off()
    assert calls["recurrent"] == 1 and len(calls["packed_rows"]) == 2


def test_bad_configs_and_steps_are_named():
    with pytest.raises(ValueError, match=r"mode: invalid value 'fast'; valid choices: off, on, streams"):
        KdaOverlapConfig(mode="fast")
    with pytest.raises(ValueError, match="chunk_size: invalid value 48"):
        KdaOverlapConfig(chunk_size=48)
    batch = random_step(StepShape((20,), (2, 0), 2, 8, 8), seed=1)
    with pytest.raises(ValueError, match=r"MixedStep\.prefill_lens \+ verify_lens: sum to 23 tokens but q holds 22"):
        dataclasses.replace(batch, prefill_lens=(21,))
    with pytest.raises(ValueError, match=r"MixedStep\.verify_state: expected shape"):
        dataclasses.replace(batch, verify_state=batch.verify_state[:1])
    with pytest.raises(ValueError, match=r"MixedStep\.verify_lens: lengths must be >= 0"):
        MixedStep(batch.q, batch.k, batch.v, batch.g, batch.beta, (24,), (-2, 0), batch.prefill_state,
                  batch.verify_state)
    with pytest.raises(ValueError, match=r"out\.o: expected a contiguous tensor of shape"):
        step_on(batch, out=StepOutput(torch.empty(3), batch.prefill_state.clone(), torch.empty(2, 2, 8, 8)))
    long_rows = random_step(StepShape((), (20,), 2, 8, 8), seed=1)
    with pytest.raises(ValueError, match="needs <= chunk_size \\(16\\) tokens, got 20"):
        step_on(long_rows, chunk_size=16)
    with pytest.raises(ValueError, match="'streams': needs a CUDA or ROCm device"):
        step_streams(batch)
    with pytest.raises(ValueError, match="g: KDA log decays must be <= 0"):
        step_on(dataclasses.replace(batch, g=batch.g.abs()))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="two streams need a CUDA or ROCm device")
def test_streams_equal_off_on_a_gpu():
    batch = random_step(SHAPE, seed=3, device="cuda")
    off = step_off(batch, out=poisoned(batch))
    streams = step_streams(batch, out=poisoned(batch))
    torch.cuda.synchronize()
    for name in FIELDS:
        torch.testing.assert_close(getattr(streams, name), getattr(off, name), rtol=0, atol=0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_steps_match_the_reference(seed):
    gen = torch.Generator().manual_seed(seed)

    def draw(low, high, count):
        return tuple(int(x) for x in torch.randint(low, high + 1, (count,), generator=gen))

    shape = StepShape(draw(1, 90, draw(0, 3, 1)[0]), draw(0, 8, draw(0, 6, 1)[0]), num_heads=draw(1, 5, 1)[0],
                      dk=16, dv=8)
    batch = random_step(shape, seed=seed)
    ref = reference_step(batch.to(F64, state_dtype=F64))
    for fn in (step_off, step_on):
        assert_matches(fn(batch, chunk_size=16, out=poisoned(batch)), ref, torch.float32)


def reference_checkpoints(batch, checkpoints):
    """The float64 reference's state of each prefill segment after its first `checkpoints[n]` tokens (0: its
    starting state): a step of those prefixes alone."""
    bounds = batch.token_bounds
    tokens = torch.tensor([t for n, c in enumerate(checkpoints) for t in range(bounds[n], bounds[n] + c)],
                          dtype=torch.long)
    kept = [n for n, c in enumerate(checkpoints) if c]
    head = MixedStep(*(x.index_select(0, tokens) for x in (batch.q, batch.k, batch.v, batch.g, batch.beta)),
                     tuple(c for c in checkpoints if c), (), batch.prefill_state[kept], batch.verify_state[:0],
                     batch.scale)
    return reference_step(head.to(torch.float64, state_dtype=torch.float64)).prefill_final_state, kept


@pytest.mark.parametrize("chunk_size", [16, 32, 64])
def test_on_writes_each_checkpoint_from_the_same_pass(chunk_size):
    """ROCm's prefill checkpoints: the state after 64 tokens of a 70-token segment (mid-pass, not its final
    state), after all 64 of another (its final state), none for the rest (their rows untouched)."""
    # the short segment first: the segments' ranks in the pass (by length) are not their order; dk != dv
    batch = random_step(StepShape((9, 70, 64), (4, 0, 3), num_heads=2, dk=16, dv=32), seed=21)
    checkpoints = (0, 64, 64)
    at = torch.full((3, 2, 16, 32), float("nan"))
    out = step_on(batch, chunk_size=chunk_size, out=poisoned(batch), checkpoints=checkpoints, checkpoints_out=at)
    want, kept = reference_checkpoints(batch, checkpoints)
    torch.testing.assert_close(at[kept], want.float(), rtol=2e-5, atol=2e-5)
    assert torch.isnan(at[0]).all()
    torch.testing.assert_close(at[2], out.prefill_final_state[2])
    early, _ = reference_checkpoints(batch, (0, 48, 64))       # a checkpoint a chunk early is another state
    assert (early[0].float() - at[1]).abs().max() > 1e-2
    assert_matches(out, reference_step(batch.to(torch.float64, state_dtype=torch.float64)), torch.float32)


def test_a_checkpoint_off_the_chunk_grid_is_named():
    batch = random_step(StepShape((70,), (4,), num_heads=1, dk=16, dv=16), seed=2)
    with pytest.raises(ValueError, match=r"^snapshots\[0\]: invalid value 48; valid: 0, or a multiple of chunk_size "
                                          r"\(32\)"):
        step_on(batch, chunk_size=32, checkpoints=(48,), checkpoints_out=torch.empty(1, 1, 16, 16))
    with pytest.raises(ValueError, match=r"checkpoints: 1 offsets for 1 prefill segments need checkpoints_out"):
        step_on(batch, checkpoints=(64,))
