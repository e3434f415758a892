"""draft_length's bench tooling beyond `cases.py`: the tiny K3-like stack (`stack.py`), its measured step times
(`step_times.py`), the held-out evaluation (`evaluate.py`) and `python -m opts bench draft_length` (`runner.py`)."""
