"""`hostmem_worker.py` as a process of its own, driven over its stdin."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).parents[2]
WORKER = ROOT / "tests" / "workloads" / "hostmem_worker.py"


class Worker:
    """One hostmem_worker process: its ready line, and its stdin commands."""

    def __init__(self, process: asyncio.subprocess.Process, log: Path) -> None:
        self.process, self.log = process, log
        self.info: dict[str, Any] = {}

    async def _line(self, timeout: float) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = await asyncio.wait_for(self.process.stdout.readline(), timeout)
        assert line, f"the worker ended:\n{self.log.read_text()}"
        answer: dict[str, Any] = json.loads(line)
        return answer

    async def ready(self, timeout: float = 60.0) -> dict[str, Any]:
        self.info = await self._line(timeout)
        assert self.info.get("ready"), self.info
        return self.info

    async def ask(self, command: str, timeout: float = 30.0) -> dict[str, Any]:
        assert self.process.stdin is not None
        self.process.stdin.write(f"{command}\n".encode())
        await self.process.stdin.drain()
        return await self._line(timeout)

    async def rss(self) -> int:
        return int((await self.ask("rss"))["rss_bytes"])

    async def verify(self) -> dict[str, Any]:
        return await self.ask("verify", timeout=60)

    async def quit(self) -> None:
        if self.process.returncode is None:
            assert (await self.ask("quit"))["bye"]
            await asyncio.wait_for(self.process.wait(), 10)


@asynccontextmanager
async def hostmem_worker(
    address: str,
    job: str,
    group: str,
    mib: int,
    seed: int,
    directory: Path,
    *options: str,
) -> AsyncIterator[Worker]:
    """Start a worker (`options`: more of its command-line options); wait until it is
    registered. It is told to quit (or killed) on exit."""
    store = directory / f"store-{job}"
    log = directory / f"worker-{job}.log"
    command = [str(WORKER), "--agent", address, "--job", job, "--group", group,
               "--mib", str(mib), "--seed", str(seed), "--store", str(store),
               *options]  # fmt: skip
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    with log.open("wb") as err:
        process = await asyncio.create_subprocess_exec(
            sys.executable, *command, stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=err, env=env,
        )  # fmt: skip
    worker = Worker(process, log)
    try:
        await worker.ready()
        yield worker
        await worker.quit()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
