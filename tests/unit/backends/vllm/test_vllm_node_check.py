"""The node self-check without a GPU: it refuses here with the reason; the modes it would check on each GPU
platform are exactly those vLLM runs there (the rest listed with the reason), each on the right engine; and
its verdict names what a run got wrong. The engines themselves: tests/e2e/test_vllm_node_check_engines.py."""

from __future__ import annotations

import pytest

from ablations.backends.vllm import __main__ as cli
from ablations.backends.vllm.cells.node_check import (
    NUM_SPEC_TOKENS,
    EngineRun,
    ModeResult,
    judge,
    mode_checks,
    node_check,
    stock_vector,
    summary,
)
from ablations.backends.vllm.config import ModelConfig
from opts.registry import OPTIMIZATIONS, make_config

MODEL = ModelConfig(dtype="bfloat16")


def test_it_refuses_on_a_machine_without_a_gpu(capsys, tmp_path):
    assert cli.main(["node-check", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: node-check runs on a GPU node (ROCm or CUDA) and torch sees no GPU here; on a CPU the "
                   "e2e tests check the CPU's modes (make test)"]
    with pytest.raises(RuntimeError, match="torch sees no GPU here"):
        node_check(tmp_path)
    assert not any(tmp_path.iterdir()), "nothing started"


@pytest.mark.parametrize("platform", ["rocm", "cuda"])
def test_it_checks_every_mode_the_platform_wires_and_lists_the_rest(platform):
    checks, skipped = mode_checks(platform, MODEL)
    total = sum(len(opt.config_cls.MODES) for opt in OPTIMIZATIONS.values())
    assert len(checks) + len(skipped) == total
    for check in checks:
        fields = check.engine.toggles[check.toggle]
        assert fields["mode"] == check.mode
        OPTIMIZATIONS[check.toggle].vllm_setting(make_config(check.toggle, **fields), platform)    # wired
        stock = {k: v["mode"] for k, v in stock_vector(platform).items()}
        assert {k: v["mode"] for k, v in check.engine.toggles.items() if k != check.toggle} == {
            k: m for k, m in stock.items() if k != check.toggle}
        assert {k: v["mode"] for k, v in check.stock.toggles.items()} == stock
        assert check.engine.platform == check.stock.platform == platform
        assert check.engine.num_speculative_tokens == (NUM_SPEC_TOKENS if check.toggle == "kda_overlap" else 0)
        assert check.engine.model.dtype == "bfloat16"
    assert all(f["sampling"] == "standard" for c in checks if c.toggle == "draft_length"
               for f in [c.engine.toggles["draft_length"]])
    wired = {(c.toggle, c.mode) for c in checks}
    assert ("fusion", "off") in wired and ("fusion", "on") in wired and ("kda_overlap", "off") in wired
    expected_skips = {"rocm": {"moe_dedup=sp"},
                      "cuda": {"aiter_mla=on"}}[platform]
    named = {line.split(":")[0] for line in skipped}
    assert {("kda_overlap", "on"), ("kda_overlap", "streams")} <= wired
    assert expected_skips <= named and all("not wired on " + platform in line for line in skipped)


def test_the_verdict_names_silent_routes_other_tokens_and_processes_that_missed_the_vector():
    (check,) = [c for c in mode_checks("rocm", MODEL)[0] if (c.toggle, c.mode) == ("fusion", "on")]
    targets = [p.target for p in check.engine.settings()["fusion"].patches]
    record = {"pid": 7, "toggles": check.engine.toggles, "patches": [{"target": t} for t in targets]}
    counts = {"fusion_mla_norm_fused": 40, "fusion_kda_decode_fused": 6}
    stock = [[1, 2, 3], [4, 5, 6]]
    assert judge(check, EngineRun(stock, counts, [record], 1.0), stock) == []
    other = {"pid": 8, "toggles": {**check.engine.toggles, "fusion": {"mode": "off"}}, "patches": []}
    problems = judge(check, EngineRun([[1, 2, 3], [4, 9, 6]], {"fusion_mla_norm_fused": 40}, [record, other], 1.0),
                     stock)
    assert problems[0] == "fusion=on never fired (fusion_kda_decode_fused: 0 calls)"
    assert problems[1] == "greedy tokens differ from stock in 1 of 2 prompts (first: prompt 1, token 1)"
    assert problems[2] == "process 8 read fusion=off"
    assert problems[3].startswith("process 8 did not install vllm.")
    assert judge(check, EngineRun(stock, counts, [], 1.0), stock) == ["no vLLM process recorded a toggle vector"]
    results = [ModeResult("fusion", "on", [], 3.0), ModeResult("fusion", "off", ["x"], 2.0)]
    assert results[1].line() == "fusion=off: FAILED: x (2 s)"
    assert summary(results, ["a", "b"]) == "node-check: 1 of 2 modes passed; failed: fusion=off; 2 not wired here"
