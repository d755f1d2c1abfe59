"""Importing timeslice, its integrations package or the veRL and Slime plugins loads
no torch and no transformers: a job that only takes turns pays nothing for them."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize(
    "module",
    [
        "timeslice",
        "timeslice.integrations",
        "timeslice.integrations.verl",
        "timeslice.integrations.slime",
    ],
)
def test_importing_loads_no_framework(module: str) -> None:
    code = (
        f"import sys, {module}\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'accelerate') if m in sys.modules)\n"
        "print(','.join(heavy))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=50, check=True
    )
    assert done.stdout.strip() == "", f"importing {module} loaded {done.stdout.strip()}"
