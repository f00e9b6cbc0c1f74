"""`python -m conclave` runs the CLI."""

import sys

from conclave.cli.main import main

sys.exit(main())
