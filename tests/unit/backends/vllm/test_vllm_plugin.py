"""The plugin's version gate and the replaced-kernel counters across processes."""

from __future__ import annotations

import sys

import procs
import pytest

from ablations.backends.vllm.in_vllm import plugin
from ablations.backends.vllm.in_vllm.counters import COUNTER_DIR_ENV, read_counts


@pytest.mark.parametrize("version", ["0.32.0", "0.32.0+cpu", "0.32.0+rocm700"])
def test_supported_version_passes(version):
    plugin.check_vllm_version(version)


@pytest.mark.parametrize("version", ["0.31.2", "0.33.0", "0.32.1+cpu"])
def test_other_versions_are_refused_with_both_versions_named(version):
    with pytest.raises(RuntimeError) as err:
        plugin.check_vllm_version(version)
    assert version in str(err.value) and plugin.SUPPORTED_VLLM_VERSION in str(err.value)


@pytest.mark.spawns
def test_counts_from_several_processes_are_summed(tmp_path):
    code = ("from ablations.backends.vllm.in_vllm.counters import count\n"
            "for _ in range(3): count('probe')\ncount('other')")
    env = {COUNTER_DIR_ENV: str(tmp_path), "PATH": ""}
    for _ in range(2):
        done = procs.run([sys.executable, "-c", code], timeout_s=120, env=env | {"PYTHONPATH": ":".join(sys.path)})
        assert done.returncode == 0, done.stderr[-3000:]
    assert read_counts(tmp_path) == {"probe": 6, "other": 2}
