"""Optional dependencies of some tests: skipped where they are not installed, but
not in CI, which installs the test extra (torch, transformers): there a missing
one fails the tests that need it."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest


def need(module: str) -> ModuleType:
    """`module`, imported; the calling test module is skipped if it is missing,
    unless `CI=true`, where the ImportError stands."""
    if os.environ.get("CI") == "true":
        return importlib.import_module(module)
    return pytest.importorskip(module)
