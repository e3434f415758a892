"""One bench case on the ranks (`time_case`, run by every rank of a `dist.RankPool`) and its summary (`summarize`,
in the parent): the modes checked against off, then timed interleaved; a step's time is its slowest rank's."""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from opts.moe_dedup.bench.ranks import Comm
from opts.moe_dedup.cases import CHECK_RTOL, DistCase
from opts.moe_dedup.config import MoeDedupConfig
from opts.moe_dedup.counts import mode_counts
from opts.moe_dedup.layer import latent_norm, moe_layer, random_tokens, rank_weights
from opts.moe_dedup.naive import tail_off
from opts.moe_dedup.sequence import own_tokens, tail_sp, token_chunk
from opts.moe_dedup.shape import MoeShape
from opts.moe_dedup.sharded import tail_on
from opts.moe_dedup.weights import MoeWeights, random_weights

Inputs = tuple[torch.Tensor, ...]
_SHARDS: dict[tuple[Any, ...], dict[str, MoeWeights]] = {}


def _layer_shards(case: DistCase, comm: Comm) -> dict[str, MoeWeights]:
    """This rank's weights per mode, from the whole layer's drawn once; kept for the next case of the same shape
    and seed (one set at a time; the whole layer's are dropped once split)."""
    key = (case.shape, case.seed, case.modes, comm.rank, comm.world_size, comm.device)
    if key not in _SHARDS:
        _SHARDS.clear()
        weights = random_weights(case.shape, case.seed)
        split = {kind: rank_weights(weights, case.shape, MoeDedupConfig(mode=kind), comm.rank, comm.world_size)
                 .to(comm.device) for kind in {"sp" if m == "sp" else "off" for m in case.modes}}
        _SHARDS[key] = {m: split["sp" if m == "sp" else "off"] for m in case.modes}
        del weights, split
    return _SHARDS[key]


def tail_partials(shape: MoeShape, num_tokens: int, world_size: int, seed: int
                  ) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
    """The tail's inputs drawn from `seed`: up-projection [H, L], latent norm weight [L], and every rank's
    partials: fused [T, L] and shared [T, H] per rank."""
    gen = torch.Generator().manual_seed(seed)
    up = torch.randn(shape.hidden, shape.latent, generator=gen).div_(shape.latent ** 0.5)
    norm_weight = 1 + 0.1 * torch.randn(shape.latent, generator=gen)
    fused = [torch.randn(num_tokens, shape.latent, generator=gen) for _ in range(world_size)]
    shared = [torch.randn(num_tokens, shape.hidden, generator=gen) for _ in range(world_size)]
    return up, norm_weight, fused, shared


def _tail_paths(shape: MoeShape, num_tokens: int, seed: int, comm: Comm
                ) -> dict[str, tuple[Inputs, Callable[..., torch.Tensor]]]:
    """Each mode's tail inputs on this rank and its call: off and on take this rank's partials; sp this rank's
    fused partial (its experts' output for every rank's tokens, zero-padded) and the summed shared output of its
    own tokens (sp's shared MLP is whole)."""
    t, w, r, dev = num_tokens, comm.world_size, comm.rank, comm.device
    up, norm_weight, fused, shared = tail_partials(shape, t, w, seed)
    up, norm = up.to(dev), latent_norm(norm_weight.to(dev), shape.norm_eps)
    padded = torch.cat([fused[r], fused[r].new_zeros(token_chunk(t, w) * w - t, shape.latent)])
    shared_sum = own_tokens(torch.stack(shared).sum(0), r, w)

    def off(f: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return tail_off(f, s, norm=norm, up_weight=up, all_reduce=comm.all_reduce)

    def on(f: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return tail_on(f, s, norm=norm, up_weight=up, all_reduce=comm.all_reduce, rank=r, world_size=w)

    def sp(f: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return tail_sp(f, s, norm=norm, up_weight=up, reduce_scatter=comm.reduce_scatter,
                       all_gather=comm.all_gather, num_tokens=t)

    mine = (fused[r].to(dev), shared[r].to(dev))
    return {"off": (mine, off), "on": (mine, on), "sp": ((padded.to(dev), shared_sum.to(dev)), sp)}


def tail_job(comm: Comm, shape: MoeShape, num_tokens: int, seed: int, modes: tuple[str, ...], poison: bool = False
             ) -> dict[str, tuple[torch.Tensor, list[tuple[str, int]]]]:
    """On every rank: each mode's tail output on the inputs `tail_partials` draws, and the collectives it ran
    (op, payload bytes); with `poison`, collectives' fresh buffers start as NaN."""
    comm.poison = poison
    paths = _tail_paths(shape, num_tokens, seed, comm)
    found = {}
    for mode in modes:
        inputs, call = paths[mode]
        start = len(comm.log)
        out = call(*_fresh(inputs)).cpu()
        found[mode] = (out, comm.log[start:])
    return found


def _layer_paths(case: DistCase, comm: Comm) -> dict[str, tuple[Inputs, Callable[..., torch.Tensor]]]:
    """Each mode's layer input (the same tokens on every rank) and its call with this rank's weights."""
    shards = _layer_shards(case, comm)
    x = random_tokens(case.shape, case.num_tokens, case.seed + 1).to(comm.device)
    paths = {}
    for mode in case.modes:
        config = MoeDedupConfig(mode=mode)
        paths[mode] = ((x,), lambda x, w=shards[mode], config=config: moe_layer(x, w, case.shape, config, comm))
    return paths


def _fresh(inputs: Inputs) -> Inputs:
    """Copies of the inputs: the tails reduce and accumulate into theirs in place."""
    return tuple(t.clone() for t in inputs)


def _check(case: DistCase, comm: Comm, first: dict[str, torch.Tensor]) -> tuple[dict[str, float], float]:
    """max |mode - off| over the ranks per mode, and max |off|; beyond CHECK_RTOL x max|off| a ValueError (on
    every rank alike: they all see the same maxima)."""
    off = first["off"]
    diffs = torch.tensor([(first[m] - off).abs().max().item() for m in case.modes[1:]] + [off.abs().max().item()],
                         dtype=torch.float64, device=comm.device)
    diffs = comm.all_gather(diffs.unsqueeze(0)).amax(0)
    max_diff = dict(zip(case.modes[1:], diffs[:-1].tolist(), strict=True))
    scale = diffs[-1].item()
    bad = {m: d for m, d in max_diff.items() if not d <= CHECK_RTOL * scale}
    if bad:
        raise ValueError(f"{case.name}: {', '.join(f'{m} differs from off by {d:.3g}' for m, d in bad.items())}; "
                         f"valid: <= {CHECK_RTOL} x max|off| ({scale:.3g})")
    return max_diff, scale


def time_case(comm: Comm, case: DistCase) -> dict[str, Any]:
    """On each rank: `case.rounds` interleaved rounds of the modes (off, on, sp, then sp, on, off, ...), each call
    on fresh copies of the same inputs, after a barrier. Round 0's outputs are checked against off (`_check`)
    before the next round. Returns this rank's seconds per call of each mode and the largest differences."""
    if case.scope == "tail":
        paths = _tail_paths(case.shape, case.num_tokens, case.seed, comm)
    else:
        paths = _layer_paths(case, comm)
    seconds: dict[str, list[float]] = {m: [] for m in case.modes}
    first: dict[str, torch.Tensor] = {}
    for i in range(case.rounds):
        for mode in case.modes if i % 2 == 0 else case.modes[::-1]:
            inputs, call = paths[mode]
            args = _fresh(inputs)
            comm.barrier()
            start = time.perf_counter()
            out = call(*args)
            comm.synchronize()
            seconds[mode].append(time.perf_counter() - start)
            if i == 0:
                first[mode] = out
            del args, out
        if i == 0:
            max_diff, scale = _check(case, comm, first)
            first.clear()
    return {"seconds": seconds, "max_abs_diff": max_diff, "out_scale": scale}


def summarize(case: DistCase, per_rank: list[dict[str, Any]]) -> dict[str, Any]:
    """The case's JSON row: per mode the step time of each round (its slowest rank), their median, the per-rank
    counts (`counts.mode_counts`, fp32); on/off and sp/off median time ratios (< 1: faster than off); the check."""
    elem_bytes = torch.finfo(torch.float32).bits // 8
    modes: dict[str, Any] = {}
    for mode in case.modes:
        steps = [max(rank["seconds"][mode][i] for rank in per_rank) for i in range(case.rounds)]
        counts = mode_counts(mode, tp=case.world_size, num_tokens=case.num_tokens, shape=case.shape,
                             scope=case.scope, elem_bytes=elem_bytes)
        modes[mode] = {"median_s": statistics.median(steps), "min_s": min(steps), "seconds": steps,
                       "counts": counts.to_dict()}
    off = modes["off"]["median_s"]
    return {"case": case.name, "scope": case.scope, "num_tokens": case.num_tokens, "world_size": case.world_size,
            "rounds": case.rounds, "shape": dataclasses.asdict(case.shape), "modes": modes,
            **{f"{m}_over_off": modes[m]["median_s"] / off for m in case.modes[1:]},
            "max_abs_diff": per_rank[0]["max_abs_diff"], "out_scale": per_rank[0]["out_scale"],
            "check_rtol": CHECK_RTOL}
