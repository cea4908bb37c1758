"""``python -m relay`` is ``xds-relay``."""

import sys

from relay.cli import main

sys.exit(main())
