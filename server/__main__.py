"""`python -m conclave` runs the CLI."""

import sys

from conclave.cli import main

sys.exit(main())
