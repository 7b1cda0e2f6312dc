"""`python -m dlrmkit` (and `torchrun -m dlrmkit`) enter the same CLI as the console script."""

import sys

from dlrmkit.cli import main

sys.exit(main())
