"""Backends that run a cell: `vllm` (the real serving path) and, later, `sim` (the modelled node)."""
