"""cache_retention's hit-rate bench: the sweep (rows, infeasible capacities, ratios, parallel = serial), its
cases, its plot and `python -m opts bench cache_retention` (table, --json, --out, errors), on small streams."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from opts import registry
from opts.__main__ import main
from opts.cache_retention import K3_TP8, OPTIMIZATION, TINY, CacheRequest, CacheStream, HitRateCase, Scenario
from opts.cache_retention.bench.plot import plot_sweep
from opts.cache_retention.bench.runner import run_bench
from opts.cache_retention.bench.sweep import POLICIES, check_fractions, check_policies, num_blocks_at, run_policy, sweep
from opts.cache_retention.cases import bench_cases
from opts.cache_retention.retention import NO_SESSIONS

CHUNK = 16
FRACTIONS = (0.05, 0.35, 0.5, 1.0)


def _ids(base: int, num_tokens: int, shared: tuple[int, ...]) -> tuple[int, ...]:
    n = -(-num_tokens // CHUNK)
    return shared[:n] + tuple(range(base, base + max(0, n - len(shared))))


def small_stream() -> CacheStream:
    """Three sessions of four growing turns sharing a 256-token system prompt, then one 1500-token request."""
    system = tuple(range(1, 17))
    requests, previous, t = [], {}, 0.0
    for turn in range(4):
        for session, base in (("a", 1000), ("b", 2000), ("c", 3000)):
            prompt = 300 + 200 * turn
            requests.append(CacheRequest(t, t + 2.0, prompt, 20, _ids(base, prompt + 64, system), session,
                                         previous.get(session)))
            previous[session] = len(requests) - 1
            t += 0.5
    requests.append(CacheRequest(t, t + 1.0, 1500, 10, _ids(9000, 1500, ()), None, None))
    return CacheStream(tuple(requests), CHUNK, "small")


SMALL = Scenario("small", small_stream, TINY)


@pytest.fixture(scope="module")
def result():
    return sweep(SMALL, FRACTIONS, workers=1, progress=None)


def test_rows_per_fraction_and_policy_after_the_unbounded_one(result) -> None:
    assert result.working_set_blocks == 53 and result.num_requests == 13
    assert [r["policy"] for r in result.rows] == ["unbounded", *POLICIES * len(FRACTIONS)]
    assert result.unbounded["fraction"] is None and result.unbounded["num_blocks"] == 53
    row = result.row("on", 0.5)
    assert row["num_blocks"] == num_blocks_at(53, 0.5) == 26
    assert row["capacity_bytes"] == 26 * TINY.block_bytes
    stats = run_policy(small_stream(), TINY, "on", 26)
    assert row["hit_rate"] == stats.hit_rate and row["prefill_tokens_saved"] == stats.hit_tokens
    assert (row["num_evictions"], row["checkpoint_bytes"], row["num_waits"]) == (
        stats.num_evictions, stats.checkpoint_bytes, stats.num_waits)
    assert row["feasible"] and row["reason"] is None and row["seconds"] >= 0


def test_a_capacity_below_the_largest_request_is_an_infeasible_row(result) -> None:
    for policy in POLICIES:
        row = result.row(policy, 0.05)
        assert not row["feasible"] and row["hit_rate"] is None
        assert "needs 5 blocks of 128 tokens; the pool has 2" in row["reason"]
    assert result.hit_rates("off")[0] is None and all(h is not None for h in result.hit_rates("off")[1:])
    table = result.table()
    assert "     n/a" in table and "infeasible at fraction 0.05: small: request 0" in table


def test_ratio_is_on_over_off(result) -> None:
    on, off = result.hit_rates("on"), result.hit_rates("off")
    assert result.ratios() == [None, *(a / b for a, b in zip(on[1:], off[1:], strict=True))]
    assert result.ratios()[1] > 1.5, "on keeps the sessions' turns that off evicts at 35%"
    assert result.ratios()[-1] == 1.0


@pytest.mark.spawns
def test_cells_in_worker_processes_match_cells_here(result) -> None:
    lines: list[str] = []
    parallel = sweep(SMALL, FRACTIONS, workers=2, progress=lines.append)
    assert parallel.workers == 2 and len(lines) == len(FRACTIONS) * len(POLICIES)
    assert [line.split("]")[0] for line in lines] == [f"[{k}/20" for k in range(1, 21)]
    assert any("] small fraction 0.05 (2 blocks) belady: infeasible (" in line for line in lines)

    def strip(rows):
        return [{k: v for k, v in r.items() if k != "seconds"} for r in rows]

    assert strip(parallel.rows) == strip(result.rows)


def sessionless_stream() -> CacheStream:
    return dataclasses.replace(small_stream(), requests=tuple(dataclasses.replace(r, session=None, continues=None)
                                                              for r in small_stream().requests))


def test_a_stream_without_sessions_replays_off_once_for_every_mode() -> None:
    """Every mode runs as off there (retention.run's fallback): the sweep copies off's row, and each copy is what
    a replay of that mode gives."""
    lines: list[str] = []
    got = sweep(Scenario("plain", sessionless_stream, TINY), FRACTIONS, workers=1, progress=lines.append)
    assert len(lines) == len(FRACTIONS) * len(POLICIES)
    assert sum("the replay of off" in line for line in lines) == 3 * len(FRACTIONS)
    for fraction in FRACTIONS:
        off = got.row("off", fraction)
        for mode in ("evict", "resume", "on"):
            row = got.row(mode, fraction)
            assert row["same_replay_as"] == "off"
            if not row["feasible"]:
                assert not off["feasible"] and "fallback" not in row
                continue
            assert row["fallback"] == NO_SESSIONS
            replayed = run_policy(sessionless_stream(), TINY, mode, row["num_blocks"]).summary()
            assert {k: row[k] for k in replayed if k in row} == {k: replayed[k] for k in replayed if k in row}
            assert row["hit_rate"] == off["hit_rate"]
        assert "same_replay_as" not in got.row("belady", fraction)


def test_bad_fractions_and_policies_are_named() -> None:
    assert check_fractions([1.0, 0.5, 0.5]) == (0.5, 1.0)
    with pytest.raises(ValueError, match=r"fractions: invalid value\(s\) \[0, -1\]"):
        check_fractions([0.5, 0, -1])
    assert check_policies(["on", "off"]) == ("off", "on")
    with pytest.raises(ValueError, match=r"policies: invalid value\(s\) \['lru'\]; valid choices: off, evict"):
        check_policies(["off", "lru"])
    with pytest.raises(ValueError, match="workers: invalid value 0"):
        sweep(SMALL, FRACTIONS, workers=0)


def test_a_sweep_without_on_or_off_has_no_ratio() -> None:
    only = sweep(SMALL, (1.0,), ("evict",), workers=1, progress=None)
    assert only.policies == ("evict",) and only.ratios() == [None]


def test_plot_is_a_png(result, tmp_path: Path) -> None:
    path = plot_sweep(result, tmp_path / "small.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000


def test_cases() -> None:
    quick = bench_cases(True, "cpu")
    assert [c.name for c in quick] == ["quick_agentx_small", "quick_mooncake_conversation_1000"]
    assert [c.scenario.geometry for c in quick] == [TINY, K3_TP8]
    full = bench_cases(False, "cuda")
    assert [c.name for c in full] == ["agentx", "agentx_small", "mooncake_conversation", "mooncake_synthetic"]
    assert all(c.fractions == (0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1.0) and c.policies == POLICIES for c in full)
    with pytest.raises(ValueError, match=r"fractions: invalid value\(s\) \[0\]; valid: fractions of the working"):
        HitRateCase("x", SMALL, (1.0, 0))


def test_run_bench_writes_plots_and_returns_the_ratio(tmp_path: Path) -> None:
    lines: list[str] = []
    case = HitRateCase("small_case", SMALL, FRACTIONS)
    out = run_bench([case], quick=True, out_dir=tmp_path / "plots", workers=1, progress=lines.append)
    [row] = out["cases"]
    assert row["case"] == "small_case" and row["ratio"] == min(r for r in row["ratios"] if r is not None) == 1.0
    assert (tmp_path / "plots" / "small_case.png").is_file() and row["plot"] == str(tmp_path / "plots/small_case.png")
    assert any(line.startswith("small at k3_tiny/tp1: 13 requests") for line in lines)
    json.dumps(out)


@pytest.fixture
def small_registry(monkeypatch: pytest.MonkeyPatch):
    cases = [HitRateCase("small_case", SMALL, FRACTIONS), HitRateCase("other_case", SMALL, (1.0,), ("off", "on"))]
    opt = dataclasses.replace(OPTIMIZATION, bench_cases=lambda quick, device: cases)
    monkeypatch.setitem(registry.OPTIMIZATIONS, "cache_retention", opt)


def test_cli_prints_the_table_and_writes_json_and_plots(small_registry, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "cr.json"
    assert main(["bench", "cache_retention", "--quick", "--case", "small", "--json", str(path),
                 "--out", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    assert "fraction   blocks       GB     off   evict  resume      on  belady  on/off" in printed
    assert f"wrote {path}" in printed
    result = json.loads(path.read_text())
    assert result["optimization"] == "cache_retention" and result["quick"] is True
    assert [c["case"] for c in result["cases"]] == ["small_case"]
    assert result["cases"][0]["hit_rates"]["off"][0] is None
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["small_case.png"]


def test_cli_writes_plots_to_outputs_by_default(small_registry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["bench", "cache_retention", "--case", "other_case"]) == 0
    assert (tmp_path / "outputs" / "cache_retention" / "other_case.png").is_file()


def test_cli_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "cache_retention", "--quick", "--case", "nope"]) == 2
    assert capsys.readouterr().err == ("error: cache_retention: no benchmark case matches 'nope'; cases: "
                                       "quick_agentx_small, quick_mooncake_conversation_1000\n")
    (tmp_path / "file").write_text("")
    assert main(["bench", "cache_retention", "--quick", "--case", "quick_agentx_small", "--out",
                 str(tmp_path / "file")]) == 2
    assert "--out: " in capsys.readouterr().err
    assert main(["bench", "kda_overlap", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err == ("error: --out: kda_overlap writes no files but --json; --out is for "
                                       "cache_retention, draft_length\n")
    assert main(["bench", "moe_dedup", "--quick", "--out", str(tmp_path)]) == 2
    assert "--out: moe_dedup writes no files" in capsys.readouterr().err
