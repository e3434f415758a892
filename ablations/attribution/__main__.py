"""`python -m ablations.attribution SWEEP_DIR [--metric NAME] [--json FILE] [--allow-missing]` (`sweep.main`)."""

import sys

from ablations.attribution.sweep import main

sys.exit(main())
