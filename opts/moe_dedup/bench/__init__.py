"""moe_dedup's bench tooling beyond `cases.py`: real ranks (`ranks.py`), one case timed on them (`rank_case.py`)
and `python -m opts bench moe_dedup` (`runner.py`)."""
