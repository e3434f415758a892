"""The one patch layer: every change the project makes to vLLM is a `Patch` of an attribute, set from our side.

A patch's `wrap` receives what its target holds when the patch is installed and returns the replacement,
so a later patch of the same target wraps the earlier one (a toggle can wrap a CPU fix). Nothing in the
installed vllm is edited; `original(target)` is what the target held before any patch. The record `Patch`
is data (`opts.vllm_setting`), so an optimization's `vllm.py` declares patches without importing this layer.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ablations.backends.vllm.in_vllm.counters import counted
from opts.vllm_setting import Patch

__all__ = ["Patch", "after_init", "install", "install_all", "installed", "is_installed", "original",
           "replacement", "resolve", "same_wrap", "stock"]


def replacement(new: Any) -> Callable[[Any], Any]:
    """A `wrap` that ignores what the target held and puts `new` there."""
    return lambda _old: new


def after_init(after: Callable[[Any], None]) -> Callable[[Any], Any]:
    """A `wrap` for a "module:Class.__init__" target: run `after(self)` at the end of the constructor."""

    def wrap(base_init: Callable[..., None]) -> Callable[..., None]:
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            base_init(self, *args, **kwargs)
            after(self)

        __init__.__wrapped__ = base_init  # type: ignore[attr-defined]
        return __init__

    return wrap


@dataclass(frozen=True)
class Installed:
    """A target's attribute before any patch (`old`) and the patches applied to it, in order."""

    old: Any
    patches: tuple[Patch, ...]


_installed: dict[str, Installed] = {}
_order: list[Patch] = []


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


def _current(owner: Any, attr: str) -> Any:
    """The attribute as stored: a class's own classmethod/staticmethod object, not the bound function."""
    return owner.__dict__[attr] if isinstance(owner, type) and attr in owner.__dict__ else getattr(owner, attr)


def _counted(value: Any, counter: str) -> Any:
    if isinstance(value, classmethod | staticmethod):
        return type(value)(counted(counter)(value.__func__))
    return counted(counter)(value)


def same_wrap(a: Any, b: Any) -> bool:
    """Whether two wraps do the same: the same object, partials of the same function with equal arguments, or
    closures of the same code over the same values (a factory called twice with equal parameters)."""
    if a is b:
        return True
    if isinstance(a, functools.partial) and isinstance(b, functools.partial):
        return same_wrap(a.func, b.func) and a.args == b.args and a.keywords == b.keywords
    code_a, code_b = getattr(a, "__code__", None), getattr(b, "__code__", None)
    if code_a is None or code_a is not code_b or a.__defaults__ != b.__defaults__:
        try:
            return bool(a == b)
        except Exception:   # values with no truth for == (tensors): only the same object is the same
            return False
    cells_a, cells_b = a.__closure__ or (), b.__closure__ or ()
    return all(x.cell_contents is y.cell_contents or same_wrap(x.cell_contents, y.cell_contents)
               for x, y in zip(cells_a, cells_b, strict=True))


def install(patch: Patch) -> None:
    """Apply `patch` on top of whatever its target holds now; installing the same patch again does nothing. A patch
    equal to an installed one (target, why, counter) whose wrap does something else is refused: two patches of one
    target must say why they differ."""
    done = _installed.get(patch.target)
    twin = next((p for p in done.patches if p == patch), None) if done is not None else None
    if twin is not None:
        if not same_wrap(twin.wrap, patch.wrap):
            raise ValueError(f"patch {patch.target} ({patch.why}): already installed with another wrap "
                             f"({twin.wrap!r}, now {patch.wrap!r}); patches of one target that differ in their "
                             "parameters must differ in `why`")
        return
    owner, attr = resolve(patch.target)
    current = _current(owner, attr)
    value = patch.wrap(current)
    if patch.counter is not None:
        value = _counted(value, patch.counter)
    setattr(owner, attr, value)
    old = current if done is None else done.old
    _installed[patch.target] = Installed(old, (*(done.patches if done else ()), patch))
    _order.append(patch)


def install_all(patches: Iterable[Patch]) -> None:
    """Install each patch, in order."""
    for patch in patches:
        install(patch)


def original(target: str) -> Any:
    """What `target` held before any patch (a class's classmethod/staticmethod object as stored)."""
    return _installed[target].old


def stock(target: str) -> Any:
    """What `target` holds in stock vLLM: its value before any patch of this process, installed or not."""
    if target in _installed:
        return _installed[target].old
    owner, attr = resolve(target)
    return _current(owner, attr)


def is_installed(target: str) -> bool:
    """Whether any patch of `target` is installed in this process."""
    return target in _installed


def installed() -> list[Patch]:
    """Every patch installed in this process, in installation order."""
    return list(_order)
