"""`python -m benchmarks`: the benchmark suite (see suite.py)."""

import sys

from benchmarks.suite import main

sys.exit(main())
