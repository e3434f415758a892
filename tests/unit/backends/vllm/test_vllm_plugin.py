"""The plugin's version gate, the replaced-kernel counters across processes, and the KV block zeroing (S10)."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import types

import pytest
import torch

from ablations.backends.vllm import plugin
from ablations.backends.vllm.counters import COUNTER_DIR_ENV, read_counts
from ablations.backends.vllm.cpu import kv_blocks
from ablations.backends.vllm.runtime import hide_media_wheels


@pytest.mark.parametrize("version", ["0.32.0", "0.32.0+cpu", "0.32.0+rocm700"])
def test_supported_version_passes(version):
    plugin.check_vllm_version(version)


@pytest.mark.parametrize("version", ["0.31.2", "0.33.0", "0.32.1+cpu"])
def test_other_versions_are_refused_with_both_versions_named(version):
    with pytest.raises(RuntimeError) as err:
        plugin.check_vllm_version(version)
    assert version in str(err.value) and plugin.SUPPORTED_VLLM_VERSION in str(err.value)


def test_counts_from_several_processes_are_summed(tmp_path):
    code = "from ablations.backends.vllm.counters import count\nfor _ in range(3): count('probe')\ncount('other')"
    env = {COUNTER_DIR_ENV: str(tmp_path), "PATH": ""}
    for _ in range(2):
        subprocess.run([sys.executable, "-c", code], env=env | {"PYTHONPATH": ":".join(sys.path)}, check=True)
    assert read_counts(tmp_path) == {"probe": 6, "other": 2}


def test_supports_any_multiple_of_the_mla_kernel_block():
    assert kv_blocks.supports_block_size(None, 128) and kv_blocks.supports_block_size(None, 16)
    assert not kv_blocks.supports_block_size(None, 24)


def test_zeroing_covers_every_kernel_block_of_a_manager_block():
    with contextlib.suppress(RuntimeError):  # already hidden, or a media wheel was imported: then vllm may not load
        hide_media_wheels()
    vllm = pytest.importorskip("vllm.v1.kv_cache_interface", reason="vllm not installed")
    spec = vllm.FullAttentionSpec(block_size=32, num_kv_heads=1, head_size=8, dtype=torch.float32)
    num_blocks, per_block = 4, 2  # 32-token blocks split into 16-token kernel blocks
    kv = torch.ones(num_blocks * per_block, 16, 8)
    runner = types.SimpleNamespace(
        kv_cache_config=types.SimpleNamespace(
            num_blocks=num_blocks,
            kv_cache_groups=[types.SimpleNamespace(kv_cache_spec=spec, layer_names=["mla"])],
        ),
        compilation_config=types.SimpleNamespace(static_forward_context={"mla": types.SimpleNamespace(kv_cache=kv)}),
    )
    kv_blocks.zero_block_ids(runner, [1, 3])
    zeroed = (kv.abs().sum((1, 2)) == 0).nonzero().flatten().tolist()
    assert zeroed == [2, 3, 6, 7]
