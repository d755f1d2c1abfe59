"""Fixtures that tests anywhere may share. Keep this small and cheap to import."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """A journal URL for an SQLite file of the test's own."""
    return f"sqlite:///{tmp_path / 'journal.db'}"


@pytest.fixture
def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for a server that cannot
    take port 0, such as one in another process)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
