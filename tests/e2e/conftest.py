"""Fixtures of the end-to-end tests."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest
from orchestrator_process import Server


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[..., Awaitable[Server]]]:
    """Start servers; each is killed at the end of the test if still running."""
    started: list[Server] = []

    async def start(port: int, db: str, *options: str, env: dict[str, str] | None = None) -> Server:
        server = Server(port, db, tmp_path / "server.log", *options, env=env)
        started.append(server)
        await server.ready()
        return server

    yield start
    for server in started:
        if server.process.poll() is None:
            server.process.kill()
        server.process.wait(10)
