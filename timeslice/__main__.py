"""`python -m timeslice` runs the command line."""

from timeslice.cli import main

main()
