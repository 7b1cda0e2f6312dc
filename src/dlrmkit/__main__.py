"""`python -m dlrmkit` (and `torchrun -m dlrmkit`) enter the same CLI as the console script."""

from dlrmkit.cli import entry

entry()
