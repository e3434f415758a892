"""Reading and writing timed_trace / session JSONL, and every bad-input error naming file, line and field."""

from __future__ import annotations

import gzip
import json

import pytest
from workload_helpers import CONVERSATION, SYNTHETIC, raw_rows, row

from ablations.workload import OpenLoopSchedule, Trace, TraceError, read_trace, write_trace
from ablations.workload.io import check_block_sizes, check_order


@pytest.mark.parametrize(("path", "count"), [(CONVERSATION, 12031), (SYNTHETIC, 3993)])
def test_real_traces_load_unchanged(path, count):
    trace = read_trace(path)
    raw = raw_rows(path)
    assert len(trace.requests) == len(raw) == count
    assert trace.block_size == 512
    for request, original in zip(trace.requests, raw, strict=True):
        assert request.timestamp_ms == original["timestamp"]
        assert request.input_length == original["input_length"]
        assert request.output_length == original["output_length"]
        assert list(request.hash_ids) == original["hash_ids"]
    check_order(trace)
    check_block_sizes(trace)


def test_timed_trace_roundtrip_keeps_mooncake_fields_and_records_block_size(tmp_path, small_trace):
    path = write_trace(small_trace, tmp_path / "t.jsonl", "timed_trace")
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert all(set(r) == {"timestamp", "input_length", "output_length", "hash_ids", "block_size"} for r in rows)
    assert {r["block_size"] for r in rows} == {16}
    again = read_trace(path)
    assert again.block_size == 16
    assert not again.has_sessions
    assert [(r.timestamp_ms, r.input_length, r.output_length, r.hash_ids) for r in again.requests] == [
        (r.timestamp_ms, r.input_length, r.output_length, r.hash_ids) for r in small_trace.requests]


def test_session_roundtrip_is_exact(tmp_path, small_trace):
    again = read_trace(write_trace(small_trace, tmp_path / "s.jsonl", "session"))
    assert again.requests == small_trace.requests
    assert again.block_size == small_trace.block_size
    assert again.sessions.keys() == small_trace.sessions.keys()


def test_block_size_argument_for_files_without_one(write_rows):
    path = write_rows([row(n=10, block=4), row(ts=1, n=8, block=4)])
    assert read_trace(path, block_size=4).block_size == 4
    with pytest.raises(TraceError, match=r"trace.jsonl:1: field 'hash_ids': 3 ids, .* block_size 512 needs exactly 1"):
        read_trace(path)


@pytest.mark.parametrize(
    ("lines", "pattern"),
    [
        (['{"timestamp": 0, "input_length": 4,'], r"trace.jsonl:1: bad JSON: Expecting property name enclosed in "
                                                 r"double quotes at column 36$"),
        (['{"timestamp": "a\tb"}'], r"trace.jsonl:1: bad JSON: Invalid control character at column 17$"),
        ([row(), "[1, 2]"], r"trace.jsonl:2: expected a JSON object"),
        ([row(), ""], r"trace.jsonl:2: blank line"),
        ([{k: v for k, v in row().items() if k != "output_length"}], r":1: field 'output_length' missing"),
        ([{k: v for k, v in row().items() if k != "hash_ids"}], r":1: field 'hash_ids' missing"),
        ([row(), row(n=-5, ids=[])], r"trace.jsonl:2: field 'input_length': -5 is not an integer >= 1"),
        ([row(out=-1)], r":1: field 'output_length': -1 is not an integer >= 1"),
        ([row(out=2.5)], r":1: field 'output_length': 2.5 is not an integer >= 1"),
        ([row(ts=-3)], r":1: field 'timestamp': -3 is not a number >= 0"),
        ([row(n=10, ids=[1, 2])], r":1: field 'hash_ids': 2 ids, but input_length 10 at block_size 4 needs exactly 3"),
        ([row(n=8, ids=[1, 2, 3])], r":1: field 'hash_ids': 3 ids, but input_length 8 at block_size 4 needs exactly 2"),
        ([row(ids=[1, "x", 3])], r":1: field 'hash_ids': 'x' is not an integer"),
        ([row(ids=7)], r":1: field 'hash_ids': expected a list of integers, got int"),
        ([row(delay=5)], r":1: unknown field\(s\) 'delay'"),
        ([row(block_size=4), row(block_size=8)], r":2: field 'block_size': 8 differs from 4 on line 1"),
        ([row(block_size=4), row()], r":2: field 'block_size': None differs from 4"),
        ([row(session="a", turn=0), row()], r":2: field 'session' missing"),
        ([row(session="a")], r":1: fields 'session' and 'turn' must be given together"),
        ([row(session="a", turn=0), row(session="a", turn=0)], r":2: field 'turn': session 'a' turn 0 appears twice"),
        ([row(session="a", turn=0), row(session="a", turn=2)],
         r":2: field 'turn': session 'a' .* lacks turn\(s\) \[1\]"),
        ([row(session="a", turn=0), row(session="b", turn=0, parent_session="zz", parent_turn=0)],
         r":2: field 'parent_session': 'zz' is not a session"),
        ([row(session="a", turn=0), row(session="b", turn=0, parent_session="a", parent_turn=3)],
         r":2: field 'parent_turn': 3 is not a turn of session 'a'"),
        ([row(session="a", turn=0, parent_session="b", parent_turn=0),
          row(session="b", turn=0, parent_session="a", parent_turn=0)], r"is its own ancestor"),
        ([row(session="a", turn=0), row(session="b", turn=0, parent_session="a", parent_turn=0),
          row(session="b", turn=1)], r":3: field 'parent_session'/'parent_turn': None differs"),
    ],
)
def test_bad_input_names_file_line_and_field(write_rows, lines, pattern):
    with pytest.raises(TraceError, match=pattern):
        read_trace(write_rows(lines), block_size=4)


def test_block_size_argument_contradicting_the_file(write_rows):
    with pytest.raises(TraceError, match=r":1: field 'block_size': the file records 4, but block_size=16"):
        read_trace(write_rows([row(block_size=4)]), block_size=16)


def test_missing_and_empty_files(tmp_path, write_rows):
    with pytest.raises(TraceError, match="no such file"):
        read_trace(tmp_path / "absent.jsonl")
    with pytest.raises(TraceError, match="empty trace"):
        read_trace(write_rows([]))


def test_non_monotonic_timestamps_are_an_error_where_order_is_required(write_rows, tmp_path):
    path = write_rows([row(ts=0), row(ts=1500), row(ts=1200), row(ts=1600)])
    trace = read_trace(path, block_size=4)
    message = r"trace.jsonl:3: field 'timestamp': 1200 is earlier than 1500 on the row before \(line 2\)"
    with pytest.raises(TraceError, match=message):
        OpenLoopSchedule(trace)
    with pytest.raises(TraceError, match=message):
        write_trace(trace, tmp_path / "out.jsonl", "timed_trace")
    assert not (tmp_path / "out.jsonl").exists()


def test_a_hash_id_at_two_block_sizes_is_refused_on_write(tmp_path):
    from workload_helpers import request

    trace = Trace((request("a", 0, 6, [1, 2]), request("a", 1, 8, [1, 2], ts=1.0)), block_size=4)
    with pytest.raises(TraceError, match=r"id 2 names a 4-token block here but a 2-token block"):
        write_trace(trace, tmp_path / "x.jsonl")


def test_written_file_is_exactly_what_was_read(tmp_path):
    path = write_trace(read_trace(SYNTHETIC), tmp_path / "syn.jsonl", "timed_trace")
    written = raw_rows(path)
    assert [{k: v for k, v in r.items() if k != "block_size"} for r in written] == raw_rows(SYNTHETIC)


def test_gzip_roundtrip_is_exact_and_reproducible(tmp_path, small_trace):
    a = write_trace(small_trace, tmp_path / "a.jsonl.gz")
    b = write_trace(small_trace, tmp_path / "b.jsonl.gz")
    assert a.read_bytes() == b.read_bytes()
    assert gzip.decompress(a.read_bytes()) == write_trace(small_trace, tmp_path / "c.jsonl").read_bytes()
    assert read_trace(a).requests == small_trace.requests


def test_read_errors_name_the_file_and_the_line(tmp_path):
    cut = tmp_path / "cut.jsonl"
    cut.write_text(json.dumps(row()) + "\n" + json.dumps(row())[:20])
    with pytest.raises(TraceError, match=r"cut.jsonl:2: bad JSON: .* the file ends mid-line \(truncated\?\)$"):
        read_trace(cut, block_size=4)
    (tmp_path / "cut.jsonl.gz").write_bytes(SYNTHETIC.read_bytes()[:50_000])
    with pytest.raises(TraceError, match=r"cut.jsonl.gz:\d+: cannot read: Compressed file ended .*\(truncated\?\)$"):
        read_trace(tmp_path / "cut.jsonl.gz")
    (tmp_path / "plain.jsonl.gz").write_text(json.dumps(row()) + "\n")
    with pytest.raises(TraceError, match=r"plain.jsonl.gz: cannot read: Not a gzipped file"):
        read_trace(tmp_path / "plain.jsonl.gz", block_size=4)
    with pytest.raises(TraceError, match=r": is a directory, not a trace file$"):
        read_trace(tmp_path)


def test_write_refuses_a_directory_or_a_missing_parent_and_leaves_nothing(tmp_path, small_trace):
    with pytest.raises(ValueError, match=r": is a directory$"):
        write_trace(small_trace, tmp_path)
    with pytest.raises(ValueError, match=r"directory '.*/absent' does not exist$"):
        write_trace(small_trace, tmp_path / "absent" / "t.jsonl")
    assert sorted(p.name for p in tmp_path.iterdir()) == []
