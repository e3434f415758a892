"""kda_overlap's vLLM setting: the cells as data, the patch targets in vLLM 0.32, and the on wrappers against off.

The wrappers run a mixed step in vLLM's order (`kda_vllm_cases.serial_forward`, the kernels looked up at call
time as `_forward` does) under a forward context whose metadata says what the step holds. On must equal
off within 1e-5 (fp32, the package's tolerance), make one packed pass per mixed step and none otherwise, and
leave every other step bit-exact to off.
"""

from __future__ import annotations

import contextlib
import inspect
import re
from types import SimpleNamespace

import pytest
import torch
from kda_vllm_cases import PREFIX, mixed_case, mixed_context, on_stream, serial_forward

from opts.kda_overlap import KdaOverlapConfig
from opts.kda_overlap import vllm as setting
from opts.kda_overlap.in_vllm import forward as overlap
from opts.kda_overlap.in_vllm import kernels as vllm_kernels
from opts.kda_overlap.step import side_stream
from opts.vllm_setting import PLATFORMS

TOL = {"atol": 1e-5, "rtol": 1e-5}
TARGETS = (setting.FORWARD_TARGET, setting.VERIFY_TARGET, setting.PREFILL_TARGET, setting.PACKED_TARGET)




def stock_forward():
    """vLLM's own `_forward`, also after an in-process engine installed the plugin's patches in this process."""
    from ablations.backends.vllm.in_vllm.patches import stock

    return stock("vllm.models.kimi_k3.nvidia.kda:KimiK3DeltaAttention._forward")

def test_stock_cells_are_empty_and_off_is_stock_everywhere():
    assert {p: "off" for p in PLATFORMS} == setting.STOCK_MODES
    for platform in PLATFORMS:
        assert setting.vllm_setting(KdaOverlapConfig(mode="off"), platform).is_stock


@pytest.mark.parametrize("platform", ["cpu", "cuda"])
def test_on_is_four_patches_and_only_the_packed_pass_is_counted(platform):
    result = setting.vllm_setting(KdaOverlapConfig(mode="on", chunk_size=32), platform)
    assert not result.engine_args and not result.env and not result.additional_config
    assert tuple(p.target for p in result.patches) == TARGETS
    assert [p.counter for p in result.patches] == [None, None, None, "kda_overlap_packed_step"]
    assert all(p.why.startswith("kda_overlap=on") for p in result.patches)
    forward = result.patches[0].wrap(lambda self: None)
    assert forward.__wrapped__ is not None
    assert result.patches[3].wrap(overlap.packed_step) is overlap.packed_step


@pytest.mark.parametrize(("mode", "platform", "valid"), [
    ("streams", "cpu", "off, on"),
])
def test_cells_vllm_cannot_run_name_the_valid_modes(mode, platform, valid):
    with pytest.raises(ValueError, match=rf"kda_overlap={mode} on {platform}: .*; valid there: {valid}$"):
        setting.vllm_setting(KdaOverlapConfig(mode=mode), platform)


@pytest.mark.parametrize("platform", ["cuda"])
def test_streams_on_a_gpu_is_four_patches_and_only_the_two_stream_step_is_counted(platform):
    result = setting.vllm_setting(KdaOverlapConfig(mode="streams"), platform)
    assert not result.engine_args and not result.env and not result.additional_config
    assert tuple(p.target for p in result.patches) == (*TARGETS[:3], setting.STREAMED_TARGET)
    assert [p.counter for p in result.patches] == [None, None, None, "kda_overlap_streamed_step"]
    assert result.patches[2].wrap(OFF.chunk_kda_with_fused_gate).__wrapped__ is OFF.chunk_kda_with_fused_gate
    assert result.patches[3].wrap(overlap.streamed_step) is overlap.streamed_step


def test_a_bad_platform_or_config_is_refused():
    with pytest.raises(ValueError, match="platform: invalid value 'tpu'"):
        setting.vllm_setting(KdaOverlapConfig(mode="on"), "tpu")
    with pytest.raises(ValueError, match="expected a KdaOverlapConfig"):
        setting.vllm_setting(SimpleNamespace(mode="on"), "cpu")


def test_the_package_does_not_import_ablations_or_vllm_at_import_time():
    from pathlib import Path

    for path in Path(overlap.__file__).parents[1].rglob("*.py"):
        text = path.read_text()
        assert "ablations" not in re.sub(r'""".*?"""', "", text, flags=re.S), path.name
        assert not re.search(r"^(from vllm|import vllm)", text, flags=re.M), path.name


@pytest.fixture(scope="module")
def vllm():
    from ablations.backends.vllm.launch.runtime import hide_media_wheels

    with contextlib.suppress(RuntimeError):
        hide_media_wheels()
    return pytest.importorskip("vllm")


def test_every_target_exists_in_vllm_and_the_wrappers_take_its_arguments(vllm):
    from vllm.models.kimi_k3.nvidia.ops.third_party.kda import chunk, fused_recurrent

    from ablations.backends.vllm.in_vllm.patches import resolve

    for target in (*TARGETS, setting.STREAMED_TARGET):
        owner, attr = resolve(target)
        assert callable(getattr(owner, attr))
    for stock, ours in ((fused_recurrent.fused_recurrent_kda, overlap.defer_verify(None)),
                        (chunk.chunk_kda_with_fused_gate, overlap.packed_prefill(None)),
                        (chunk.chunk_kda_with_fused_gate, overlap.streamed_prefill(None)),
                        (fused_recurrent.fused_recurrent_kda, vllm_kernels.fused_recurrent_kda),
                        (chunk.chunk_kda_with_fused_gate, vllm_kernels.chunk_kda_with_fused_gate)):
        names = list(inspect.signature(ours, follow_wrapped=False).parameters)
        assert names == list(inspect.signature(stock).parameters)


def test_forward_reads_no_verification_output_before_the_prefill_kernel(vllm):
    """What deferring relies on (kda.py:1136-1318): the verification call comes first, and nothing between it
    and the prefill kernel reads its output, the recurrent state it writes, or calls it again."""

    source = inspect.getsource(stock_forward())
    verify = source.index("core_attn_out_spec, _ = fused_recurrent_kda(")
    prefill = source.index("= chunk_kda_with_fused_gate(")
    between = source[source.index(")\n", verify):prefill]
    assert verify < prefill
    assert not re.search(r"\b(core_attn_out_spec|spec_out|fused_recurrent_kda)\b", between)
    assert re.findall(r"(?<!\w)recurrent_state\b[^\n]*", between) == [
        "recurrent_state,", "recurrent_state=recurrent_state,"]  # the gather of prefill slots; flashkda export


def layer(**values):
    return SimpleNamespace(**{"prefix": PREFIX, "kda_prefill_backend": "triton", "use_recoverssm": False, **values})


OFF = SimpleNamespace(fused_recurrent_kda=vllm_kernels.fused_recurrent_kda,
                      chunk_kda_with_fused_gate=vllm_kernels.chunk_kda_with_fused_gate)


@pytest.fixture
def packed_calls(monkeypatch):
    """Calls of the packed pass, spied where the patch layer counts it (the module attribute)."""
    calls = []
    real = overlap.packed_step

    def spy(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(overlap, "packed_step", spy)
    return calls


def run_on(case, chunk_size=64, spec_out=None, **layer_values):
    ops = SimpleNamespace(fused_recurrent_kda=overlap.defer_verify(OFF.fused_recurrent_kda),
                          chunk_kda_with_fused_gate=overlap.packed_prefill(OFF.chunk_kda_with_fused_gate))
    forward = overlap.overlap_forward(lambda self, c: serial_forward(c, ops, spec_out), chunk_size)
    return forward(layer(**layer_values), case)


@pytest.mark.parametrize("chunk_size", [16, 64])
@pytest.mark.parametrize("into_view", [False, True])
def test_on_equals_off_on_a_mixed_step_in_one_packed_pass(vllm, packed_calls, chunk_size, into_view):
    off, on = mixed_case(seed=7), mixed_case(seed=7)
    spec_buffer = torch.full((1, 20, 3, 16), float("nan"))
    with mixed_context(3, 4):
        want_v, want_p = serial_forward(off, OFF)
        got_v, got_p = run_on(on, chunk_size, spec_out=spec_buffer[:, 4:16] if into_view else None)
    assert packed_calls == [1]
    if into_view:
        assert got_v.data_ptr() == spec_buffer[:, 4:16].data_ptr()
        assert torch.isnan(spec_buffer[:, :4]).all() and torch.isnan(spec_buffer[:, 16:]).all()
    for got, want in ((got_v, want_v), (got_p, want_p), (on.cache, off.cache)):
        assert not torch.isnan(got).any()
        torch.testing.assert_close(got, want, **TOL)
    assert torch.equal(got_v[0, 6:9], torch.zeros(3, 3, 16))  # the null row


@pytest.mark.parametrize(("num_prefills", "num_spec_decodes", "layer_values"), [
    (0, 4, {}), (3, 0, {}), (3, 4, {"use_recoverssm": True}), (3, 4, {"kda_prefill_backend": "flashkda"}),
])
def test_other_steps_run_off_exactly(vllm, packed_calls, num_prefills, num_spec_decodes, layer_values):
    off, on = mixed_case(seed=8), mixed_case(seed=8)
    with mixed_context(num_prefills, num_spec_decodes):
        want = serial_forward(off, OFF)
        got = run_on(on, **layer_values)
    assert packed_calls == []
    for a, b in zip((*got, on.cache), (*want, off.cache), strict=True):
        assert torch.equal(a, b)


def test_outside_a_marked_step_the_kernels_pass_through(packed_calls):
    off, on = mixed_case(seed=9), mixed_case(seed=9)
    ops = SimpleNamespace(fused_recurrent_kda=overlap.defer_verify(OFF.fused_recurrent_kda),
                          chunk_kda_with_fused_gate=overlap.packed_prefill(OFF.chunk_kda_with_fused_gate))
    for a, b in zip(serial_forward(on, ops), serial_forward(off, OFF), strict=True):
        assert torch.equal(a, b)
    assert packed_calls == []


def test_streams_run_the_verification_on_a_side_stream_and_equal_off_exactly(vllm, monkeypatch):
    """The split and join on the CPU's streams (they run in order): the verification kernel on the side stream,
    the prefill kernel on the current one, the same kernels as off, so every output and state bit-exact; one
    two-stream step per mixed step, none otherwise."""
    calls, seen = [], []
    real = overlap.streamed_step
    monkeypatch.setattr(overlap, "streamed_step", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    verify = on_stream(OFF.fused_recurrent_kda, seen, "verify")
    prefill = on_stream(OFF.chunk_kda_with_fused_gate, seen, "prefill")
    ops = SimpleNamespace(fused_recurrent_kda=overlap.defer_verify(verify),
                          chunk_kda_with_fused_gate=overlap.streamed_prefill(prefill))
    forward = overlap.overlap_forward(lambda self, c: serial_forward(c, ops), 64)
    off, on = mixed_case(seed=12), mixed_case(seed=12)
    with mixed_context(3, 4):
        want = serial_forward(off, OFF)
        got = forward(layer(), on)
    assert calls == [1]
    main, side = torch.cpu.current_stream(), side_stream(torch.device("cpu"))
    assert [name for name, _ in seen] == ["verify", "prefill"]
    assert seen[0][1] is side is not main and seen[1][1] is main
    for a, b in zip((*got, on.cache), (*want, off.cache), strict=True):
        assert not torch.isnan(a).any() and torch.equal(a, b)
    seen.clear()
    with mixed_context(3, 0):      # not a mixed step: both kernels as off, on the current stream
        forward(layer(), mixed_case(seed=12))
    assert calls == [1] and [(name, s is main) for name, s in seen] == [("verify", True), ("prefill", True)]


def test_a_deferred_call_the_step_never_consumes_is_an_error(vllm):
    case = mixed_case(seed=10)
    verify_only = overlap.defer_verify(OFF.fused_recurrent_kda)
    forward = overlap.overlap_forward(lambda self, c: verify_only(**c.verify, initial_state=c.cache), 64)
    with mixed_context(3, 4), pytest.raises(RuntimeError, match="deferred its verification rows but never"):
        forward(layer(), case)
    assert overlap.current_call() is None


def test_installed_through_the_patch_layer_the_kernels_of_a_mixed_step_are_replaced(vllm, monkeypatch):
    """The CPU fix's two kernels (counted), then kda_overlap=on on top, as the plugin installs them; a fake
    `_forward` in vLLM's order calls the ops module's attributes. A mixed step counts one packed pass and
    neither kernel; a plain step counts the kernels and no packed pass."""
    from vllm.models.kimi_k3.nvidia.kda import KimiK3DeltaAttention
    from vllm.models.kimi_k3.nvidia.ops.third_party import kda as ops

    from ablations.backends.vllm.in_vllm import counters, patches
    from ablations.backends.vllm.in_vllm.cpu import PATCHES
    from ablations.backends.vllm.in_vllm.patches import resolve

    monkeypatch.setattr(patches, "_installed", {})
    monkeypatch.setattr(patches, "_order", [])
    monkeypatch.setattr(counters, "_counts", counters.Counter())
    monkeypatch.delenv(counters.COUNTER_DIR_ENV, raising=False)
    for target in (*TARGETS, setting.STREAMED_TARGET):
        owner, attr = resolve(target)
        monkeypatch.setattr(owner, attr, owner.__dict__[attr] if isinstance(owner, type) else getattr(owner, attr))
    monkeypatch.setattr(KimiK3DeltaAttention, "_forward", lambda self, case: serial_forward(case, ops))
    fixes = [p for p in PATCHES if p.target in (setting.VERIFY_TARGET, setting.PREFILL_TARGET)]
    toggle = setting.vllm_setting(KdaOverlapConfig(mode="on"), "cpu").patches
    patches.install_all([*fixes, *toggle])
    assert [p.target for p in patches.installed()].count(setting.VERIFY_TARGET) == 2

    off = mixed_case(seed=11)
    with mixed_context(3, 4):
        want = serial_forward(off, OFF)
        on = mixed_case(seed=11)
        got = KimiK3DeltaAttention._forward(layer(), on)
    assert dict(counters._counts) == {"kda_overlap_packed_step": 1}
    for a, b in zip((*got, on.cache), (*want, off.cache), strict=True):
        torch.testing.assert_close(a, b, **TOL)
    with mixed_context(3, 0):
        KimiK3DeltaAttention._forward(layer(), mixed_case(seed=11))
    assert dict(counters._counts) == {"kda_overlap_packed_step": 1, "kda_recurrent_verify": 1,
                                      "kda_chunk_prefill": 1}
