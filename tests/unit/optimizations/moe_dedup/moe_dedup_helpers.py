"""Rank functions only the tests run (module level, so the spawned ranks import them by name), and the tolerance
against the float64 reference."""

from __future__ import annotations

import time

import torch

from opts.moe_dedup.bench.ranks import Comm

# fp32 ranks against the float64 reference: |diff| <= REF_RTOL * max |reference| (the output's scale, ~4 here;
# what fp32 leaves is ~1e-6 of it: GEMM sums of <= 256 terms and the collectives' sums in other orders).
REF_RTOL = 1e-4


def raise_on(comm: Comm, rank: int) -> int:
    """ValueError on rank `rank`, this rank's number elsewhere; no collective, so no rank waits on it."""
    if comm.rank == rank:
        raise ValueError(f"bad input on rank {rank}")
    return comm.rank


def fail_while_peer_waits(comm: Comm) -> None:
    """Rank 1 fails; rank 0 enters an all-reduce that can never finish."""
    if comm.rank == 1:
        raise ValueError("rank 1 gave up")
    comm.all_reduce(torch.ones(1))


def collectives(comm: Comm) -> dict[str, object]:
    """Each collective on rank-dependent data, reduce-scatter both native and as all-reduce + slice, the log."""
    x = torch.arange(12, dtype=torch.float32).view(6, 2) + 100 * comm.rank
    found = {"all_reduce": comm.all_reduce(x.clone()), "all_gather": comm.all_gather(x[:3] + 0)}
    found["reduce_scatter"] = comm.reduce_scatter(x.clone())
    comm.native_reduce_scatter = False
    found["reduce_scatter_fallback"] = comm.reduce_scatter(x.clone())
    comm.native_reduce_scatter = True
    found["log"] = list(comm.log)
    found["rank"], found["world_size"], found["device"] = comm.rank, comm.world_size, comm.device
    found["threads"] = torch.get_num_threads()
    return found


def hang(comm: Comm) -> None:
    """Every rank waits in an all-reduce rank 0 never joins: a hang no rank reports."""
    if comm.rank != 0:
        comm.all_reduce(torch.ones(1))
    else:
        time.sleep(10**6)


def assert_near_reference(actual: torch.Tensor, reference: torch.Tensor, what: str) -> None:
    """`actual` has no NaN and is within REF_RTOL x max|reference| of the float64 `reference`."""
    assert not torch.isnan(actual).any(), f"{what}: NaN in the result"
    atol = REF_RTOL * reference.abs().max().item()
    torch.testing.assert_close(actual.double(), reference, atol=atol, rtol=0, msg=lambda m: f"{what}: {m}")
