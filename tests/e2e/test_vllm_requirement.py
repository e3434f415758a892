"""A broken or missing vLLM fails the e2e tests; they skip only on request or off x86_64 (no engine started)."""

from __future__ import annotations

import pytest
import vllm_pool

BROKEN = "ImportError: libfoo.so: cannot open shared object file"


@pytest.fixture
def broken_vllm(monkeypatch):
    monkeypatch.delenv(vllm_pool.SKIP_ENV, raising=False)
    monkeypatch.setattr(vllm_pool, "vllm_import_error", lambda: BROKEN)
    monkeypatch.setattr(vllm_pool.platform, "machine", lambda: "x86_64")


def test_broken_install_fails_naming_the_error(broken_vllm):
    with pytest.raises(pytest.fail.Exception) as err:
        vllm_pool.require_vllm()
    assert BROKEN in str(err.value) and "K3_SKIP_E2E=1" in str(err.value)


def test_skip_on_request(broken_vllm, monkeypatch):
    monkeypatch.setenv(vllm_pool.SKIP_ENV, "1")
    with pytest.raises(pytest.skip.Exception, match="K3_SKIP_E2E=1"):
        vllm_pool.require_vllm()


def test_skip_off_x86_64_says_why(broken_vllm, monkeypatch):
    monkeypatch.setattr(vllm_pool.platform, "machine", lambda: "aarch64")
    with pytest.raises(pytest.skip.Exception) as err:
        vllm_pool.require_vllm()
    assert BROKEN in str(err.value) and "only on x86_64" in str(err.value) and "aarch64" in str(err.value)
