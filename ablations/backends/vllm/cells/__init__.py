"""One ablation cell on vLLM and its replays: in process (`cell.py`, `timed_replay.py`; `replay.py` one request at a
time), served (`serve_cell.py`, vLLM's `/metrics` read by `prometheus.py`), a GPU node's printed commands
(`commands.py`) and the node self-check (`node_check.py`)."""
