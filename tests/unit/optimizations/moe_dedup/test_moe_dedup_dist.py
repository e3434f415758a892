"""The real ranks: collectives on gloo, a rank's error raised in the parent with its rank and traceback, a pool
that survives an error every rank reports and is closed when a rank is left stuck."""

from __future__ import annotations

import socket

import pytest
import torch
from moe_dedup_helpers import collectives, fail_while_peer_waits, hang, raise_on

from opts.moe_dedup.bench.ranks import RankError, RankPool, free_port, run_ranks


@pytest.mark.spawns
def test_collectives_on_two_ranks(pool: RankPool) -> None:
    found = pool.run(collectives)
    x = [torch.arange(12, dtype=torch.float32).view(6, 2) + 100 * r for r in range(2)]
    total = x[0] + x[1]
    for rank, got in enumerate(found):
        assert (got["rank"], got["world_size"], got["device"], got["threads"]) == (rank, 2, "cpu", 1)
        assert torch.equal(got["all_reduce"], total)
        assert torch.equal(got["all_gather"], torch.cat([x[0][:3], x[1][:3]]))
        assert torch.equal(got["reduce_scatter"], total[3 * rank:3 * rank + 3])
        assert torch.equal(got["reduce_scatter_fallback"], total[3 * rank:3 * rank + 3])
        assert got["log"] == [("all_reduce", 48), ("all_gather", 48), ("reduce_scatter", 48), ("reduce_scatter", 48)]


@pytest.mark.spawns
def test_a_rank_error_names_the_rank_and_keeps_the_pool(pool: RankPool) -> None:
    with pytest.raises(RankError, match=r"(?s)rank 1: raised\nTraceback.*in raise_on.*ValueError: bad input on rank 1"
                       ) as info:
        pool.run(raise_on, 1)
    assert info.value.rank == 1
    assert pool.run(raise_on, 5) == [0, 1]


@pytest.mark.spawns
def test_a_stuck_peer_closes_the_pool() -> None:
    with RankPool(2, backend="gloo") as ranks:
        with pytest.raises(RankError, match=r"(?s)rank 1: raised.*ValueError: rank 1 gave up"):
            ranks.run(fail_while_peer_waits)
        with pytest.raises(RuntimeError, match=r"RankPool: closed"):
            ranks.run(raise_on, 5)
    assert run_ranks(raise_on, 1, 5) == [0]


@pytest.mark.spawns
def test_a_call_no_rank_answers_ends_on_its_limit_and_leaves_no_rank_behind() -> None:
    with RankPool(2, backend="gloo") as ranks:
        processes = list(ranks._procs)
        with pytest.raises(RankError, match=r"rank 0: no answer within 2 s \(ranks \[0, 1\]\)"):
            ranks.run(hang, timeout_s=2)
        assert not any(p.is_alive() for p in processes)


def test_bad_arguments_and_free_port() -> None:
    with pytest.raises(ValueError, match=r"world_size: invalid value 0; valid: an integer >= 1"):
        RankPool(0)
    with pytest.raises(ValueError, match=r"num_threads: invalid value 0"):
        RankPool(2, num_threads=0)
    with pytest.raises(ValueError, match=r"backend: invalid value 'mpi'; valid: gloo, nccl"):
        RankPool(2, backend="mpi")
    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
