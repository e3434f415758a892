"""fusion's vLLM setting: the cells as data, the patch targets in vLLM 0.32, and the q/kv norms of off and on
against what stock vLLM-CPU runs (CPU fix S15: vLLM's RMSNorm twice, eager), without an engine.

Off and on must equal stock within fp32 summation order (TOL); in bf16 within one ulp (BF16_TOL). The KDA
decode wrappers: test_fusion_vllm_kda.py.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from opts.fusion import FusionConfig, in_vllm, naive
from opts.fusion import passes as on_passes
from opts.fusion import vllm as setting
from opts.fusion.dynamic import dynamic
from opts.k3 import rms_norm_f64
from opts.vllm_setting import PLATFORMS

TOL = {"atol": 2e-6, "rtol": 2e-6}            # fp32: summation order only (measured max 2.4e-7 on outputs ~1)
# bf16: compiled, off and on round once at the end where vLLM's eager RMSNorm (stock) also rounds before the
# weight multiply (inductor drops that intermediate rounding): one bf16 ulp
BF16_TOL = {"atol": 1.6e-2, "rtol": 1e-2}
NORM = setting.MLA_NORM_TARGET
FORWARD = setting.KDA_FORWARD_TARGET
MECHANISM = {NORM: "mla_norm", FORWARD: "kda_decode", setting.KDA_FUSED_TARGET: "kda_decode",
             setting.KDA_UNFUSED_TARGET: "kda_decode"}
# (mode, mechanisms) -> {target: counter} of the CPU setting
CPU_CELLS = {
    ("off", setting.MECHANISMS): {NORM: setting.MLA_UNFUSED_COUNTER, FORWARD: None,
                                  setting.KDA_UNFUSED_TARGET: setting.KDA_UNFUSED_COUNTER},
    ("on", setting.MECHANISMS): {NORM: setting.MLA_COUNTER, FORWARD: None,
                                 setting.KDA_FUSED_TARGET: setting.KDA_COUNTER},
    ("on", ("mla_norm",)): {NORM: setting.MLA_COUNTER, FORWARD: None,
                            setting.KDA_UNFUSED_TARGET: setting.KDA_UNFUSED_COUNTER},
    ("on", ("kda_decode",)): {NORM: setting.MLA_UNFUSED_COUNTER, FORWARD: None,
                              setting.KDA_FUSED_TARGET: setting.KDA_COUNTER},
    ("on", ()): {NORM: setting.MLA_UNFUSED_COUNTER, FORWARD: None,
                 setting.KDA_UNFUSED_TARGET: setting.KDA_UNFUSED_COUNTER},
}


# --- the cells, as data -------------------------------------------------------------------------------------



def stock_forward():
    """vLLM's own `_forward`, also after an in-process engine installed the plugin's patches in this process."""
    from ablations.backends.vllm.in_vllm.patches import stock

    return stock("vllm.models.kimi_k3.nvidia.kda:KimiK3DeltaAttention._forward")

def test_only_cuda_has_a_stock_mode():
    """On a CPU stock vLLM runs both mechanisms eagerly: neither fusion=off nor =on at one compilation level."""
    assert setting.STOCK_MODES == {"cuda": "on"}
    assert setting.vllm_setting(FusionConfig(mode="on"), "cuda").is_stock


@pytest.mark.parametrize(("mode", "mechanisms"), CPU_CELLS, ids=[f"{m}-{'+'.join(k) or 'none'}" for m, k in CPU_CELLS])
def test_every_cpu_cell_patches_each_mechanism_fused_or_unfused(mode, mechanisms):
    config = FusionConfig(mode=mode, mechanisms=mechanisms)
    result = setting.vllm_setting(config, "cpu")
    assert not result.engine_args and not result.env and not result.additional_config
    assert {p.target: p.counter for p in result.patches} == CPU_CELLS[mode, mechanisms]
    for p in result.patches:
        assert p.why.startswith("fusion on:" if config.is_fused(MECHANISM[p.target]) else "fusion off:"), p


def test_the_wraps_put_in_the_off_and_on_passes():
    stock = object()
    for mode, norm, decode in (("off", naive.q_kv_rms_norm, naive.kda_decode_slots_unfused),
                               ("on", on_passes.q_kv_rms_norm_fused, on_passes.kda_decode_slots_fused)):
        patches = {p.target: p for p in setting.vllm_setting(FusionConfig(mode=mode), "cpu").patches}
        assert patches[NORM].wrap(stock) is norm
        base = lambda self, **kwargs: None  # noqa: E731
        assert patches[FORWARD].wrap(base).__wrapped__ is base
        counted = next(p for p in patches.values() if p.target not in (NORM, FORWARD))
        assert counted.wrap(decode) is decode
        module, _, name = counted.target.partition(":")
        assert getattr(__import__(module, fromlist=[name]), name) is decode


def test_cuda_switches_the_kda_decode_with_vllms_own_backend_option():
    result = setting.vllm_setting(FusionConfig(mode="on", mechanisms=("mla_norm",)), "cuda")
    assert result.additional_config == {"kda_decode_backend": "triton"}
    assert not result.patches and not result.engine_args and not result.env


# (mode, mechanisms) -> ({target: counter}, additional_config) off CUDA's stock: the norm's counterfactual patch
CUDA_CELLS = {
    ("off", setting.MECHANISMS): ({NORM: setting.MLA_UNFUSED_COUNTER}, {"kda_decode_backend": "triton"}),
    ("on", ("kda_decode",)): ({NORM: setting.MLA_UNFUSED_COUNTER}, {}),
}


@pytest.mark.parametrize(("mode", "mechanisms"), CUDA_CELLS)
def test_cuda_off_unfuses_the_norms_as_a_counterfactual(mode, mechanisms):
    result = setting.vllm_setting(FusionConfig(mode=mode, mechanisms=mechanisms), "cuda")
    patches, extra = CUDA_CELLS[mode, mechanisms]
    assert {p.target: p.counter for p in result.patches} == patches and result.additional_config == extra
    (norm,) = result.patches
    assert norm.wrap(object()) is naive.q_kv_rms_norm
    assert "counterfactual" in norm.why and "nvidia/mla.py:521" in norm.why


ROCM_NORM, ROCM_SUPPORTED, ROCM_FUSED = (setting.ROCM_MLA_NORM_TARGET, setting.ROCM_KDA_SUPPORTED_TARGET,
                                         setting.ROCM_KDA_FUSED_TARGET)
ROCM_CELLS = {
    ("off", setting.MECHANISMS): {ROCM_NORM: setting.MLA_UNFUSED_COUNTER, ROCM_SUPPORTED: None},
    ("on", setting.MECHANISMS): {ROCM_NORM: setting.MLA_COUNTER, ROCM_FUSED: setting.KDA_COUNTER},
    ("on", ("mla_norm",)): {ROCM_NORM: setting.MLA_COUNTER, ROCM_SUPPORTED: None},
    ("on", ("kda_decode",)): {ROCM_NORM: setting.MLA_UNFUSED_COUNTER, ROCM_FUSED: setting.KDA_COUNTER},
}


@pytest.mark.parametrize(("mode", "mechanisms"), ROCM_CELLS, ids=[f"{m}-{'+'.join(k)}" for m, k in ROCM_CELLS])
def test_every_rocm_cell_patches_each_mechanism_whatever_aiter_and_mtp(mode, mechanisms):
    config = FusionConfig(mode=mode, mechanisms=mechanisms)
    result = setting.vllm_setting(config, "rocm")
    assert not result.engine_args and not result.env and not result.additional_config
    assert {p.target: p.counter for p in result.patches} == ROCM_CELLS[mode, mechanisms]
    for p in result.patches:
        assert re.search(r"amd/(mla|kda)\.py:\d+", p.why), p.why       # each says which vLLM code it runs
        fused = config.is_fused("mla_norm" if p.target == ROCM_NORM else "kda_decode")
        assert p.why.startswith("fusion on:" if fused else "fusion off:"), p
    assert "rocm" not in setting.STOCK_MODES


def test_the_rocm_norms_run_the_fused_op_or_the_two_layers():
    calls = []

    class Norm:
        def __init__(self, name):
            self.name, self.weight, self.variance_epsilon = name, torch.full((4,), 2.0), 1e-6

        def __call__(self, x):
            calls.append(self.name)
            return x * self.weight

    layer = SimpleNamespace(q_a_layernorm=Norm("q"), kv_a_layernorm=Norm("kv"))
    q, kv = torch.ones(3, 4), torch.ones(3, 4) * 3
    got = in_vllm.rocm_normalize_q_kv(False)(layer, q, kv)
    assert calls == ["q", "kv"] and torch.equal(got[0], q * 2) and torch.equal(got[1], kv * 2)
    with pytest.raises((AttributeError, RuntimeError), match="fused_mla_dual_rms_norm"):
        in_vllm.rocm_normalize_q_kv(True)(layer, q, kv)     # AITER's op: registered only on ROCm with aiter
    assert calls == ["q", "kv"]
    (off,) = [p for p in setting.vllm_setting(FusionConfig(mode="off"), "rocm").patches if p.target == ROCM_SUPPORTED]
    assert off.wrap(object())(12, 128, 4, 0, torch.bfloat16, torch.bfloat16) is False


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

def test_every_target_exists_and_off_and_on_take_its_arguments(vllm):
    from vllm.models.common.ops import fused_q_kv_rmsnorm

    from ablations.backends.vllm.in_vllm.patches import resolve

    for mode in ("off", "on"):
        for platform in PLATFORMS:
            for patch in setting.vllm_setting(FusionConfig(mode=mode), platform).patches:
                owner, attr = resolve(patch.target)
                assert callable(getattr(owner, attr)), patch.target
    from vllm.models.kimi_k3.amd import kda as amd_kda
    from vllm.models.kimi_k3.amd import mla as amd_mla

    rocm_norm = amd_mla.KimiK3MultiHeadLatentAttentionWrapper._normalize_q_kv
    assert list(inspect.signature(in_vllm.rocm_normalize_q_kv(True)).parameters) == list(
        inspect.signature(rocm_norm).parameters)
    source = inspect.getsource(rocm_norm)       # the two paths the patch pins, as vLLM 0.32 writes them
    assert "torch.ops.vllm.fused_mla_dual_rms_norm(" in source and "return q_layernorm(q_c), kv_layernorm(kv_c)" \
        in source
    assert "is_fused_kda_decode_supported(" in inspect.getsource(amd_kda.KimiK3DeltaAttention.__init__)
    assert "ops.fused_kda_decode(" in inspect.getsource(amd_kda.KimiK3DeltaAttention._forward)
    stock = list(inspect.signature(fused_q_kv_rmsnorm).parameters)
    assert list(inspect.signature(on_passes.q_kv_rms_norm_fused).parameters) == stock
    assert list(inspect.signature(naive.q_kv_rms_norm).parameters) == stock
    assert (inspect.signature(naive.kda_decode_slots_unfused).parameters.keys()
            == inspect.signature(on_passes.kda_decode_slots_fused).parameters.keys())
    forward = list(inspect.signature(stock_forward()).parameters)
    for fused in (False, True):
        assert list(inspect.signature(in_vllm.route_plain_decode(stock_forward(), fused)).parameters) \
            == forward


def test_vllm_takes_the_fused_branch_exactly_where_the_patch_does(vllm):
    """The condition of vLLM's fused-decode branch (nvidia/kda.py:984-991), which `_plain_decode` copies, and the
    passes of its plain-decode branch that off runs as its stages (kda.py:1320-1372)."""

    source = inspect.getsource(stock_forward())
    assert re.search(r"and not has_spec_decode\s+and m\.num_prefills == 0\s+and m\.num_decodes > 0", source)
    decode = source[source.index("# Pure non-speculative decode."):]
    assert decode.index("packed_conv_out = torch.empty_like(") < decode.index("causal_conv1d_update(")
    assert decode.index("causal_conv1d_update(") < decode.index("fused_recurrent_kda_packed_decode(")
    assert re.search(r"core_attn_out\[0, :num_actual_tokens\] = core_attn_out_non_spec\[", source)
    assert "core_attn_out.copy_(self.o_norm(core_attn_out, g2))" in decode


# --- the q/kv norms: stock (S15) against off and on ------------------------------------------------------------

def q_kv_inputs(n: int, dtype: torch.dtype, seed: int = 0, widths: tuple[int, int] = (96, 40)):
    """Row-strided views of one projection row [n, q | kv | 8], as mla.py:518 splits it, and the two weights."""
    g = torch.Generator().manual_seed(seed)
    q, k = widths
    qkv = torch.randn(n, q + k + 8, generator=g).to(dtype)
    wq, wkv = (1 + 0.1 * torch.randn(q, generator=g)).to(dtype), (1 + 0.1 * torch.randn(k, generator=g)).to(dtype)
    return qkv[:, :q], qkv[:, q:q + k], wq, wkv


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_off_and_on_norms_equal_stock_and_the_reference_at_any_token_count(vllm, dtype):
    """One graph per pass serves every token count (a single row runs as two), both widths for off."""
    from ablations.backends.vllm.in_vllm.cpu import mla

    passes = [dynamic(*naive.RMS_NORM_PASS), dynamic(*on_passes.Q_KV_NORM_PASS)]
    before = [p.num_graphs for p in passes]
    tol = TOL if dtype == torch.float32 else BF16_TOL
    for n in (2, 1, 5, 16, 33, 1, 7) if dtype == torch.float32 else (9, 1):   # as an engine: more rows first
        qr, kv, wq, wkv = q_kv_inputs(n, dtype, seed=n)
        stock = mla.fused_q_kv_rmsnorm(qr, kv, wq, wkv, 1e-6)
        off = naive.q_kv_rms_norm(qr, kv, wq, wkv, 1e-6)
        on = on_passes.q_kv_rms_norm_fused(qr, kv, wq, wkv, 1e-6)
        for i, (x, w) in enumerate(((qr, wq), (kv, wkv))):
            assert off[i].data_ptr() not in (x.data_ptr(), on[i].data_ptr())
            for got in (off[i], on[i]):
                assert got.dtype == dtype and got.shape == x.shape and got.data_ptr() != x.data_ptr()
                torch.testing.assert_close(got, stock[i], **tol)
                torch.testing.assert_close(got.double(), rms_norm_f64(x, w, 1e-6), **tol)
    assert all(p.num_graphs > 0 and p.num_graphs - b <= 1 for p, b in zip(passes, before, strict=True))


@pytest.mark.parametrize("norm", [naive.q_kv_rms_norm, on_passes.q_kv_rms_norm_fused], ids=["off", "on"])
def test_norms_of_no_tokens_and_bad_shapes(norm):
    qr, kv, wq, wkv = q_kv_inputs(0, torch.float32)
    q, k = norm(qr, kv, wq, wkv, 1e-6)
    assert q.shape == (0, 96) and k.shape == (0, 40)
    qr, kv, wq, wkv = q_kv_inputs(3, torch.float32)
    with pytest.raises(ValueError, match="q_weight: expected shape"):
        norm(qr, kv, wkv, wkv, 1e-6)
    with pytest.raises(ValueError, match="qr, kv: expected"):
        norm(qr, kv[:2], wq, wkv, 1e-6)
