"""The installed vLLM for the tests that compare with its own code: skipped only where it is not installed."""

from __future__ import annotations

import contextlib

import pytest

from ablations.backends.vllm.launch.runtime import hide_media_wheels


@pytest.fixture(scope="session")
def vllm():
    """vLLM with its C++ ops loaded; an install that fails to import with anything but ImportError fails the test."""
    with contextlib.suppress(RuntimeError):  # already hidden, or a media wheel came first: then the import tells
        hide_media_wheels()
    module = pytest.importorskip("vllm")
    pytest.importorskip("vllm._custom_ops")
    return module
