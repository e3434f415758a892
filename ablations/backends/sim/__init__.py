"""The `sim` backend (DESIGN.md): full-size Kimi K3 on a modelled node. Part 1 lands in slices; this one is the
per-step cost model (`cost.py`; its math in README.md)."""
