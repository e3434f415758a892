"""Tolerant rebinding for vLLM's Triton-kernel override registry (vllm/triton_utils/dispatcher.py).

`_rebind_kernels` scans every module namespace and reads `vars(value).get("kernel")` of each
value. An in-process engine (VLLM_ENABLE_V1_MULTIPROCESSING=0) that imported llvmlite/numba has
objects whose `__dict__` is no dict (`'_lib_fn_wrapper' object has no attribute 'get'`,
dispatcher.py:139), so the CPU platform's override registration fails. This version skips such
objects and otherwise rebinds the same holders: module attributes that are an original kernel,
and objects whose instance dict holds one under "kernel".
"""

from __future__ import annotations

import sys
from typing import Any


def _instance_kernel(value: Any) -> Any:
    try:
        namespace = object.__getattribute__(value, "__dict__")
    except Exception:
        return None
    return namespace.get("kernel") if isinstance(namespace, dict) else None


def rebind_kernels(overrides: list[tuple[Any, Any]]) -> None:
    by_id = {id(old): (old, new) for old, new in overrides}

    def wrapper_for(value: Any) -> Any:
        hit = by_id.get(id(value))
        return hit[1] if hit is not None and hit[0] is value else None

    for module in list(sys.modules.values()):
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        for attr, value in list(namespace.items()):
            new = wrapper_for(value)
            if new is not None:
                setattr(module, attr, new)
                continue
            new = wrapper_for(_instance_kernel(value))
            if new is None:
                continue
            value.kernel = new
            if not isinstance(value, type):
                value.__dict__.pop("_kernel_arg_names", None)
