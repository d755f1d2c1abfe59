"""`timeslice serve orchestrator` in a process of its own, for the tests that kill
and restart it."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import grpclib.client
from grpclib.exceptions import GRPCError

from timeslice.api.gen.timeslice_orchestrator import v1alpha1 as pb

TIMESLICE = [sys.executable, "-m", "timeslice"]
CALL_TIMEOUT = 10.0
Stub = pb.TimeSliceOrchestratorServiceStub


@asynccontextmanager
async def connect(port: int) -> AsyncIterator[Stub]:
    channel = grpclib.client.Channel("127.0.0.1", port)
    try:
        yield pb.TimeSliceOrchestratorServiceStub(channel, timeout=CALL_TIMEOUT)
    finally:
        channel.close()


class Server:
    """One `timeslice serve orchestrator` process; its log goes to a file."""

    def __init__(
        self, port: int, db: str, log: Path, *options: str, env: dict[str, str] | None = None
    ) -> None:
        self.port, self.log = port, log
        command = [*TIMESLICE, "serve", "orchestrator", "--port", str(port), "--db", db, *options]
        with log.open("ab") as out:
            self.process = subprocess.Popen(
                command,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=log.parent,
                env={**os.environ, **(env or {})},
            )

    async def ready(self, timeout: float = 30.0) -> None:
        """Wait until it answers ListGroups."""
        deadline = time.monotonic() + timeout
        while True:
            assert self.process.poll() is None, f"the server exited:\n{self.log.read_text()}"
            async with connect(self.port) as stub:
                try:
                    await stub.list_groups(timeout=1)
                    return
                except (OSError, GRPCError, TimeoutError):
                    pass
            assert time.monotonic() < deadline, (
                f"the server never answered:\n{self.log.read_text()}"
            )
            await asyncio.sleep(0.1)

    def stop(self, sig: signal.Signals, timeout: float) -> int:
        self.process.send_signal(sig)
        return self.process.wait(timeout)
