"""Optional dependencies of some tests: skipped where they are not installed, but
not in CI, which installs the test extra (torch, transformers): there a missing
one fails the tests that need it."""

from __future__ import annotations

import importlib
import os
import shutil
from types import ModuleType

import pytest


def need(module: str) -> ModuleType:
    """`module`, imported; the calling test module is skipped if it is missing,
    unless `CI=true`, where the ImportError stands."""
    if os.environ.get("CI") == "true":
        return importlib.import_module(module)
    return pytest.importorskip(module)


def need_command(name: str) -> str:
    """The path of the command `name` (kubectl, say); the calling test is skipped if it
    is not installed, unless `CI=true`, where it fails: CI installs it."""
    path = shutil.which(name)
    if path is None:
        message = f"the {name} command is not installed"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return path


def need_root(reason: str) -> None:
    """Skip the calling test unless it runs as root (`reason`: what needs root),
    except under `CI=true`, where it fails: CI runs as root."""
    if os.geteuid() == 0:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"under CI=true this test must run: {reason}")
    pytest.skip(reason)


def need_postgres() -> str:
    """The URL of the PostgreSQL server the tests may use (TIMESLICE_TEST_POSTGRES_URL,
    which `.ci/run` sets); the calling test is skipped without one, unless
    `CI=true`, where it fails: CI starts one."""
    url = os.environ.get("TIMESLICE_TEST_POSTGRES_URL")
    if url:
        return url
    message = "TIMESLICE_TEST_POSTGRES_URL is not set (no PostgreSQL server)"
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)
