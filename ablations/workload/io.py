"""Read and write traces as JSONL: the Mooncake / vLLM `timed_trace` form and the session form.

One JSON object per line. The timed_trace form has exactly Mooncake's fields plus the block size:

    {"timestamp": ms, "input_length": int, "output_length": int, "hash_ids": [int, ...], "block_size": 512}

`block_size` is an extra key that vLLM's TimedTrace (reads only its four labelled keys) and aiperf's
MooncakeTrace model (extra="allow", never read) both ignore. The session form adds, per row, `session`
(str), `turn` (int from 0), `think_ms` and, on every row of a sub-agent session, `parent_session` and
`parent_turn`; it is still a valid timed_trace file. Unknown keys are an error, so nothing is dropped.
A name ending in `.gz` is read and written gzip-compressed.
"""

from __future__ import annotations

import gzip
import json
import os
import zlib
from collections.abc import Iterator
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any, BinaryIO, TextIO

from ablations.workload.paths import file_problem, output_problem, resolve_path
from ablations.workload.trace import DEFAULT_BLOCK_SIZE, Request, Trace, TraceError, where

TIMED_TRACE_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")
SESSION_FIELDS = ("session", "turn", "think_ms", "parent_session", "parent_turn")
KNOWN_FIELDS = (*TIMED_TRACE_FIELDS, "block_size", *SESSION_FIELDS)
FORMATS = ("timed_trace", "session")


def _open(path: Path) -> TextIO:
    if path.name.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


def _bad_json(err: json.JSONDecodeError, text: str) -> str:
    place = "column" if err.msg.endswith(" at") else "at column"
    cut = "" if text.endswith("\n") else "; the file ends mid-line (truncated?)"
    return f"bad JSON: {err.msg} {place} {err.colno}{cut}"


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    line_no = 0
    try:
        with _open(path) as f:
            for line_no, text in enumerate(f, start=1):
                yield line_no, text
    except (OSError, EOFError, zlib.error, UnicodeDecodeError) as err:
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        hint = " (truncated?)" if isinstance(err, EOFError) else ""
        raise TraceError(f"{where(str(path), line_no + 1 if line_no else None)}cannot read: {reason}{hint}") from None


def _rows(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    for line_no, text in _lines(path):
        here = where(str(path), line_no)
        if not text.strip():
            raise TraceError(f"{here}blank line (vLLM's timed_trace reader fails on it)")
        try:
            row = json.loads(text.rstrip("\r\n"))
        except json.JSONDecodeError as err:
            raise TraceError(f"{here}{_bad_json(err, text)}") from None
        if not isinstance(row, dict):
            raise TraceError(f"{here}expected a JSON object, got {type(row).__name__}")
        yield line_no, row


def _request(row: dict[str, Any], line_no: int, source: str) -> Request:
    here = where(source, line_no)
    unknown = sorted(set(row) - set(KNOWN_FIELDS))
    if unknown:
        raise TraceError(f"{here}unknown field(s) {', '.join(map(repr, unknown))}; known fields: "
                         f"{', '.join(KNOWN_FIELDS)}")
    for name in TIMED_TRACE_FIELDS:
        if name not in row:
            raise TraceError(f"{here}field {name!r} missing")
    if not isinstance(row["hash_ids"], list):
        raise TraceError(f"{here}field 'hash_ids': expected a list of integers, got "
                         f"{type(row['hash_ids']).__name__}")
    try:
        return Request(
            timestamp_ms=row["timestamp"],
            input_length=row["input_length"],
            output_length=row["output_length"],
            hash_ids=tuple(row["hash_ids"]),
            session=row.get("session"),
            turn=row.get("turn"),
            think_ms=row.get("think_ms", 0.0),
            parent_session=row.get("parent_session"),
            parent_turn=row.get("parent_turn"),
            line=line_no,
        )
    except TraceError as err:
        raise TraceError(f"{here}{err}") from None


def read_trace(path: str | os.PathLike, *, block_size: int | None = None) -> Trace:
    """Load a timed_trace or session-form JSONL file, gzip-compressed if its name ends in `.gz` (the form
    is told by the rows' fields). `path` may be `pkg://<package>/<file>` (see `paths.resolve_path`).

    The block size is the rows' `block_size` field when present (it must be the same on every row),
    else `block_size`, else 512. A `block_size` argument that contradicts the file is an error.
    """
    path = resolve_path(path)
    source = str(path)
    problem = file_problem(path)
    if problem:
        raise TraceError(f"{source}: {problem}")
    requests = []
    file_block_size: int | None = None
    first_line_with_size: int | None = None
    for line_no, row in _rows(path):
        requests.append(_request(row, line_no, source))
        size = row.get("block_size")
        if line_no == 1:
            file_block_size, first_line_with_size = size, (1 if size is not None else None)
        elif size != file_block_size:
            raise TraceError(f"{where(source, line_no)}field 'block_size': {size!r} differs from "
                             f"{file_block_size!r} on line 1; one block size per file")
    if not requests:
        raise TraceError(f"{source}: empty trace (no requests)")
    if file_block_size is not None:
        if isinstance(file_block_size, bool) or not isinstance(file_block_size, int) or file_block_size < 1:
            raise TraceError(f"{where(source, first_line_with_size)}field 'block_size': {file_block_size!r} "
                             "is not an integer >= 1")
        if block_size is not None and block_size != file_block_size:
            raise TraceError(f"{where(source, first_line_with_size)}field 'block_size': the file records "
                             f"{file_block_size}, but block_size={block_size} was asked for")
    resolved = file_block_size or block_size or DEFAULT_BLOCK_SIZE
    return Trace(tuple(requests), resolved, source)


def check_order(trace: Trace) -> None:
    """Raise, naming file and line, if timestamps decrease anywhere in file order."""
    previous = None
    for request in trace.requests:
        if previous is not None and request.timestamp_ms < previous.timestamp_ms:
            raise TraceError(
                f"{where(trace.source, request.line)}field 'timestamp': {_number(request.timestamp_ms)} is earlier "
                f"than {_number(previous.timestamp_ms)} on the row before (line {previous.line}); replay in file "
                "order needs non-decreasing timestamps")
        previous = request


def check_block_sizes(trace: Trace) -> None:
    """Raise, naming file and line, if a hash id is used at two block sizes (a partial last block whose id
    appears elsewhere at another size). aiperf materializes one block per id and rejects such a file."""
    partial: dict[int, tuple[int, Request]] = {}
    for request in trace.requests:
        size = request.input_length - (len(request.hash_ids) - 1) * trace.block_size
        if size < trace.block_size:
            known = partial.setdefault(request.hash_ids[-1], (size, request))
            if known[0] != size:
                _size_conflict(trace, request.hash_ids[-1], request, size, known)
    if not partial:
        return
    for request in trace.requests:
        full = request.hash_ids if request.input_length % trace.block_size == 0 else request.hash_ids[:-1]
        for h in full:
            if h in partial:
                _size_conflict(trace, h, request, trace.block_size, partial[h])


def _size_conflict(trace: Trace, h: int, request: Request, size: int, known: tuple[int, Request]) -> None:
    raise TraceError(f"{where(trace.source, request.line)}field 'hash_ids': id {h} names a {size}-token block "
                     f"here but a {known[0]}-token block on line {known[1].line}; one id must name one block")


def sorted_by_arrival(trace: Trace) -> Trace:
    """The same trace with its requests in timestamp order (stable)."""
    return Trace(tuple(trace.requests[i] for i in trace.arrival_order()), trace.block_size, trace.source)


def _number(value: float) -> int | float:
    return int(value) if float(value).is_integer() else value


def _row(request: Request, block_size: int, form: str) -> dict[str, Any]:
    row: dict[str, Any] = {
        "timestamp": _number(request.timestamp_ms),
        "input_length": request.input_length,
        "output_length": request.output_length,
        "hash_ids": list(request.hash_ids),
        "block_size": block_size,
    }
    if form == "session":
        row["session"] = request.session
        row["turn"] = request.turn
        row["think_ms"] = _number(request.think_ms)
        if request.parent_session is not None:
            row["parent_session"] = request.parent_session
            row["parent_turn"] = request.parent_turn
    return row


def write_trace(trace: Trace, path: str | os.PathLike, form: str = "session") -> Path:
    """Write `trace` as `form` ("timed_trace" or "session") JSONL, atomically; gzip-compressed if the name
    ends in `.gz`. The parent directory must exist. Rows stay in trace order, which must have non-decreasing
    timestamps (the order vLLM and aiperf replay in), and every hash id must name one block size
    (`check_block_sizes`)."""
    if form not in FORMATS:
        raise ValueError(f"form: invalid value {form!r}; valid choices: {', '.join(FORMATS)}")
    if form == "session" and not trace.has_sessions:
        raise TraceError(f"{where(trace.source, None)}the session form needs a trace with sessions; "
                         "write it as timed_trace")
    check_order(trace)
    check_block_sizes(trace)
    path = Path(path)
    problem = output_problem(path)
    if problem:
        raise ValueError(f"{path}: {problem}")
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as raw, _compressor(raw, path) as out:
            for request in trace.requests:
                out.write(json.dumps(_row(request, trace.block_size, form), separators=(",", ":")).encode())
                out.write(b"\n")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def _compressor(raw: BinaryIO, path: Path) -> AbstractContextManager[BinaryIO]:
    if path.name.endswith(".gz"):
        return gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0)
    return nullcontext(raw)
