"""What every optimization shares: a validated toggle config, a microbenchmark case, the record.

The contract of an optimization package `opts/<name>/` (checked by tests/unit/optimizations/test_contract.py):

- `config.py`: one frozen `ToggleConfig` subclass; MODES hold off and on; a bad mode fails in `__post_init__`.
- `naive.py`: off, the path stock vLLM runs on that platform without the optimization.
- mechanism module(s): on, the same function as off (bit-exact, or within the tolerance the package states).
- `reference.py`: the float64 reference off and on are tested against.
- `cases.py`: `bench_cases(quick, device)`, the microbenchmarks the registry lists: `BenchCase`s, timed by
  `opts.bench.run`; or, for a package whose cases are not timed (cache_retention: hit rates), its own case type
  (each with a `name`) run by the record's `run_bench(cases, quick=, out_dir=)`, which returns the JSON result.
- `vllm.py`: how the toggle reaches vLLM, as data: `vllm_setting(config, platform) -> VllmSetting` (engine
  arguments, environment, `additional_config` entries, patches each with target, wrapper and why) and
  `STOCK_MODES`, the mode that equals stock vLLM per platform (its setting is empty: no patch, no argument);
  a platform where no mode is stock is left out (fusion on CPU: stock runs the steps eagerly).
  A cell vLLM cannot run raises ValueError naming the valid modes there. It imports nothing from `ablations`
  and vLLM only inside its wrappers; `off` on vLLM runs `naive.py`'s functions, `on` the mechanism's.
- `in_vllm.py` (or the package `in_vllm/`), where `vllm.py` installs patches: the code vLLM's processes run, the
  wrappers `vllm.py` names (`vllm.py` itself builds no function).
- `bench/`: bench tooling beyond `cases.py` (runners, sweeps, plots, measured step times or traffic, real ranks),
  the record's `run_bench` included. No top-level `vllm_*.py`, `engine.py` or bench module, no `measure.py`.
- `sim.py`: how the toggle acts in the serving simulator, as data: `sim_setting(config, platform) -> SimSetting`
  (kernel classes, KDA packing, the prefix cache's free order and resume point, drafts per step; never a
  speed-up factor); off is the empty setting unless the toggle's off is itself a choice (draft_length's K); a
  mode the simulator does not model raises ValueError naming the modes it does. It imports nothing from
  `ablations`. Optionally `CALIBRATION`: {case-name prefix: {side: kernel class}}, the simulator's kernel class
  each side of the package's microbenchmarks runs as, which the calibration command fits efficiencies on.
- `README.md`: the mechanism, its math, what off and on run per platform, measured numbers and their machine.
- `__init__.py`: the public API (`__all__`) and the `OPTIMIZATION` record `opts.registry` lists.

A package imports no other optimization package: K3's sizes and shared math live in `opts.k3`. `opts` imports
nothing from `ablations` (the contract test checks every file): what a package needs from the layer above is
handed down, as cache_retention's sweep scenarios are through an entry-point group.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from opts.sim_setting import SimSetting
from opts.vllm_setting import VllmSetting


def check_known_fields(cls: type, names: Iterable[str], where: str | None = None) -> None:
    """Raise ValueError naming every one of `names` that is not a field of dataclass `cls`, and the valid ones."""
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(names) - known)
    if unknown:
        raise ValueError(f"{where or cls.__name__}: unknown field(s) {', '.join(unknown)}; "
                         f"valid fields: {', '.join(sorted(known))}")


@dataclass(frozen=True)
class ToggleConfig:
    """Base of each optimization's config. `mode` is "off" (the reference path), "on", or a named variant."""

    MODES: ClassVar[tuple[str, ...]] = ("off", "on")
    mode: str = "off"

    def __post_init__(self) -> None:
        if self.mode not in self.MODES:
            raise ValueError(
                f"{type(self).__name__}.mode: invalid value {self.mode!r}; valid choices: {', '.join(self.MODES)}"
            )

    @property
    def is_on(self) -> bool:
        return self.mode == "on"

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> ToggleConfig:
        """Build from a plain mapping (e.g. a Hydra node), naming any unknown field and the valid ones."""
        check_known_fields(cls, values)
        return cls(**values)


@dataclass(frozen=True)
class BenchPair:
    """Off and on callables over the same, already built inputs.

    Each returns its outputs (a tensor, a tuple/list of them, or an object whose tensor attributes are the
    outputs, e.g. a dataclass). Off and on never share a buffer either writes, so their first calls
    compute from identical inputs and states and can be compared.
    """

    off: Callable[[], Any]
    on: Callable[[], Any]


@dataclass(frozen=True)
class BenchCase:
    """One microbenchmark case. `setup` builds the inputs only when the case runs, so cases stay cheap to list.

    `bytes` and `flops` count the mechanism's main work per call, analytically from the shapes.
    `atol` / `rtol`: how close on's output must be to off's on the first call of a fresh pair (both sides
    start from the same inputs and states); the harness checks it before timing (`opts.bench.checked_pair`).
    """

    name: str
    setup: Callable[[], BenchPair]
    bytes: int
    flops: int
    info: dict[str, Any] = field(default_factory=dict)
    atol: float = field(default=-1.0, kw_only=True)
    rtol: float = field(default=-1.0, kw_only=True)

    def __post_init__(self) -> None:
        for name in ("atol", "rtol"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
                raise ValueError(f"BenchCase {self.name!r}: {name} {value!r} missing or invalid; "
                                 "every case states how close on must be to off (a float >= 0)")


@dataclass(frozen=True)
class Optimization:
    """One switchable optimization: its name, config type and microbenchmarks.

    `bench_cases(quick, device)` lists the cases; `quick` picks the small set used by `--quick`.
    `vllm_setting(config, platform)` is what a config changes in vLLM there (`vllm.py`); `stock_modes` maps each
    platform to the mode that is stock vLLM there; `sim_setting(config, platform)` what it changes in the serving
    simulator (`sim.py`). `run_bench(cases, *, quick, out_dir)`: set by a package whose
    cases are not timed `BenchCase`s; `python -m opts bench` calls it instead of `opts.bench.run` and writes
    the result it returns as the JSON; `out_dir` (None: the package's default) is where it writes files, for a
    package with `writes_files` (any other refuses `--out`). `removes_work`: the modes whose steps never do more
    than off's (fewer kernels, bytes or FLOPs, nothing added), so a cell with one of them on cannot be slower
    than without it: a negative marginal there is the frontier's artefact (`ablations.attribution.artefacts`).
    """

    name: str
    description: str
    config_cls: type[ToggleConfig]
    bench_cases: Callable[[bool, str], list[Any]]
    vllm_setting: Callable[[Any, str], VllmSetting]
    stock_modes: dict[str, str]
    sim_setting: Callable[[Any, str], SimSetting]
    run_bench: Callable[..., dict[str, Any]] | None = None
    writes_files: bool = False
    removes_work: tuple[str, ...] = ()

    def config(self, **values: Any) -> ToggleConfig:
        """A validated config of this optimization."""
        return self.config_cls.from_dict(values)

    def stock_config(self, platform: str) -> ToggleConfig:
        """The config that is stock vLLM on `platform`."""
        return self.config_cls(mode=self.stock_modes[platform])
