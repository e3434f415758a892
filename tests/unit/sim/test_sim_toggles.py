"""Each toggle the simulator models acts on the default case (Kimi K3 on MI355X, agentx) through its mechanism
and in the direction the mechanism predicts; kda_overlap changes nothing without speculation."""

from __future__ import annotations

import dataclasses
from functools import cache

import pytest

from ablations.backends.sim.cell import mean_context, run_point, sim_setup
from ablations.backends.sim.config import SimBackendConfig
from ablations.backends.sim.cost import Cost, Mechanisms, Parallel, Seq, SimModel
from ablations.backends.sim.report import scaled
from ablations.backends.sim.step_model import DecodeSeconds, StepModel, exact_costs
from ablations.backends.sim.timing import kernel_class, step_time
from ablations.config import compose_app
from ablations.workload import load_workload
from opts.draft_length.chooser import bucket_batch, goodput
from opts.draft_length.schedule import MAX_BATCH_SIZE, MAX_NUM_SEQS, buckets
from opts.fusion.sim import fused_kda_decode, fused_mla_norm
from opts.registry import OPTIMIZATIONS, make_config

CONCURRENCY = 3        # the default case's bracket of 50 tok/s/user lies between 3 and 4 live sessions


@cache
def default_case():
    app = compose_app(["backend=sim", "model=kimi_k3", "hardware=mi355x_x8", "workload=agentx"])
    return app.hardware, load_workload(app.workload)


def point(**modes: str) -> dict:
    """The default case at CONCURRENCY with `modes` (every other toggle off); each computed once per session."""
    return _point(tuple(sorted(modes.items())))


@cache
def _point(modes: tuple[tuple[str, str], ...]) -> dict:
    hw, trace = default_case()
    toggles = {name: make_config(name, mode=dict(modes).get(name, "off")) for name in OPTIMIZATIONS}
    out = run_point(sim_setup(SimBackendConfig(), "kimi_k3", hw, toggles, trace), trace, CONCURRENCY, 0)
    out.pop("wall_s")
    return out


def test_aiter_mla_on_runs_every_mtp_pass_s_mla_decode_as_the_vendor_kernel():
    off, on = (setup(aiter_mla=m).steps.models[3] for m in ("off", "on"))
    vendor = [n for n in on.names if kernel_class(n, on.classes) == "attention_vendor"]
    assert sorted(vendor) == ["later_mtp_mla_decode", "mla_decode", "mtp_mla_decode"]
    assert on.time(VERIFY_STEP) < off.time(VERIFY_STEP)


@pytest.mark.slow
def test_aiter_mla_on_decodes_faster_with_the_same_work():
    off, on = point(), point(aiter_mla="on")
    # the vendor kernel class reads the same bytes at a higher efficiency: every decode step is shorter
    assert on["interactivity"] > off["interactivity"]
    assert on["throughput_per_gpu"] > off["throughput_per_gpu"]
    assert on["engine"]["drafts"] == pytest.approx(off["engine"]["drafts"], rel=0.05)


# A step the default case runs by the thousand: a prefill chunk filling the budget beside three verifications.
MIXED_STEP = [Seq(8192 - 12, 20_000, "prefill")] + [Seq(4, 60_000, "verify")] * 3
VERIFY_STEP = [Seq(4, 60_000, "verify")] * 3
DECODE_STEP = [Seq(1, 60_000, "decode")] * 3


@pytest.mark.slow
def test_kda_overlap_on_shortens_the_steps_that_prefill_and_verify():
    """One chunked pass instead of a recurrent and a chunked one: 3 launches fewer per KDA layer (69 x 3 x 5 us)
    and the chunked kernel's FLOPs for the verified rows, in every step that prefills beside verifications; the
    default case runs over a thousand of them. Its result moves by less than the seed spread (a millisecond in
    each of about 1,500 steps of a 20,000 s replay): the test holds the steps, not the headline."""
    off, on = (setup(kda_overlap=m).steps.models[3] for m in ("off", "on"))
    hw, _ = default_case()
    assert off.time(MIXED_STEP) - on.time(MIXED_STEP) >= 69 * 3 * hw.launch_us * 1e-6
    assert on.time(VERIFY_STEP) == off.time(VERIFY_STEP)
    assert point()["engine"]["num_mixed_steps"] > 1000


def test_kda_overlap_streams_runs_the_two_passes_of_a_mixed_step_at_once():
    """On two streams a step's recurrent (verification) and chunked (prefill) KDA passes share the node: one pass's
    time over both passes' FLOPs and bytes instead of the two one after the other. At K3's shapes both are
    bandwidth-bound on MI355X, so the model sees no gain there (it has no notion of occupancy); where the chunked
    pass is compute-bound (a node with 1/50 of MI355X's FLOPs) the recurrent pass hides behind it. (With the
    node's kernel floor the recurrent pass's few small kernels sit on it and hide behind the prefill's bytes: the
    no-gain case is read without the floor.)"""
    assert setup(kda_overlap="streams").steps.mech.kda_streams
    hw, _ = default_case()
    hw = dataclasses.replace(hw, kernel_floor_us=0.0)
    m, p = SimModel(), Parallel()
    costs = exact_costs(m, p, MIXED_STEP, 3)
    for node, gains in ((hw, False), (scaled(hw, "peak_bf16_tflops", 0.02), True)):
        off, streams = (StepModel(m, p, node, 3, mech=Mechanisms(kda_streams=s)) for s in (False, True))
        rec, chunk = (step_time({n: costs[n]}, node, p).kernels_s for n in ("kda_recurrent", "kda_prefill"))
        both = step_time({"kda_streams": Cost.total((costs["kda_recurrent"], costs["kda_prefill"]))}, node,
                         p).kernels_s
        saved = off.time(MIXED_STEP) - streams.time(MIXED_STEP)
        assert saved == pytest.approx(rec + chunk - both, rel=1e-6, abs=1e-12)
        assert (saved > 0.1 * min(rec, chunk)) == gains
        assert streams.time(VERIFY_STEP) == pytest.approx(off.time(VERIFY_STEP), rel=1e-12)


def close(a, b, rel: float = 1e-9) -> bool:
    """Equal JSON trees, numbers within `rel` (two fits of one linear cost differ in their last bits)."""
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(close(a[k], b[k], rel) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(close(x, y, rel) for x, y in zip(a, b, strict=True))
    if isinstance(a, float):
        return a == pytest.approx(b, rel=rel)
    return a == b


@pytest.mark.slow
def test_kda_overlap_changes_nothing_without_speculation():
    off, on = point(draft_length="k0"), point(draft_length="k0", kda_overlap="on")
    assert off["engine"]["drafts"] == 0
    assert close(on, off)
    assert close(point(draft_length="k0", kda_overlap="streams"), off)
    for mode in ("on", "streams"):       # no verification rows to move: the step models are stock
        mech = setup(draft_length="k0", kda_overlap=mode).steps.mech
        assert not (mech.packed_kda or mech.kda_streams)
    assert not close(point(kda_overlap="on"), point())


@pytest.mark.slow
def test_moe_dedup_on_reads_less_per_step_and_leaves_more_cache():
    off, on = point(), point(moe_dedup="on")
    hw, _ = default_case()
    toggles = {name: make_config(name, mode="on" if name == "moe_dedup" else "off") for name in OPTIMIZATIONS}
    stock = {name: make_config(name, mode="off") for name in OPTIMIZATIONS}
    more, less = (sim_setup(SimBackendConfig(), "kimi_k3", hw, t) for t in (toggles, stock))
    # each rank holds 1/8 of W_up (3584 x 7168 bf16 per MoE layer and the MTP layer's): 93 x 51.4 MB x 7/8 more cache
    assert more.cache_gb - less.cache_gb == pytest.approx(93 * 3584 * 7168 * 2 * 7 / 8 / 1e9, rel=1e-6)
    assert on["interactivity"] > off["interactivity"]
    assert on["throughput_per_gpu"] > off["throughput_per_gpu"]


def test_moe_dedup_tiered_runs_on_above_its_threshold_with_offs_weights():
    """tiered (256 tokens): a prefill step of 2,048 tokens as on but for its later MTP passes (one token each, as
    off), a decode step of 3 verifications as off; every rank holds all of W_up, so the cache is off's."""
    off, on, tiered = setup(), setup(moe_dedup="on"), setup(moe_dedup="tiered")
    assert tiered.cache_gb == off.cache_gb < on.cache_gb
    prefill, decode = [Seq(2048, 0, "prefill")], [Seq(4, 5000, "verify")] * 3
    model = {name: s.steps.models[3] for name, s in (("off", off), ("on", on), ("tiered", tiered))}
    assert model["on"].time(prefill) < model["tiered"].time(prefill) < model["off"].time(prefill)
    one = {name: StepModel(m.model, m.parallel, m.hw, 1, classes=m.classes, mech=m.mech) for name, m in model.items()}
    assert one["tiered"].time(prefill) == one["on"].time(prefill)         # K = 1: no later pass
    assert model["tiered"].time(decode) == model["off"].time(decode) > model["on"].time(decode)


def test_moe_dedup_sp_splits_the_moe_tokens_and_holds_the_whole_shared_mlp():
    """sp: a 2,048-token prefill runs the MoE projections on 256 tokens a rank (faster than off); a decode step reads
    the whole shared MLP on every rank (slower); every rank holds it: less cache by its 7/8 per MoE layer."""
    off, sp = setup(), setup(moe_dedup="sp")
    spec = SimModel().spec
    shared = 3 * spec.hidden * spec.moe_intermediate * spec.num_shared_experts * 2       # bf16, whole
    assert off.cache_gb - sp.cache_gb == pytest.approx(93 * shared * 7 / 8 / 1e9, rel=1e-6)
    prefill, decode = [Seq(2048, 0, "prefill")], [Seq(4, 5000, "verify")] * 3
    assert sp.steps.models[3].time(prefill) < off.steps.models[3].time(prefill)
    assert sp.steps.models[3].time(decode) > off.steps.models[3].time(decode)


def setup(floor: bool = True, **modes: str):
    """The default case's setup with the toggles at `modes` (the rest off); without the node's kernel `floor`."""
    hw, trace = default_case()
    hw = hw if floor else dataclasses.replace(hw, kernel_floor_us=0.0)
    toggles = {name: make_config(name, mode=modes.get(name, "off")) for name in OPTIMIZATIONS}
    return sim_setup(SimBackendConfig(), "kimi_k3", hw, toggles, trace)


def test_mtp_disables_the_fused_kda_decode():
    # vLLM decides at construction: with speculation configured the fused KDA decode is never used
    speculative, plain = setup(fusion="on").steps.mech, setup(fusion="on", draft_length="k0").steps.mech
    assert speculative.fused_mla_norm is fused_mla_norm and speculative.fused_kda_decode is None
    assert plain.fused_mla_norm is fused_mla_norm and plain.fused_kda_decode is fused_kda_decode
    assert setup(draft_length="k0").steps.mech.fused_kda_decode is None


@pytest.mark.slow
def test_fusion_on_saves_launches_and_more_of_them_without_speculation():
    """Beside MTP only the q/kv norms fuse: one launch fewer per MLA layer in every step and in each of its three
    MTP passes, below the seed spread of the default result: a launch each in a step that prefills (eager on ROCm),
    a graph node each in a decode step (a replayed graph). Without speculation every decode-only step also runs one
    KDA decode kernel instead of five per layer, and streams less: the default case's throughput and interactivity
    rise. (Read without the kernel floor, which the fewer kernels lower too: with it, they save more.)"""
    hw, _ = default_case()
    launch, node = hw.launch_us * 1e-6, hw.graph_node_us * 1e-6
    speculative = [setup(floor=False, fusion=m).steps.models[3] for m in ("off", "on")]
    floored = [setup(fusion=m).steps.models[3] for m in ("off", "on")]
    for step, each in ((MIXED_STEP, launch), (VERIFY_STEP, node)):
        assert speculative[0].time(step) - speculative[1].time(step) == pytest.approx((24 + 3) * each, rel=1e-6)
        assert floored[0].time(step) - floored[1].time(step) > (24 + 3) * each
    plain = [setup(fusion=m, draft_length="k0").steps.models[0] for m in ("off", "on")]
    assert plain[0].time(DECODE_STEP) - plain[1].time(DECODE_STEP) > (24 + 69 * 4) * node
    plain_off, plain_on = point(draft_length="k0"), point(draft_length="k0", fusion="on")
    assert plain_on["interactivity"] > 1.01 * plain_off["interactivity"]
    assert plain_on["throughput_per_gpu"] > 1.01 * plain_off["throughput_per_gpu"]


def fixed_k_model(k: int):
    """The default case's step model with a fixed K (draft_length off at `k`)."""
    hw, trace = default_case()
    toggles = {name: make_config(name, mode="off") for name in OPTIMIZATIONS}
    toggles["draft_length"] = make_config("draft_length", mode="off", k=k)
    return sim_setup(SimBackendConfig(), "kimi_k3", hw, toggles, trace).steps.models[k]


def test_draft_length_on_runs_the_k_its_chooser_picks_on_the_simulated_node():
    """The cell's schedule is, at each batch size, the K of the most accepted tokens per second, b E(K) / c(b, K) on
    the node's own step times, scored where the chooser scores the batch's bucket (its geometric midpoint); and
    those K differ by batch (more requests touch more experts, so a draft costs more, until every expert is read
    anyway)."""
    steps = setup(draft_length="on").steps
    _, trace = default_case()
    models = {0: setup(draft_length="k0").steps.models[0], **{k: fixed_k_model(k) for k in range(1, 9)}}
    cost = DecodeSeconds(models, mean_context(trace))
    for batch in (1, 2, 4, 6, 16):
        lo, hi = next((lo, hi) for lo, hi in buckets(MAX_BATCH_SIZE, MAX_NUM_SEQS) if lo <= batch <= hi)
        at = bucket_batch(lo, hi, MAX_BATCH_SIZE)
        best = max(range(9), key=lambda k: goodput(cost, (0.8,) * 8, at, k))
        assert steps.k(batch) == best, batch
    assert len({steps.k(b) for b in (1, 4, 16)}) > 1
    assert setup(draft_length="on", fusion="on").steps.mech.fused_kda_decode is None


@pytest.mark.slow
def test_draft_length_on_emits_more_tokens_per_step_than_a_fixed_k():
    off, on = point(), point(draft_length="on")
    assert on["engine"]["drafts"] > off["engine"]["drafts"]
    assert on["interactivity"] > off["interactivity"]
    assert on["throughput_per_gpu"] > off["throughput_per_gpu"]
