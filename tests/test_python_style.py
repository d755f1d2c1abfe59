"""The Python of this repository as `ruff` (the version the test extra pins) wants it:
its lint rules pass and every file is formatted, so that no file drifts from the
style the rest follow (`pyproject.toml`'s `[tool.ruff]`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# The one the test extra pins, installed beside this interpreter (another version may
# format otherwise).
RUFF = Path(sys.executable).parent / "ruff"


@pytest.mark.parametrize(
    "command",
    [["check", "--no-cache"], ["format", "--check", "--no-cache"]],
    ids=["lint", "format"],
)
def test_ruff_finds_nothing_to_change(command: list[str]) -> None:
    assert RUFF.exists(), f"no ruff beside {sys.executable}: pip install -e '.[test]' brings it"
    result = subprocess.run(
        [str(RUFF), *command, str(ROOT)], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert result.returncode == 0, (
        f"ruff {' '.join(command)} reports:\n{result.stdout[-3000:]}{result.stderr[-1000:]}\n"
        "fix with: .venv/bin/ruff check --fix . && .venv/bin/ruff format ."
    )
