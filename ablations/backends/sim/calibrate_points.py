"""Hardware figures calibrated from published points (`python -m ablations.sim calibrate`).

A point in `deepseek_r1_points.yaml` with `calibrates: <figure>` is not held out: the figure, one value per
platform, is set so that the simulator meets that platform's calibration points (the mean of log(simulated /
published) over them is zero), and `validate` reports those points apart from the held-out ones. The fitted value
goes into every profile of the platform (`--write` rewrites its line in conf/hardware/<node>.yaml; the source
beside it names the points). A figure a calibration can set must move every point's throughput one way: more of
it, a slower step.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from ablations.backends.sim.validate import Point, simulate

# figure: (the lowest and highest value the search may take, the precision it stops at)
FIGURES = {"kernel_floor_us": (0.0, 30.0, 0.05)}


def hardware_dir() -> Path:
    """The hardware profiles (conf/hardware)."""
    from ablations.config import CONF_DIR

    return CONF_DIR / "hardware"


def platform_of(node: str, directory: Path | None = None) -> str:
    """The platform (cpu, rocm, cuda) of a hardware option."""
    path = (directory or hardware_dir()) / f"{node}.yaml"
    if not path.exists():
        raise ValueError(f"hardware {node!r}: no profile {path}")
    return str(yaml.safe_load(path.read_text())["platform"])


@dataclass(frozen=True)
class Calibration:
    """`figure` fitted to `value` on `platform` from `points` (ids), whose errors at that value are `errors`
    (simulated / published - 1); `nodes`, the profiles of the platform it goes into."""

    figure: str
    platform: str
    value: float
    points: tuple[str, ...]
    errors: tuple[float, ...]
    nodes: tuple[str, ...]


def groups(points: Sequence[Point]) -> dict[tuple[str, str], list[Point]]:
    """The calibration points by (figure, platform); a figure no calibration can set is a ValueError naming it."""
    out: dict[tuple[str, str], list[Point]] = {}
    for p in points:
        if not p.calibrates:
            continue
        if p.calibrates not in FIGURES:
            raise ValueError(f"point {p.id!r}: calibrates: {p.calibrates!r} is not a figure a calibration sets; "
                             f"valid: {', '.join(FIGURES)}")
        if p.metric == "ratio" or p.concurrency is None:
            raise ValueError(f"point {p.id!r}: calibrates: a calibration point is a throughput at a concurrency")
        out.setdefault((p.calibrates, platform_of(p.node)), []).append(p)
    return out


def errors_at(points: Sequence[Point], figure: str, value: float, **sim) -> list[float]:
    """Each point's error (simulated / published - 1) with `figure` at `value` on its node."""
    out = []
    for p in points:
        config = replace(p.config(), figures=((figure, float(value)),))
        out.append(simulate(config, p.concurrency, **sim)[p.metric] / p.value - 1.0)
    return out


def fit(points: Sequence[Point], figure: str, progress: Callable[[str], None] = lambda _: None,
        **sim) -> tuple[float, list[float]]:
    """The value of `figure` at which the mean log(simulated / published) over `points` is 0, found by bisection
    to the figure's precision, and the points' errors there; a value the search cannot reach (the simulator too
    slow at the lowest, too fast at the highest) is a ValueError saying which."""
    low, high, step = FIGURES[figure]

    def gap(value: float) -> float:
        errors = errors_at(points, figure, value, **sim)
        mean = sum(math.log1p(e) for e in errors) / len(errors)
        progress(f"calibrate: {figure} = {value:.3g}: mean log(sim / pub) {mean:+.3f} over "
                 f"{', '.join(p.id for p in points)}")
        return mean

    if (g := gap(low)) <= 0:
        raise ValueError(f"calibrate {figure}: at {low:g}, its lowest, the simulator is already slower than "
                         f"{', '.join(p.id for p in points)} (mean log ratio {g:+.3f})")
    if (g := gap(high)) > 0:
        raise ValueError(f"calibrate {figure}: at {high:g}, its highest, the simulator is still faster than "
                         f"{', '.join(p.id for p in points)} (mean log ratio {g:+.3f})")
    while high - low > step:
        mid = (low + high) / 2
        if gap(mid) > 0:
            low = mid
        else:
            high = mid
    value = round((low + high) / 2 / step) * step
    return round(value, 6), errors_at(points, figure, value, **sim)


def calibrate(points: Sequence[Point], directory: Path | None = None,
              progress: Callable[[str], None] = lambda _: None, **sim) -> list[Calibration]:
    """Every calibration the points mark, one per (figure, platform)."""
    directory = directory or hardware_dir()
    out = []
    for (figure, platform), group in sorted(groups(points).items()):
        value, errors = fit(group, figure, progress, **sim)
        nodes = tuple(sorted(p.stem for p in directory.glob("*.yaml") if platform_of(p.stem, directory) == platform))
        out.append(Calibration(figure, platform, value, tuple(p.id for p in group), tuple(errors), nodes))
    return out


def write(calibration: Calibration, directory: Path | None = None) -> list[Path]:
    """Rewrite the figure's line (`<figure>: <value>`) in each profile of the calibration's platform; a profile
    without that line is a ValueError naming it (its source must be written by hand beside the value)."""
    directory = directory or hardware_dir()
    line = re.compile(rf"^{re.escape(calibration.figure)}:[ \t]*[^\s#]*", re.M)
    written = []
    for node in calibration.nodes:
        path = directory / f"{node}.yaml"
        text = path.read_text()
        if not line.search(text):
            raise ValueError(f"{path}: no line {calibration.figure}: to write the calibrated {calibration.value:g} "
                             f"into; add it with its source")
        path.write_text(line.sub(f"{calibration.figure}: {calibration.value:g}", text, count=1))
        written.append(path)
    return written


def table(calibrations: Sequence[Calibration]) -> str:
    """The calibrations as Markdown."""
    lines = ["| figure | platform | value | from points | their errors | profiles |", "|---|---|---|---|---|---|"]
    for c in calibrations:
        lines.append(f"| {c.figure} | {c.platform} | {c.value:g} | {', '.join(c.points)} | "
                     f"{', '.join(f'{e:+.1%}' for e in c.errors)} | {', '.join(c.nodes)} |")
    return "\n".join(lines)
