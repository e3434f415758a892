"""kda_overlap's bench tooling beyond `cases.py`: per-pair off/on ratios for noisy machines (`pairs.py`)."""
