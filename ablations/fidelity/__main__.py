"""`python -m ablations.fidelity` (`check.main`)."""

import sys

from ablations.fidelity.check import main

sys.exit(main())
