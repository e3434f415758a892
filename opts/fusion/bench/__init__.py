"""fusion's bench tooling beyond `cases.py`: the measured traffic of one call (`measured_traffic.py`)."""
