"""cache_retention in vLLM, as data: the setting of each cell, and the session-aware free queue against vLLM's."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from opts.cache_retention import vllm as cache_vllm
from opts.cache_retention.config import CacheRetentionConfig
from opts.cache_retention.in_vllm import SessionFreeQueue
from opts.vllm_setting import PLATFORMS

ON = CacheRetentionConfig(mode="on", resume_from="prompt_tail", resume_unit=16)


@dataclass(eq=False)
class Block:
    block_id: int
    is_null: bool = False
    prev_free_block: object = None
    next_free_block: object = None


@pytest.mark.parametrize("platform", PLATFORMS)
def test_off_is_stock_and_evict_patches_the_scheduler_side_only(platform):
    assert cache_vllm.vllm_setting(CacheRetentionConfig(), platform).is_stock
    evict = cache_vllm.vllm_setting(CacheRetentionConfig(mode="evict", idle_s=7.0), platform)
    assert not evict.engine_args and not evict.env
    assert [p.target.split(":")[0] for p in evict.patches] == [
        "vllm.v1.core.block_pool"] * 3 + ["vllm.v1.core.kv_cache_manager"] + ["vllm.v1.core.sched.scheduler"] * 2
    assert sum(p.counter == cache_vllm.COUNTER for p in evict.patches) == 1


@pytest.mark.parametrize("platform", PLATFORMS)
def test_on_adds_vllm_partial_tail_hits_at_the_resume_unit(platform):
    setting = cache_vllm.vllm_setting(ON, platform)
    assert setting.engine_args == {"prefix_match_unit": 16}
    assert len(setting.patches) == len(cache_vllm.evict_patches(ON.idle_s))
    assert cache_vllm.vllm_setting(CacheRetentionConfig(mode="resume", resume_from="prompt_tail", resume_unit=16),
                                   platform).patches == ()


def test_resume_at_the_turn_end_is_not_wired_and_the_error_names_what_is():
    with pytest.raises(ValueError, match=r"cache_retention=on on cpu: resume_from='turn_end'.*valid there: off, "
                                         r"evict, on with resume_from='prompt_tail'"):
        cache_vllm.vllm_setting(CacheRetentionConfig(mode="on"), "cpu")


def test_a_resume_unit_vllm_cpu_cannot_page_is_refused_there_only():
    odd = CacheRetentionConfig(mode="resume", resume_from="prompt_tail", resume_unit=8)
    with pytest.raises(ValueError, match="resume_unit: invalid value 8 on cpu; valid: 16, 32, 64"):
        cache_vllm.vllm_setting(odd, "cpu")
    assert cache_vllm.vllm_setting(odd, "rocm").engine_args == {"prefix_match_unit": 8}


def test_without_sessions_the_session_queue_reuses_blocks_in_vllms_order():
    """The same random sequence of pops, removes, appends and prepends on vLLM's own FreeKVCacheBlockQueue and on
    SessionFreeQueue (no session holds anything): identical order after every step."""
    pytest.importorskip("vllm")
    from opts.vllm_import import hide_media_wheels

    hide_media_wheels()
    from vllm.v1.core.kv_cache_utils import FreeKVCacheBlockQueue

    rng = random.Random(0)
    theirs = [Block(i) for i in range(40)]
    ours = [Block(i) for i in range(40)]
    stock, session = FreeKVCacheBlockQueue(theirs), SessionFreeQueue(ours, idle_s=1.0)
    taken: list[int] = []
    for _ in range(400):
        op = rng.choice(["pop", "pop", "remove", "append", "prepend"])
        free = [b.block_id for b in stock.get_all_free_blocks()]
        if op == "pop" and free:
            assert stock.popleft().block_id == session.popleft().block_id
            taken.append(free[0])
        elif op == "remove" and free:
            victim = rng.choice(free)
            stock.remove(theirs[victim])
            session.remove(ours[victim])
            taken.append(victim)
        elif op in ("append", "prepend") and taken:
            back = [taken.pop(rng.randrange(len(taken))) for _ in range(min(len(taken), rng.randint(1, 3)))]
            if op == "append":
                stock.append_n([theirs[i] for i in back])
                session.append_n([ours[i] for i in back])
            else:
                stock.prepend_n([theirs[i] for i in back])
                session.prepend_n([ours[i] for i in back])
        assert [b.block_id for b in session.get_all_free_blocks()] == [b.block_id for b in stock.get_all_free_blocks()]
        assert session.num_free_blocks == stock.num_free_blocks


def test_a_live_sessions_blocks_outlast_an_idle_sessions():
    """a finished at 0 s, b at 0.5 s, idle after 1 s: at 1.2 s a's blocks go first though b's were freed
    earlier (LRU would reuse 2, 3, 0, 1)."""
    blocks = [Block(i) for i in range(6)]
    queue = SessionFreeQueue(blocks, idle_s=1.0)
    taken = queue.popleft_n(4)
    for session, block in zip(("a", "a", "b", "b"), taken, strict=True):
        queue.session = session
        queue.note_use([block])
    queue.policy.note_admit("a", 0.0, 0)
    queue.policy.note_admit("b", 0.0, 1)
    queue.policy.note_finish("a", 0.0, 0)
    queue.policy.note_finish("b", 0.5, 1)
    queue.append_n(taken[2:] + taken[:2])
    queue.policy.note_admit("c", 1.2, 2)
    assert [b.block_id for b in queue.popleft_n(2)] == [4, 5]
    assert [b.block_id for b in queue.popleft_n(4)] == [0, 1, 2, 3]
