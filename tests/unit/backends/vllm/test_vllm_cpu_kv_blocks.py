"""KV block handling (cpu/kv_blocks.py) against vLLM's `CPUModelRunner._zero_block_ids`
(v1/worker/cpu_model_runner.py:114-133), which zeroes `kv[manager_block_id]` (S10)."""

from __future__ import annotations

import types

import torch

from ablations.backends.vllm.in_vllm.cpu import kv_blocks


def test_supports_any_multiple_of_the_mla_kernel_block():
    assert kv_blocks.supports_block_size(None, 128) and kv_blocks.supports_block_size(None, 16)
    assert kv_blocks.supports_block_size(None, None)
    assert not kv_blocks.supports_block_size(None, 24) and not kv_blocks.supports_block_size(None, 0)


def runner(num_blocks, caches):
    """A runner with a full-attention group (two layers sharing one cache, plus `caches`) and a Mamba group."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec

    ns = types.SimpleNamespace
    full = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=8, dtype=torch.float32)
    mamba = MambaSpec(block_size=16, shapes=((2,),), dtypes=(torch.float32,))
    layers = {f"mla{i}": ns(kv_cache=kv) for i, kv in enumerate(caches)}
    layers["shared"] = layers["mla0"]
    layers["kda"] = ns(kv_cache=torch.ones(num_blocks, 2))
    return ns(
        kv_cache_config=ns(num_blocks=num_blocks, kv_cache_groups=[
            ns(kv_cache_spec=full, layer_names=[*[f"mla{i}" for i in range(len(caches))], "shared"]),
            ns(kv_cache_spec=mamba, layer_names=["kda"]),
        ]),
        compilation_config=ns(static_forward_context=layers),
    )


def test_zeroing_equals_vllms_where_manager_and_kernel_blocks_coincide(vllm):
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner

    ours = runner(4, [torch.randn(4, 16, 8), torch.randn(4, 16, 8)])
    theirs = runner(4, [ours.compilation_config.static_forward_context[f"mla{i}"].kv_cache.clone() for i in (0, 1)])
    kv_blocks.zero_block_ids(ours, [1, 3])
    CPUModelRunner._zero_block_ids(theirs, [1, 3])
    for name in ("mla0", "mla1", "kda"):
        got = ours.compilation_config.static_forward_context[name].kv_cache
        assert torch.equal(got, theirs.compilation_config.static_forward_context[name].kv_cache)
    assert bool((ours.compilation_config.static_forward_context["mla0"].kv_cache[[1, 3]] == 0).all())


def test_zeroing_covers_every_kernel_block_of_a_manager_block(vllm):
    """32-token manager blocks over 16-token kernel blocks: block b is kernel blocks 2b and 2b+1."""
    kv = torch.ones(4 * 2, 16, 8)
    kv_blocks.zero_block_ids(runner(4, [kv]), [1, 3])
    assert (kv.abs().sum((1, 2)) == 0).nonzero().flatten().tolist() == [2, 3, 6, 7]
