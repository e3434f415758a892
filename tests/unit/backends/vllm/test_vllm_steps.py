"""steps.py: the scheduler's step records, on a stand-in scheduler (the patch targets themselves are checked against
the installed vLLM in test_vllm_patches.py, the records of a real engine in tests/e2e/test_vllm_app.py)."""

from __future__ import annotations

from types import SimpleNamespace

from ablations.backends.vllm.in_vllm import steps
from ablations.backends.vllm.in_vllm.counters import COUNTER_DIR_ENV


def _scheduler(scheduled: dict[str, int], drafts: dict[str, list[int]]):
    """A scheduler whose schedule() advances each request's computed tokens by what it schedules, as vLLM's."""
    requests = {"a": SimpleNamespace(num_computed_tokens=0, num_prompt_tokens=100),
                "b": SimpleNamespace(num_computed_tokens=120, num_prompt_tokens=100)}

    def schedule(self):
        for req_id, n in scheduled.items():
            requests[req_id].num_computed_tokens += n
        return SimpleNamespace(num_scheduled_tokens=dict(scheduled), scheduled_spec_decode_tokens=drafts,
                               total_num_scheduled_tokens=sum(scheduled.values()))

    return SimpleNamespace(requests=requests), schedule, lambda self, output, model_output: ("outputs", output)


def test_a_step_is_recorded_from_its_schedule_to_its_update(tmp_path, monkeypatch):
    monkeypatch.setenv(COUNTER_DIR_ENV, str(tmp_path))
    scheduler, schedule, update = _scheduler({"a": 64, "b": 4}, {"b": [7, 8, 9]})
    output = steps._timed_schedule(schedule)(scheduler)
    assert steps._timed_update(update)(scheduler, output, None) == ("outputs", output)
    (record,) = steps.read_steps(tmp_path)
    assert record["start"] == 0.0 <= record["end"]
    assert record["requests"] == [[64, 0, 100, 0], [4, 120, 100, 3]]
    assert steps.step_seqs(record["requests"]) == [(64, 0, "prefill"), (4, 120, "verify")]
    assert steps.step_seqs([[1, 130, 100, 0]]) == [(1, 130, "decode")]


def test_nothing_is_recorded_without_a_counter_dir_or_tokens(tmp_path, monkeypatch):
    monkeypatch.delenv(COUNTER_DIR_ENV, raising=False)
    scheduler, schedule, update = _scheduler({"a": 8}, {})
    steps._timed_update(update)(scheduler, steps._timed_schedule(schedule)(scheduler), None)
    monkeypatch.setenv(COUNTER_DIR_ENV, str(tmp_path))
    scheduler, schedule, update = _scheduler({}, {})
    steps._timed_update(update)(scheduler, steps._timed_schedule(schedule)(scheduler), None)
    assert steps.read_steps(tmp_path) == [] and not steps._pending


def test_overlapping_steps_are_each_matched_to_their_own_update(tmp_path, monkeypatch):
    """Async scheduling schedules the next step before the previous one's output is processed."""
    monkeypatch.setenv(COUNTER_DIR_ENV, str(tmp_path))
    scheduler, schedule, update = _scheduler({"a": 10}, {})
    timed_schedule, timed_update = steps._timed_schedule(schedule), steps._timed_update(update)
    first = timed_schedule(scheduler)
    second = timed_schedule(scheduler)
    timed_update(scheduler, first, None)
    timed_update(scheduler, second, None)
    records = steps.read_steps(tmp_path)
    assert [r["requests"] for r in records] == [[[10, 0, 100, 0]], [[10, 10, 100, 0]]]
    assert records[0]["start"] <= records[1]["start"] <= records[0]["end"] <= records[1]["end"]
