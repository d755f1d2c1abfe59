"""Waiting in tests for something to happen, rather than sleeping a fixed time and
hoping it has happened by then: a fixed sleep is slow when the machine is idle and
too short when it is loaded."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


async def until(
    predicate: Callable[[], object],
    what: str = "the condition",
    *,
    timeout: float = 5.0,
    interval: float = 0.01,
) -> None:
    """Return as soon as `predicate()` is true, checking every `interval` seconds;
    fail (AssertionError naming `what`) once `timeout` seconds have passed."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        await asyncio.sleep(interval)
