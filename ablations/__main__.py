"""`python -m ablations`: the Hydra app. At this stage a run builds its workload and reports its statistics."""

from __future__ import annotations

import json
import time
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from ablations.config import AppConfig, register_configs
from ablations.workload import format_stats, load_workload, trace_stats, write_trace

register_configs()


def run(app: AppConfig, out_dir: Path) -> dict:
    """Build the workload, write the run's result file into `out_dir`, return the result."""
    start = time.perf_counter()
    trace = load_workload(app.workload)
    stats = trace_stats(trace)
    result = {
        "workload": app.workload.name,
        "stats": stats,
        "seconds": time.perf_counter() - start,
        "tags": list(app.tags),
    }
    print(f"workload {app.workload.name}:")
    print(format_stats(stats))
    if app.save_trace:
        path = write_trace(trace, out_dir / "workload.jsonl")
        result["trace_file"] = str(path)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / app.result_file).write_text(json.dumps(result, indent=2, default=float) + "\n")
    print(f"result: {out_dir / app.result_file}")
    return result


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    app = OmegaConf.to_object(cfg)
    assert isinstance(app, AppConfig)
    run(app, Path(HydraConfig.get().runtime.output_dir))


if __name__ == "__main__":
    main()
