"""`python -m ablations.workload stats|generate|export`."""

from __future__ import annotations

import json
import re
import sys

import procs
import pytest
from workload_helpers import SYNTHETIC, row

from ablations.workload import read_trace
from ablations.workload.__main__ import main

JSON_KEYS = {"requests", "sessions", "input_len_p50", "input_len_p90", "output_len_mean", "theoretical_prefix_reuse"}


@pytest.mark.spawns
def test_stats_json_of_a_vendored_trace_through_the_module_entry_point(tmp_path):
    name = f"pkg://ablations.workload/traces/{SYNTHETIC.name}"
    done = procs.run([sys.executable, "-m", "ablations.workload", "stats", name, "--json"], timeout_s=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    stats = json.loads(out)
    assert set(stats) >= JSON_KEYS
    assert stats["requests"] == 3993
    assert stats["sessions"] is None


def test_generate_then_stats_and_export(tmp_path, capsys):
    session_file = tmp_path / "small.jsonl"
    assert main(["generate", "agentx_small", "--out", str(session_file), "--seed", "3"]) == 0
    capsys.readouterr()
    assert main(["stats", str(session_file), "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert set(stats) >= JSON_KEYS
    assert stats["sessions"] == 4
    assert stats["theoretical_prefix_reuse"] > 0.96
    assert main(["stats", str(session_file)]) == 0
    assert "prefix reuse" in capsys.readouterr().out

    timed = tmp_path / "timed.jsonl"
    assert main(["export", str(session_file), "--format", "timed_trace", "--out", str(timed)]) == 0
    exported, original = read_trace(timed), read_trace(session_file)
    assert not exported.has_sessions
    assert [r.hash_ids for r in exported.requests] == [r.hash_ids for r in original.requests]
    assert main(["stats", str(timed), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["theoretical_prefix_reuse"] == stats["theoretical_prefix_reuse"]


def test_same_seed_same_file(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    main(["generate", "agentx_small", "--out", str(a), "--seed", "11"])
    main(["generate", "agentx_small", "--out", str(b), "--seed", "11"])
    assert a.read_bytes() == b.read_bytes()


@pytest.mark.parametrize(
    ("argv", "pattern"),
    [
        (["generate", "agentx_huge", "--out", "OUT"], r"preset: unknown name 'agentx_huge'"),
        (["stats", "BAD"], r"bad.jsonl:2: field 'input_length' missing"),
        (["export", "UNSORTED", "--format", "timed_trace", "--out", "OUT"],
         r"unsorted.jsonl:2: field 'timestamp': 5 is earlier than 9"),
        (["generate", "agentx_small", "--out", "DIR"], r"--out .*/dir: is a directory$"),
        (["generate", "agentx_small", "--out", "DEEP"],
         r"--out .*/x/y\.jsonl: directory '.*/missing/x' does not exist$"),
        (["export", "BAD", "--format", "session", "--out", "DEEP"], r"directory '.*/missing/x' does not exist$"),
        (["stats", "DIR"], r"/dir: is a directory, not a trace file$"),
        (["stats", "ABSENT"], r"/absent.jsonl: no such file$"),
        (["stats", "JSON"], r"json.jsonl:1: bad JSON: Expecting property name enclosed in double quotes at column 2$"),
        (["generate", "agentx_small", "--out", "OUT", "--seed", "-1"], r"argument --seed: '-1' is not an integer >= 0"),
        (["generate", "agentx_small", "--out", "OUT", "--sessions", "0"],
         r"argument --sessions: '0' is not an integer >= 1"),
        (["stats", "BAD", "--block-size", "x"], r"argument --block-size: 'x' is not an integer >= 1"),
        (["generate", "agentx_small"], r"the following arguments are required: --out"),
    ],
)
def test_errors_are_one_line_with_exit_code_2(argv, pattern, write_rows, capsys, tmp_path):
    files = {
        "BAD": write_rows([row(), {"timestamp": 1, "output_length": 1, "hash_ids": [1]}], name="bad.jsonl"),
        "UNSORTED": write_rows([row(ts=9, block_size=4), row(ts=5, block_size=4)], name="unsorted.jsonl"),
        "JSON": write_rows(["{oops"], name="json.jsonl"),
        "OUT": tmp_path / "out.jsonl",
        "DIR": tmp_path / "dir",
        "DEEP": tmp_path / "missing" / "x" / "y.jsonl",
        "ABSENT": tmp_path / "absent.jsonl",
    }
    files["DIR"].mkdir()
    before = set(tmp_path.rglob("*"))
    try:
        code = main([str(files.get(a, a)) for a in argv])
    except SystemExit as exit_:
        code = exit_.code
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ")
    assert err.count("\n") == 1
    assert re.search(pattern, err)
    assert set(tmp_path.rglob("*")) == before


def test_export_sort_reorders_instead(tmp_path):
    path = tmp_path / "u.jsonl"
    path.write_text(json.dumps(row(ts=9, block_size=4)) + "\n" + json.dumps(row(ts=5, block_size=4)) + "\n")
    out = tmp_path / "sorted.jsonl"
    assert main(["export", str(path), "--format", "timed_trace", "--out", str(out), "--sort"]) == 0
    assert [r.timestamp_ms for r in read_trace(out).requests] == [5, 9]
