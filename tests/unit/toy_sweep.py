"""A small sweep as a multirun leaves it, for the notebook and inspection tests."""

from __future__ import annotations

import math
from pathlib import Path

from ablations.attribution.shapley import factorial
from ablations.cells import config_hash, write_result
from ablations.experiment import label
from ablations.metrics import RequestRecord, cell_metrics

PLAYERS = ("kda_overlap", "fusion")
SPEEDUP = {"kda_overlap": 1.10, "fusion": 1.25}


def write_sweep(root: Path, repeats: int = 2, skip: tuple[tuple[str, int], ...] = (), draws: int = 0) -> Path:
    """A factorial over two toggles as a multirun leaves it: one result.json per cell and repeat, metrics from
    the cells' own `cell_metrics` over per-request records of a toy service whose speed the toggles set. With
    `draws`, also each cell of repeat 0 under that many draws of an assumed figure `x` in [0, 1], which scales
    fusion's speed-up (`<cell>.r0.d<draw>/`, as experiment=draws leaves them)."""
    for coalition in factorial(PLAYERS):
        name = label(coalition, PLAYERS)
        for repeat, draw in [(r, -1) for r in range(repeats)] + [(0, d) for d in range(draws)]:
            if draw < 0 and (name, repeat) in skip:
                continue
            x = (draw + 0.5) / draws if draw >= 0 else 0.5
            gains = {**SPEEDUP, "fusion": 1 + (SPEEDUP["fusion"] - 1) * 2 * x}
            speed = math.prod(gains[p] for p in coalition) * (1.05 if len(coalition) == 2 else 1.0)
            speed *= 1 + 0.01 * repeat
            records = [RequestRecord(arrival_s=0.5 * i, first_token_s=0.5 * i + 0.2 / speed,
                                     finish_s=0.5 * i + (0.2 + 15 * 0.05) / speed, input_tokens=400, output_tokens=16,
                                     cached_tokens=(100 * i) % 400) for i in range(8)]
            config = {"ablation": {"design": "factorial", "repeats": repeats, "num_permutations": 6, "seed": 0,
                                   "cell": name, "repeat": repeat},
                      "opts": {p: {"mode": "on" if p in coalition else "off"} for p in PLAYERS}}
            if draws:
                config["ablation"].update(draws=draws, draw=draw, drawn={"x": x} if draw >= 0 else {})
            where = f"{name}.r{repeat}" + (f".d{draw}" if draws else "")
            write_result(root / where / "result.json", {
                "schema": 1, "status": "ok", "workload": "agentx_small", "model": "k3_tiny", "backend": "vllm",
                "toggles": {p: {"mode": "on" if p in coalition else "off"} for p in PLAYERS},
                "ablation": {"design": "factorial", "players": list(PLAYERS), "cell": name, "on": sorted(coalition),
                             "repeat": repeat, "metric": "total_throughput"},
                "config": config, "config_hash": config_hash(config), "setting_hash": "toy",
                "metrics": cell_metrics(records, 1)})
    return root
