"""aiter_mla's vLLM wiring (`opts/aiter_mla/vllm.py`): the setting of every cell, its targets and names in the
installed vLLM 0.32, and the CPU off replacement against the stock `CPUMLAImpl.forward_mqa` it replaces.

Tolerance of off's latent output against vLLM-CPU's kernel and a float64 reference, float32: 1e-5 abs + 1e-5 rel
(the package's float32 tolerance; both compute softmax in float32, off in base 2 with tiles merged at the end,
the kernel in base e merged per 16-token block).
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import opts.aiter_mla
from opts.aiter_mla import naive, split_kv, vllm
from opts.aiter_mla.config import AiterMLAConfig
from opts.aiter_mla.inputs import make_inputs
from opts.k3.mla import absorb_query
from opts.vllm_setting import PLATFORMS

ATOL = RTOL = 1e-5
PACKAGE_DIR = Path(opts.aiter_mla.__file__).parent


@pytest.fixture(scope="module")
def vllm_cpu_mla():
    """vLLM's cpu_mla module (media wheels hidden first, as the plugin does in every vLLM process)."""
    from ablations.backends.vllm.launch.runtime import hide_media_wheels

    with contextlib.suppress(RuntimeError):
        hide_media_wheels()
    pytest.importorskip("vllm._custom_ops")
    from vllm.v1.attention.backends.mla import cpu_mla

    return cpu_mla


def configs() -> list[AiterMLAConfig]:
    return [AiterMLAConfig(mode=m, on_backend=b) for m in AiterMLAConfig.MODES for b in AiterMLAConfig.ON_BACKENDS]


# --- the data ---------------------------------------------------------------------------------------------

def test_stock_modes_give_empty_settings_and_no_other_mode_does() -> None:
    assert opts.aiter_mla.OPTIMIZATION.stock_modes is vllm.STOCK_MODES
    assert vllm.STOCK_MODES == {"cpu": "on", "rocm": "off"}
    for platform in PLATFORMS:
        for config in configs():
            try:
                setting = vllm.vllm_setting(config, platform)
            except ValueError:
                continue
            assert setting.is_stock == (vllm.STOCK_MODES.get(platform) == config.mode), (platform, config)


def test_cpu_off_is_one_counted_patch_of_cpu_mla_decode() -> None:
    for backend in AiterMLAConfig.ON_BACKENDS:
        setting = vllm.vllm_setting(AiterMLAConfig(mode="off", on_backend=backend), "cpu")
        assert (setting.engine_args, setting.env, setting.additional_config) == ({}, {}, {})
        (patch,) = setting.patches
        assert patch.target == "vllm.v1.attention.backends.mla.cpu_mla:CPUMLAImpl.forward_mqa"
        assert patch.counter == "aiter_mla_portable_decode"
        assert "aiter_mla=off" in patch.why


def test_cpu_on_is_stock_for_vllm_cpu_and_not_wired_for_aiter() -> None:
    for backend in ("auto", "vllm_cpu"):
        assert vllm.vllm_setting(AiterMLAConfig(mode="on", on_backend=backend, tile_tokens=64), "cpu").is_stock
    with pytest.raises(ValueError, match=r"aiter_mla=on \(on_backend=aiter\) on cpu: .*vllm_cpu.*valid there: off"):
        vllm.vllm_setting(AiterMLAConfig(mode="on", on_backend="aiter"), "cpu")


def test_rocm_on_is_the_aiter_environment_and_off_is_stock() -> None:
    for backend in ("auto", "aiter"):
        setting = vllm.vllm_setting(AiterMLAConfig(mode="on", on_backend=backend), "rocm")
        assert setting.env == {"VLLM_ROCM_USE_AITER": "1", "VLLM_ROCM_USE_AITER_MLA": "1"}
        assert (setting.engine_args, setting.additional_config, setting.patches) == ({}, {}, ())
    assert vllm.vllm_setting(AiterMLAConfig(mode="off", tile_tokens=64), "rocm").is_stock
    with pytest.raises(ValueError, match=r"on \(on_backend=vllm_cpu\) on rocm: .*'aiter'"):
        vllm.vllm_setting(AiterMLAConfig(mode="on", on_backend="vllm_cpu"), "rocm")


def test_cuda_off_selects_triton_mla_and_on_is_not_wired() -> None:
    setting = vllm.vllm_setting(AiterMLAConfig(mode="off"), "cuda")
    assert setting.engine_args == {"attention_backend": "TRITON_MLA"}
    assert (setting.env, setting.additional_config, setting.patches) == ({}, {}, ())
    for backend in AiterMLAConfig.ON_BACKENDS:
        with pytest.raises(ValueError, match=r"aiter_mla=on on cuda: .*no vendor MLA decode.*valid there: off$"):
            vllm.vllm_setting(AiterMLAConfig(mode="on", on_backend=backend), "cuda")


def test_unknown_platform_is_an_error() -> None:
    with pytest.raises(ValueError, match="platform: invalid value 'tpu'"):
        vllm.vllm_setting(AiterMLAConfig(mode="off"), "tpu")


def test_off_tiling_reaches_the_replacement(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = []
    monkeypatch.setattr(naive, "latent_decode", lambda *args, tiling: seen.append(tiling) or args[0][..., :512])
    meta = SimpleNamespace(decode=SimpleNamespace(block_table=torch.zeros(1, 1, dtype=torch.int32),
                                                  seq_lens=torch.ones(1, dtype=torch.int32)))
    impl = SimpleNamespace(scale=0.1, kv_lora_rank=512)
    small = AiterMLAConfig(mode="off", tile_tokens=32, stage_bytes=1 << 20)
    for config, want in ((AiterMLAConfig(mode="off"), split_kv.Tiling(4096, 8 << 20)),
                         (small, split_kv.Tiling(32, 1 << 20))):
        (patch,) = vllm.vllm_setting(config, "cpu").patches
        patch.wrap(None)(impl, torch.zeros(1, 2, 576), torch.zeros(1, 16, 576), meta, None)
        assert seen.pop() == want


def test_the_package_imports_no_ablations_and_vllm_only_inside_functions() -> None:
    for path in sorted(PACKAGE_DIR.glob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n.split(".")[0] == "ablations" for n in names), f"{path.name} imports {names}"
        for node in tree.body:
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                assert not any(n.split(".")[0] == "vllm" for n in names), f"{path.name} imports vllm at module level"


# --- the names in the installed vLLM 0.32 --------------------------------------------------------------------

def test_cpu_patch_target_exists_with_the_signature_replaced(vllm_cpu_mla) -> None:
    import inspect

    from ablations.backends.vllm.in_vllm.patches import resolve

    owner, attr = resolve(vllm.CPU_DECODE)
    assert owner is vllm_cpu_mla.CPUMLAImpl and attr == "forward_mqa"
    (patch,) = vllm.vllm_setting(AiterMLAConfig(mode="off"), "cpu").patches
    stock = inspect.signature(getattr(owner, attr)).parameters
    ours = inspect.signature(patch.wrap(getattr(owner, attr))).parameters
    assert list(ours) == list(stock) == ["self", "q", "kv_c_and_k_pe_cache", "attn_metadata", "layer"]


def test_cpu_mla_decode_takes_one_query_token_per_request(vllm_cpu_mla) -> None:
    from vllm.model_executor.layers.attention.mla_attention import MLACommonMetadataBuilder, QueryLenSupport

    assert vllm_cpu_mla.CPUMLABackend.get_builder_cls() is MLACommonMetadataBuilder
    assert MLACommonMetadataBuilder.query_len_support is QueryLenSupport.SINGLE_ONLY
    assert MLACommonMetadataBuilder.reorder_batch_threshold == 1


def test_cuda_off_engine_argument_names_a_vllm_backend(vllm_cpu_mla) -> None:
    from vllm.config.attention import AttentionConfig
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    assert "attention_backend" in {f.name for f in dataclasses.fields(EngineArgs)}
    assert AttentionConfig.validate_backend_before("TRITON_MLA") is AttentionBackendEnum.TRITON_MLA


def test_rocm_environment_defaults_leave_aiter_off(vllm_cpu_mla, monkeypatch: pytest.MonkeyPatch) -> None:
    import vllm.envs as envs

    for name in vllm.ROCM_ON_ENV:
        monkeypatch.delenv(name, raising=False)
    assert (envs.VLLM_ROCM_USE_AITER, envs.VLLM_ROCM_USE_AITER_MLA) == (False, True)
    for name, value in vllm.ROCM_ON_ENV.items():
        monkeypatch.setenv(name, value)
    assert (envs.VLLM_ROCM_USE_AITER, envs.VLLM_ROCM_USE_AITER_MLA) == (True, True)


def test_rocm_picks_aiter_mla_only_when_enabled_else_triton_mla(vllm_cpu_mla) -> None:
    """vllm/platforms/rocm.py cannot be imported without a ROCm torch: its MLA priority list is read from source."""
    import vllm.platforms

    source = Path(vllm.platforms.__file__).with_name("rocm.py").read_text()
    func = next(n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef)
                and n.name == "_get_backend_priorities")
    mla = next(n for n in func.body if isinstance(n, ast.If) and ast.unparse(n.test) == "use_mla")
    (branch,) = mla.body
    assert ast.unparse(branch.test) == "rocm_aiter_ops.is_mla_enabled()"
    enabled = [ast.unparse(e) for e in branch.body[0].value.elts]
    default = [ast.unparse(e) for e in branch.orelse[0].value.elts]
    assert enabled[0] == "AttentionBackendEnum.ROCM_AITER_MLA"
    assert default == ["AttentionBackendEnum.TRITON_MLA"]
    aiter_ops = Path(vllm.__file__).with_name("_aiter_ops.py").read_text()
    assert "return cls._AITER_ENABLED and cls._MLA_ENABLED" in aiter_ops


# --- the CPU off replacement against the stock forward_mqa -----------------------------------------------------

def latent_truth(q_latent: torch.Tensor, inputs, scale: float, rank: int) -> torch.Tensor:
    """float64 latent attention per request over its own tokens -> [B, H, rank]."""
    block = inputs.kv_cache.shape[1]
    outs = []
    for b, n in enumerate(inputs.context_lens.tolist()):
        t = torch.arange(n)
        kv = inputs.kv_cache[inputs.block_table[b].long()[t // block], t % block].double()
        p = torch.softmax(q_latent[b].double() @ kv.T * scale, dim=-1)
        outs.append(p @ kv[:, :rank])
    return torch.stack(outs)


def decode_call(lens: list[int], seed: int, *, contiguous: bool = False):
    inputs = make_inputs(lens, block_size=16, dtype=torch.float32, seed=seed, shuffle=not contiguous,
                         spare_blocks=3, poison_unused=True)
    shape = inputs.shape
    q = absorb_query(inputs.q_nope, inputs.q_pe, inputs.w_uk)
    impl = SimpleNamespace(scale=shape.softmax_scale, kv_lora_rank=shape.kv_lora_rank)
    # vLLM's decode table: int32, rows padded with 0 (not -1) past each request's blocks
    table = inputs.block_table.clamp(min=0).to(torch.int32)
    meta = SimpleNamespace(decode=SimpleNamespace(block_table=table, seq_lens=inputs.context_lens.to(torch.int32)))
    return inputs, q, impl, meta


@pytest.mark.parametrize(("lens", "seed"), [([1], 0), ([37, 100], 1), ([1, 17, 300, 1000, 64], 2),
                                            ([2100, 77], 3), ([16, 32, 48], 4)])
def test_off_forward_mqa_matches_the_stock_one_and_the_truth(vllm_cpu_mla, lens: list[int], seed: int) -> None:
    inputs, q, impl, meta = decode_call(lens, seed)
    stock = vllm_cpu_mla.CPUMLAImpl.forward_mqa
    (patch,) = vllm.vllm_setting(AiterMLAConfig(mode="off"), "cpu").patches
    off = patch.wrap(stock)
    want, want_lse = stock(impl, q.clone(), inputs.kv_cache, meta, None)
    got, lse = off(impl, q.clone(), inputs.kv_cache, meta, None)
    truth = latent_truth(q, inputs, impl.scale, impl.kv_lora_rank)
    assert lse is None and want_lse is None
    assert got.shape == want.shape == (len(lens), inputs.shape.num_heads, 512) and got.dtype == torch.float32
    torch.testing.assert_close(got, want, atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(got.double(), truth, atol=ATOL, rtol=RTOL)
    halves = off(impl, (q[..., :512], q[..., 512:]), inputs.kv_cache, meta, None)[0]
    torch.testing.assert_close(halves, got, atol=0, rtol=0)


def test_off_forward_mqa_with_small_tiles_merges_exactly(vllm_cpu_mla) -> None:
    inputs, q, impl, meta = decode_call([300, 1000], 5)
    (patch,) = vllm.vllm_setting(AiterMLAConfig(mode="off", tile_tokens=32, stage_bytes=1 << 16), "cpu").patches
    got = patch.wrap(None)(impl, q, inputs.kv_cache, meta, None)[0]
    torch.testing.assert_close(got.double(), latent_truth(q, inputs, impl.scale, 512), atol=ATOL, rtol=RTOL)


def test_off_forward_mqa_refuses_more_query_rows_than_requests() -> None:
    inputs, q, impl, meta = decode_call([20, 40], 6)
    (patch,) = vllm.vllm_setting(AiterMLAConfig(mode="off"), "cpu").patches
    with pytest.raises(ValueError, match="3 decode query rows for 2 requests"):
        patch.wrap(None)(impl, torch.cat([q, q[:1]]), inputs.kv_cache, meta, None)


def test_off_forward_mqa_without_decode_metadata_is_an_error() -> None:
    (patch,) = vllm.vllm_setting(AiterMLAConfig(mode="off"), "cpu").patches
    with pytest.raises(ValueError, match="without decode metadata"):
        patch.wrap(None)(SimpleNamespace(), torch.zeros(1, 2, 576), None, SimpleNamespace(decode=None), None)


def test_latent_decode_is_the_attention_of_naive_decode() -> None:
    inputs = make_inputs([5, 70], block_size=16, dtype=torch.bfloat16, seed=7)
    shape = inputs.shape
    q = absorb_query(inputs.q_nope, inputs.q_pe, inputs.w_uk)
    o = naive.latent_decode(q, inputs.kv_cache, inputs.block_table, inputs.context_lens, shape.softmax_scale, 512)
    assert o.dtype == torch.bfloat16
    want = torch.bmm(o.transpose(0, 1), inputs.w_uv.transpose(1, 2)).transpose(0, 1)
    torch.testing.assert_close(naive.decode(*inputs.args()), want, atol=0, rtol=0)


@pytest.mark.parametrize(("change", "match"), [
    ({"kv_cache": torch.zeros(4, 16, 500)}, r"kv_cache: shape \[4, 16, 500\]"),
    ({"block_table": torch.zeros(3, 2, dtype=torch.int32)}, r"block_table: shape \[3, 2\]"),
    ({"context_lens": torch.tensor([5.0, 6.0])}, "context_lens: dtype torch.float32 is not an integer type"),
    ({"q_latent": torch.zeros(2, 2, 576, dtype=torch.float64)}, "q_latent: dtype torch.float64 differs"),
    ({"kv_lora_rank": 576}, r"kv_lora_rank: invalid value 576; must be in \(0, 576\)"),
    ({"context_lens": torch.tensor([5, 33], dtype=torch.int32)}, r"context_lens\[1\]: invalid value 33"),
])
def test_latent_decode_errors_name_the_argument(change: dict, match: str) -> None:
    args = {"q_latent": torch.zeros(2, 2, 576), "kv_cache": torch.zeros(4, 16, 576),
            "block_table": torch.tensor([[0, 1], [2, 3]], dtype=torch.int32),
            "context_lens": torch.tensor([5, 20], dtype=torch.int32), "scale": 1 / math.sqrt(192), "kv_lora_rank": 512}
    args.update(change)
    with pytest.raises(ValueError, match=match):
        naive.latent_decode(**args)
