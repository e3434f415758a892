"""The vendored Mooncake traces: their README's checksums, counts and source, and loading from any directory."""

from __future__ import annotations

import gzip
import hashlib
import re

import pytest
from workload_helpers import CONVERSATION, SYNTHETIC, TRACES_DIR

from ablations.workload import read_trace
from ablations.workload.paths import resolve_path

README = TRACES_DIR / "README.md"
ROW = re.compile(r"^\| (\S+\.jsonl\.gz) \| ([\d,]+) \| [^|]+ \| ([0-9a-f]{40}) \| ([0-9a-f]{64}) \|$", re.M)
UPSTREAM = {
    "conversation_trace.jsonl.gz": "a2a4b18ac537fd798d50e6e9f57031ce86419a37",
    "synthetic_trace.jsonl.gz": "3cca71daccf2a7afb8fe3f0295358f70e3a69fdb",
}


def readme_rows() -> dict[str, tuple[int, str, str]]:
    return {name: (int(count.replace(",", "")), commit, digest)
            for name, count, commit, digest in ROW.findall(README.read_text())}


def test_the_readme_lists_every_vendored_file_with_source_and_licence():
    text = README.read_text()
    assert sorted(readme_rows()) == sorted(p.name for p in TRACES_DIR.glob("*.jsonl.gz")) == sorted(UPSTREAM)
    assert {name: row[1] for name, row in readme_rows().items()} == UPSTREAM
    assert "https://github.com/kvcache-ai/Mooncake" in text
    assert "FAST25-release/traces" in text
    assert "Apache-2.0" in text


@pytest.mark.parametrize("path", [CONVERSATION, SYNTHETIC], ids=lambda p: p.name)
def test_uncompressed_content_matches_the_readme_checksum_and_count(path):
    count, _, digest = readme_rows()[path.name]
    data = gzip.decompress(path.read_bytes())
    assert hashlib.sha256(data).hexdigest() == digest
    assert data.count(b"\n") == count
    assert len(read_trace(path).requests) == count


def test_pkg_paths_load_from_any_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    trace = read_trace(f"pkg://ablations.workload/traces/{SYNTHETIC.name}")
    assert trace.source == str(SYNTHETIC)
    assert len(trace.requests) == 3993


def test_bad_pkg_paths_name_the_problem():
    with pytest.raises(ValueError, match=r"'pkg://nope/x.jsonl': no package named 'nope'"):
        resolve_path("pkg://nope/x.jsonl")
    with pytest.raises(ValueError, match=r"'pkg://ablations': expected pkg://<package>/<file>"):
        resolve_path("pkg://ablations")
