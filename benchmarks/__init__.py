"""timeslice's benchmarks: `python -m benchmarks` runs them all (see suite.py);
each also runs on its own, `python benchmarks/NAME.py --json OUT`."""
