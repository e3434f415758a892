"""The Hydra app's typed root schema, the ConfigStore registration of every group's schema, and the checks
and composition the app and the tests share."""

from __future__ import annotations

import importlib
import random
import types
import typing
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields, is_dataclass, make_dataclass
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from omegaconf import MISSING, DictConfig, ListConfig, OmegaConf

from ablations.attribution.draws import apply_draw, latin_hypercube
from ablations.backends.sim.config import SimBackendConfig
from ablations.backends.vllm.config import ModelConfig, VllmBackendConfig
from ablations.experiment import AblationConfig, cell_vector, design_cells, label
from ablations.hardware import HardwareConfig
from ablations.paths import PathsConfig
from ablations.workload.config import WorkloadConfig
from ablations.workload.config import register_configs as register_workload
from opts.base import ToggleConfig, check_known_fields
from opts.draft_length.acceptance import profile_alphas
from opts.registry import OPTIMIZATIONS, make_config

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"
ROOT_SCHEMA = "app_schema"
MODEL_SCHEMA = "model_schema"
BACKEND_SCHEMA = "backend_schema"
SIM_BACKEND_SCHEMA = "sim_backend_schema"
# Each backend option's schema (conf/backend/<option>.yaml merges onto it).
BACKEND_SCHEMAS = {"vllm": VllmBackendConfig, "sim": SimBackendConfig}
HARDWARE_SCHEMA = "hardware_schema"
PATHS_SCHEMA = "paths_schema"
OPTS_GROUP = "opts"
GROUPS = ("design", "experiment", "model", "workload", "backend", "hardware", "paths",
          *(f"{OPTS_GROUP}/{name}" for name in OPTIMIZATIONS))



def _as_list(hint: Any) -> Any:
    """tuple[X, ...] (nested too) as list[X], which OmegaConf types."""
    if typing.get_origin(hint) is not tuple:
        return hint
    return list[_as_list(typing.get_args(hint)[0])]


def _listed(value: Any) -> Any:
    return [_listed(v) for v in value] if isinstance(value, tuple | list) else value


def toggle_node(cls: type[ToggleConfig]) -> type:
    """A mutable mirror of the frozen ToggleConfig `cls` for Hydra to merge into (tuples become lists); the app
    turns each node back into `cls`, which validates it."""
    hints = typing.get_type_hints(cls)
    specs = []
    for f in fields(cls):
        hint, default = hints[f.name], f.default
        if typing.get_origin(hint) is tuple:
            specs.append((f.name, _as_list(hint), field(default_factory=lambda d=default: _listed(d))))
        else:
            specs.append((f.name, hint, field(default=default)))
    node = make_dataclass(f"{cls.__name__}Node", specs)
    node.__module__ = __name__
    node.__doc__ = f"Hydra node of {cls.__module__}.{cls.__name__}."
    return node


TOGGLE_NODES = {name: toggle_node(opt.config_cls) for name, opt in OPTIMIZATIONS.items()}
# The toggle vector node: one field per registered optimization.
OptsConfig = make_dataclass(
    "OptsConfig", [(name, node, field(default_factory=node)) for name, node in TOGGLE_NODES.items()])
OptsConfig.__doc__ = "The toggle vector: each optimization's config (conf/opts/<name>/<mode>.yaml)."
OptsConfig.__module__ = __name__


@dataclass
class AppConfig:
    """Root of `conf/config.yaml`. Each group's node is typed by its own schema; `backend` null runs the
    workload alone (its statistics), `backend=vllm` also starts an engine with the toggle vector `opts`,
    `backend=sim` simulates the node. `backend` is typed by its option's schema (`BACKEND_SCHEMAS`): OmegaConf
    has no union of structured configs."""

    workload: WorkloadConfig = MISSING
    model: ModelConfig = MISSING
    opts: OptsConfig = field(default_factory=OptsConfig)  # type: ignore[valid-type]
    backend: Any = None
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    paths: PathsConfig = field(default_factory=PathsConfig)
    ablation: AblationConfig = field(default_factory=AblationConfig)
    save_trace: bool = False
    result_file: str = "result.json"
    tags: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.result_file or Path(self.result_file).name != self.result_file:
            raise ValueError(f"AppConfig.result_file: {self.result_file!r} is not a plain file name")
        vector = self.toggles()
        if self.backend is not None:
            backend_module(self.backend).validate(self, vector)

    def toggles(self) -> dict[str, ToggleConfig]:
        """The toggle vector as validated configs, in registry order (a bad value names opts.<name>.<field>)."""
        vector = {}
        for name in OPTIMIZATIONS:
            try:
                vector[name] = make_config(name, **asdict(getattr(self.opts, name)))
            except ValueError as err:
                raise ValueError(f"opts.{name}: {err}") from None
        return vector


def backend_module(backend: Any) -> Any:
    """The module that checks a config for `backend`'s backend and lists the toggles it can switch, named by its
    schema's `VALIDATOR` (`ablations/backends/<name>/checks.py`): the app's config imports schemas only."""
    return importlib.import_module(type(backend).VALIDATOR)


def wired_toggles(cfg: DictConfig) -> tuple[str, ...]:
    """The toggles a composed config's backend can switch: every toggle without a backend (the workload alone);
    else what the backend's `wired` says (the simulator: those whose on and off modes it both models; vLLM: those
    whose on and off vectors both make a valid engine, differ there, and act in it)."""
    backend = cfg.get("backend")
    if backend is None:
        return tuple(OPTIMIZATIONS)
    backend_cfg = OmegaConf.to_object(backend)
    return backend_module(backend_cfg).wired(
        OmegaConf.to_object(cfg.hardware).platform, cfg.get("ablation") or {}, backend=backend_cfg,
        model=OmegaConf.to_object(cfg.model), opts=OmegaConf.to_container(cfg.opts, resolve=True))


def players_of(cfg: DictConfig) -> tuple[str, ...]:
    """The toggles a composed config's experiment ablates: `ablation.toggles`, or every wired toggle."""
    toggles = list(cfg.ablation.toggles)
    return tuple(toggles) if toggles else wired_toggles(cfg)


def _cells(*, _root_: DictConfig) -> str:
    """`${k3_cells:}`: the experiment's cells as Hydra's sweep list ("fusion,all_off,..."), in an order shuffled
    with `ablation.seed`, so that a drift of the machine over the sweep (warm-up, other load) does not line up
    with how many toggles a cell has."""
    ablation = _root_.ablation
    players = players_of(_root_)
    cells = design_cells(ablation.design, players, num_permutations=ablation.num_permutations, seed=ablation.seed)
    random.Random(ablation.seed).shuffle(cells)
    return ",".join(label(c, players) for c in cells)


def apply_draw_to(cfg: DictConfig) -> DictConfig:
    """The config with the figures of draw `ablation.draw` (of `ablation.draws`, a Latin hypercube over
    `hardware.ranges` and `ablation.ranges` with `ablation.draw_seed`) set, and recorded in `ablation.drawn`;
    unchanged at draw -1."""
    ablation = OmegaConf.to_object(cfg.ablation)
    if ablation.draw < 0:
        return cfg
    hw = OmegaConf.to_object(cfg.hardware)
    clash = sorted(set(hw.ranges) & set(ablation.ranges))
    if clash:
        raise ValueError(f"ablation.ranges.{clash[0]}: also a hardware range; one range per figure")
    draw = latin_hypercube({**hw.ranges, **ablation.ranges}, ablation.draws, ablation.draw_seed)[ablation.draw]
    drawn = apply_draw(hw, {k: v for k, v in draw.items() if k in hw.ranges})
    values = {}
    for key in sorted(hw.ranges):
        value = drawn.value(key)
        values[key] = value
        if key.startswith("efficiency."):
            cfg.hardware.efficiency[key.removeprefix("efficiency.")] = value
        else:
            cfg.hardware[key] = value
    for key in sorted(ablation.ranges):
        _set_drawn(cfg, key, draw[key])
        values[key] = draw[key]
    cfg.ablation.drawn = values
    return cfg


def _set_drawn(cfg: DictConfig, key: str, value: float) -> None:
    """Set the config figure at `key` (a list entry by its index; draft_length's empty `alphas`, its profile's
    rates, filled first); a path the config does not have is a ValueError naming it."""
    parent, _, last = key.rpartition(".")
    if parent == "opts.draft_length.alphas" and not OmegaConf.select(cfg, parent):
        dl = cfg.opts.draft_length
        OmegaConf.update(cfg, parent, list(profile_alphas(dl.profile, dl.max_k)), merge=False)
    node = OmegaConf.select(cfg, parent) if parent else None
    if last.isdigit() and isinstance(node, ListConfig):
        if int(last) >= len(node):
            raise ValueError(f"ablation.ranges.{key}: {parent} has {len(node)} entries")
        node[int(last)] = value
        return
    if not isinstance(node, DictConfig) or last not in node:
        raise ValueError(f"ablation.ranges.{key}: no such figure in the config")
    node[last] = round(value) if isinstance(node[last], int) and not isinstance(node[last], bool) else value


def apply_cell(cfg: DictConfig) -> DictConfig:
    """The config with each player's mode set by `ablation.cell` (unchanged without a cell) and the hardware of
    its draw (`apply_draw_to`)."""
    if not cfg.ablation.cell:
        return cfg
    apply_draw_to(cfg)
    ablation = OmegaConf.to_object(cfg.ablation)
    players = players_of(cfg)
    opts = cell_vector(ablation, players, OmegaConf.to_container(cfg.opts, resolve=True))
    for name in players:
        cfg.opts[name].mode = opts[name]["mode"]
    return cfg


def register_configs() -> None:
    """Register the root schema and every group schema as top-level configs (never group options), and the
    `k3_cells` resolver; idempotent."""
    OmegaConf.register_new_resolver("k3_cells", _cells, replace=True)
    cs = ConfigStore.instance()
    cs.store(name=ROOT_SCHEMA, node=AppConfig)
    cs.store(name=MODEL_SCHEMA, node=ModelConfig)
    cs.store(name=BACKEND_SCHEMA, node=VllmBackendConfig)
    cs.store(name=SIM_BACKEND_SCHEMA, node=SimBackendConfig)
    cs.store(name=HARDWARE_SCHEMA, node=HardwareConfig)
    cs.store(name=PATHS_SCHEMA, node=PathsConfig)
    register_workload(cs)


def group_options(group: str) -> list[str]:
    """The options of a config group: its yaml files in conf/<group>/."""
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def _values(override: Override) -> list[str]:
    if override.is_sweep_override():
        return list(override.sweep_string_iterator())
    value = override.value()
    if isinstance(value, list):         # several options of one group: experiment=[main,draws]
        return [str(v) for v in value]
    return [] if value is None else [str(value)]


def _dataclass_of(hint: Any) -> Any:
    """`hint` itself, or the dataclass inside `X | None`."""
    if typing.get_origin(hint) in (types.UnionType, typing.Union):
        inner = [a for a in typing.get_args(hint) if is_dataclass(a)]
        return inner[0] if len(inner) == 1 else hint
    return hint


def _check_field(key: str) -> None:
    node: Any = AppConfig
    names = key.split(".")
    for depth, name in enumerate(names):
        node = _dataclass_of(node)
        if not is_dataclass(node):
            return
        if name not in {f.name for f in fields(node)}:
            if depth == 0:
                raise ValueError(f"{key}: unknown group or field {name!r}; groups: {', '.join(GROUPS)}; "
                                 f"fields: {', '.join(sorted(f.name for f in fields(AppConfig)))}")
            check_known_fields(node, [name], ".".join(names[:depth]))
        node = typing.get_type_hints(node)[name]


def _experiment_backends(name: str) -> list[str]:
    """The backends experiment `name` selects (`override /backend: X` in its defaults, or in the experiments it
    includes)."""
    path = CONF_DIR / "experiment" / f"{name}.yaml"
    if not path.is_file():
        return []
    out = []
    for entry in OmegaConf.load(path).get("defaults") or []:
        if isinstance(entry, str):
            out += _experiment_backends(entry)
        elif isinstance(entry, DictConfig) and "override /backend" in entry:
            out.append(str(entry["override /backend"]))
    return out


def check_overrides(overrides: Sequence[str]) -> None:
    """Raise ValueError, naming the valid choices, for an override whose group, option or field is unknown.
    `hydra...` keys and unparsable overrides are left to Hydra."""
    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except Exception:
        return
    chosen = {o.key_or_group: o for o in parsed if o.key_or_group in GROUPS}
    experiments = _values(chosen["experiment"]) if "experiment" in chosen else []
    backends = (_values(chosen["backend"]) if "backend" in chosen
                else [b for name in experiments for b in _experiment_backends(name)])
    for override in parsed:
        key = override.key_or_group
        if key.startswith("backend.") and not backends:
            raise ValueError(f"{key}: no backend is selected (the default is null); valid: add "
                             f"backend={' or backend='.join(group_options('backend'))}")
        if key.split(".")[0].split("/")[0] == "hydra" or override.package is not None or override.is_delete():
            continue
        if "/" in key and key not in GROUPS:
            raise ValueError(f"{key}: unknown group; groups: {', '.join(GROUPS)}")
        if key.startswith("backend."):
            for value in backends if all(v in BACKEND_SCHEMAS for v in backends) else ():
                check_known_fields(BACKEND_SCHEMAS[value], [key.split(".")[1]], "backend")
            continue
        if key in GROUPS:
            valid = group_options(key)
            for value in _values(override):
                if value not in valid:
                    raise ValueError(f"{key}: unknown option {value!r}; valid options: {', '.join(valid)}")
        else:
            _check_field(key)


def to_app(cfg: DictConfig) -> AppConfig:
    """The validated AppConfig of a composed config (each dataclass checks its own fields)."""
    app = OmegaConf.to_object(cfg)
    if not isinstance(app, AppConfig):
        raise TypeError(f"expected an AppConfig, got {type(app).__name__}")
    return app


def compose_config(overrides: Sequence[str] = ()) -> DictConfig:
    """The config `python -m ablations <overrides>` composes, unvalidated (its overrides checked)."""
    check_overrides(overrides)
    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def compose_app(overrides: Sequence[str] = ()) -> AppConfig:
    """The AppConfig `python -m ablations <overrides>` runs with (for tests and notebooks)."""
    return to_app(compose_config(overrides))
