"""The code that runs inside vLLM's processes: the plugin vLLM loads in every process (`plugin.py`), the one patch
layer (`patches.py`), the toggle vector read from `additional_config` (`toggles.py`), the replaced kernels' call
counts (`counters.py`), the scheduler's per-step records (`steps.py`) and the fixes that make stock vLLM-CPU run K3
(`cpu/`)."""
