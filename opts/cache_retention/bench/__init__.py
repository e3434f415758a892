"""cache_retention's bench tooling beyond `cases.py`: the capacity sweep (`sweep.py`), its plot (`plot.py`) and
`python -m opts bench cache_retention` (`runner.py`)."""
