"""Replace attributes of installed vLLM modules and classes, from our side, and remember what was replaced."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ablations.backends.vllm.counters import counted


@dataclass(frozen=True)
class Replacement:
    """One attribute `target` = "module:attr" or "module:Class.attr" set to `new` (was `old`)."""

    target: str
    old: Any
    new: Any
    counter: str | None


_installed: dict[str, Replacement] = {}


def resolve(target: str) -> tuple[Any, str]:
    """The object holding `target`'s attribute, and the attribute name."""
    module_name, _, path = target.partition(":")
    if not path:
        raise ValueError(f"patch target {target!r}: expected 'module:attr' or 'module:Class.attr'")
    owner: Any = importlib.import_module(module_name)
    *parents, attr = path.split(".")
    for name in parents:
        owner = getattr(owner, name)
    if not hasattr(owner, attr):
        raise AttributeError(f"patch target {target!r}: {owner!r} has no attribute {attr!r} (vLLM changed?)")
    return owner, attr


def replace(target: str, new: Any, counter: str | None = None) -> None:
    """Set `target` to `new`; with `counter`, calls are counted under that name. Idempotent per target."""
    if target in _installed:
        return
    owner, attr = resolve(target)
    old = owner.__dict__[attr] if isinstance(owner, type) and attr in owner.__dict__ else getattr(owner, attr)
    value = new
    if counter is not None:
        if isinstance(new, (classmethod, staticmethod)):
            value = type(new)(counted(counter)(new.__func__))
        else:
            value = counted(counter)(new)
    setattr(owner, attr, value)
    _installed[target] = Replacement(target, old, value, counter)


def original(target: str) -> Any:
    """The attribute `target` held before `replace` (unwrapped classmethod/staticmethod as stored)."""
    return _installed[target].old




def wrap_init(cls_target: str, after: Callable[[Any], None]) -> None:
    """Run `after(self)` at the end of the constructor of the class at `cls_target` ("module:Class")."""
    owner, attr = resolve(cls_target)
    cls = getattr(owner, attr)
    base_init = cls.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        base_init(self, *args, **kwargs)
        after(self)

    __init__.__wrapped__ = base_init  # type: ignore[attr-defined]
    replace(f"{cls_target}.__init__", __init__)


def is_installed(target: str) -> bool:
    """Whether `target` has been replaced in this process."""
    return target in _installed
