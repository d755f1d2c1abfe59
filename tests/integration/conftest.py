"""Fixtures of the integration tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from timeslice import Agent


@pytest.fixture
async def agent(tmp_path: Path) -> AsyncIterator[Agent]:
    async with Agent(node_name="n1", db=f"sqlite:///{tmp_path / 'agent.db'}",
                     backends=("noop", "app_channel")) as running:  # fmt: skip
        yield running
        running.table.validate()
