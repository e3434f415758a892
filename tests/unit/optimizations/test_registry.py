"""The registry: name -> optimization, and validated configs; errors list the valid choices."""

from __future__ import annotations

import pytest

from opts import registry
from opts.aiter_mla import AiterMLAConfig
from opts.base import Optimization, ToggleConfig


def test_every_entry_is_a_complete_optimization() -> None:
    assert "aiter_mla" in registry.names()
    for name in registry.names():
        opt = registry.get(name)
        assert isinstance(opt, Optimization) and opt.name == name and opt.description
        assert issubclass(opt.config_cls, ToggleConfig)
        assert {"off", "on"} <= set(opt.config_cls.MODES)
        assert opt.config().mode == "off", "the default of every toggle is off"


def test_unknown_name_lists_the_valid_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown optimization 'aiter'; valid choices: .*aiter_mla"):
        registry.get("aiter")


def test_make_config() -> None:
    config = registry.make_config("aiter_mla", mode="on")
    assert isinstance(config, AiterMLAConfig) and config.is_on


def test_invalid_mode_lists_the_valid_ones() -> None:
    with pytest.raises(ValueError, match=r"AiterMLAConfig.mode: invalid value 'enabled'; valid choices: off, on"):
        registry.make_config("aiter_mla", mode="enabled")
    with pytest.raises(ValueError, match="unknown optimization 'nope'"):
        registry.make_config("nope", mode="on")
