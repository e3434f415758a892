"""The patch layer: records, composition (a patch wraps the one before), counting, and every target real."""

from __future__ import annotations

import functools
import re
import sys
import types

import pytest

from ablations.backends.vllm.__main__ import main
from ablations.backends.vllm.in_vllm import counters, patches
from ablations.backends.vllm.in_vllm.cpu import PATCHES as CPU_PATCHES
from ablations.backends.vllm.in_vllm.patches import Patch, after_init, install, replacement
from ablations.backends.vllm.in_vllm.plugin import SHUTDOWN_PATCHES
from ablations.backends.vllm.in_vllm.steps import STEP_PATCHES
from ablations.backends.vllm.in_vllm.toggles import SCHEDULER_PATCH, WORKER_PATCH

PATCHES = [*SHUTDOWN_PATCHES, *CPU_PATCHES, *STEP_PATCHES, SCHEDULER_PATCH, WORKER_PATCH]


@pytest.fixture
def toy(monkeypatch):
    """A module `k3_toy` with a function, a class with a classmethod and a constructor; a clean patch registry."""
    module = types.ModuleType("k3_toy")

    def f(x):
        return x + 1

    class Layer:
        def __init__(self, width):
            self.width = width

        @classmethod
        def kind(cls):
            return "stock"

    module.f, module.Layer = f, Layer
    monkeypatch.setitem(sys.modules, "k3_toy", module)
    monkeypatch.setattr(patches, "_installed", {})
    monkeypatch.setattr(patches, "_order", [])
    return module


def test_a_patch_names_its_target_and_reason(toy):
    with pytest.raises(ValueError, match=r"Patch\.target: invalid value 'k3_toy.f'"):
        Patch("k3_toy.f", replacement(None), "S0: why")
    with pytest.raises(ValueError, match=r"Patch\.why: empty for 'k3_toy:f'"):
        Patch("k3_toy:f", replacement(None), " ")
    with pytest.raises(AttributeError, match="has no attribute 'g'"):
        install(Patch("k3_toy:g", replacement(None), "S0: missing"))


def test_a_second_patch_wraps_the_first(toy):
    stock = toy.f
    fix = Patch("k3_toy:f", replacement(lambda x: x + 10), "S0: the fix")
    toggle = Patch("k3_toy:f", lambda old: lambda x: 2 * old(x), "toggle: doubles")
    install(fix)
    install(toggle)
    assert toy.f(1) == 22
    install(fix)                                            # already installed: nothing changes
    install(toggle)
    assert toy.f(1) == 22
    assert patches.original("k3_toy:f") is stock and patches.is_installed("k3_toy:f")
    assert patches.installed() == [fix, toggle]


def test_two_patches_of_one_target_differing_only_in_parameters_are_refused(toy):
    def scale(factor, old):
        return lambda x: factor * old(x)

    def scaled(factor):
        return lambda old: scale(factor, old)

    install(Patch("k3_toy:f", functools.partial(scale, 2), "toggle: scales"))
    install(Patch("k3_toy:f", functools.partial(scale, 2), "toggle: scales"))  # equal parameters: the same patch
    with pytest.raises(ValueError, match=r"patch k3_toy:f \(toggle: scales\): already installed with another wrap"):
        install(Patch("k3_toy:f", functools.partial(scale, 3), "toggle: scales"))
    install(Patch("k3_toy:f", scaled(5), "toggle: by 5"))
    install(Patch("k3_toy:f", scaled(5), "toggle: by 5"))   # the factory again, same parameter: the same patch
    with pytest.raises(ValueError, match="already installed with another wrap"):
        install(Patch("k3_toy:f", scaled(7), "toggle: by 5"))
    assert toy.f(1) == 5 * 2 * 2 and len(patches.installed()) == 2


def test_counted_classmethod_and_constructor_hook(toy, tmp_path, monkeypatch):
    before = counters._counts.get("toy_kind", 0)
    install(Patch("k3_toy:Layer.kind", replacement(classmethod(lambda cls: "ours")), "S0: kind", "toy_kind"))
    install(Patch("k3_toy:Layer.__init__", after_init(lambda self: setattr(self, "ready", self.width * 2)),
                  "S0: init"))
    assert toy.Layer.kind() == "ours" and toy.Layer(3).kind() == "ours"
    assert counters._counts["toy_kind"] == before + 2
    layer = toy.Layer(4)
    assert layer.width == 4 and layer.ready == 8
    assert patches.original("k3_toy:Layer.kind").__func__(toy.Layer) == "stock"


def test_every_cpu_patch_says_why():
    for patch in CPU_PATCHES:
        assert re.match(r"S\d+(, S\d+)*: ", patch.why) or patch.why.endswith("no fix"), patch
    assert len({(p.target, p.why) for p in CPU_PATCHES}) == len(CPU_PATCHES)


def test_every_patch_target_exists_in_the_installed_vllm(vllm):
    for patch in PATCHES:
        owner, attr = patches.resolve(patch.target)
        assert hasattr(owner, attr), patch.target


def test_patches_command_lists_every_target(capsys):
    assert main(["patches"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{len(PATCHES)} patches on cpu with toggles none: 2 on every platform, "
                          f"{len(CPU_PATCHES)} CPU fixes, 2 step records, the toggle hooks, 0 from the toggles")
    for patch in PATCHES:
        assert patch.target in out and patch.why in out
