"""The processes of one run: each a `timeslice serve ...` or a campaign job, its
output in a log file of its own, started again with the same command after a
kill. Every one is on 127.0.0.1."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Final

REPO: Final = Path(__file__).resolve().parents[2]
PYTHON: Final = sys.executable


class Process:
    """One process the campaign starts, kills and starts again.

    `expected_exit` is set before every signal that may end it, so that the
    campaign can tell a process that died on its own from one it killed.
    """

    def __init__(self, name: str, argv: list[str], log: Path, cwd: Path, code: Code) -> None:
        self.name, self.argv, self.log, self.cwd, self.code = name, argv, log, cwd, code
        self.popen: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.stopped = False  # SIGSTOPped and not continued yet
        self.expected_exit = False
        self.retired = False  # killed for good: not restarted, not expected to progress

    def start(self) -> None:
        assert not self.alive, f"{self.name} is running already"
        env = {**os.environ, "PYTHONPATH": str(self.code.path)}
        with self.log.open("ab") as out:
            out.write(f"--- start {self.starts + 1} at {time.time():.3f}\n".encode())
            out.flush()
            self.popen = subprocess.Popen(
                self.argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.cwd,
                env=env,
                # A group of its own: a Ctrl-C of the campaign reaches only the
                # campaign, which then ends every process itself.
                start_new_session=True,
            )
        self.starts += 1
        self.stopped = False
        self.expected_exit = False

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    @property
    def returncode(self) -> int | None:
        return None if self.popen is None else self.popen.poll()

    def signal(self, sig: signal.Signals) -> None:
        if sig in (signal.SIGKILL, signal.SIGTERM):
            self.expected_exit = True
        if self.alive:
            assert self.popen is not None
            self.popen.send_signal(sig)
        if sig == signal.SIGSTOP:
            self.stopped = True
        elif sig == signal.SIGCONT:
            self.stopped = False

    async def kill(self) -> None:
        """SIGKILL, and wait until it is gone."""
        if self.stopped:
            self.signal(signal.SIGCONT)
        self.signal(signal.SIGKILL)
        await self.wait(10.0)

    async def wait(self, timeout: float) -> int | None:
        """The exit status, or None if it still runs after `timeout` seconds."""
        if self.popen is None:
            return None
        try:
            return await asyncio.to_thread(self.popen.wait, timeout)
        except subprocess.TimeoutExpired:
            return None

    async def terminate(self, timeout: float) -> int | None:
        """SIGTERM; the exit status, or None if it did not exit in time (then killed)."""
        if not self.alive:
            return self.returncode
        if self.stopped:
            self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        code = await self.wait(timeout)
        if code is None:
            await self.kill()
        return code

    def tail(self, lines: int = 30) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


@dataclass(frozen=True)
class Code:
    """The code a campaign's processes run: the folder put first on their path, and
    the settings its `OrchestratorConfig` knows (a `--config` file names no other)."""

    path: Path
    orchestrator_settings: frozenset[str]


_PROBE: Final = """
import dataclasses, timeslice.cli, timeslice.agent.server, tests.faults.job
from timeslice.orchestrator.server import OrchestratorConfig
print(" ".join(f.name for f in dataclasses.fields(OrchestratorConfig)))
"""


@contextmanager
def code_snapshot(ref: str | None = None, tries: int = 5) -> Iterator[Code]:
    """A copy of the `timeslice` package and of `tests/faults` that every process of
    a campaign imports first, so that a process restarted late in a campaign runs
    the code its first start ran, whatever is edited in the checkout meanwhile.
    The package from the working tree, or from git commit `ref`. A copy that does not import
    (taken half way through an edit) is taken again a little later."""
    root = Path(tempfile.mkdtemp(prefix="timeslice-faults-code-"))
    try:
        for attempt in range(tries):
            for part in ("timeslice", "tests"):
                shutil.rmtree(root / part, ignore_errors=True)
            skip = shutil.ignore_patterns("__pycache__", "*.pyc")
            if ref is not None:
                archive = subprocess.run(
                    ["git", "archive", ref, "timeslice"], cwd=REPO, check=True, capture_output=True
                ).stdout
                subprocess.run(["tar", "-x", "-C", str(root)], input=archive, check=True)
            else:
                shutil.copytree(REPO / "timeslice", root / "timeslice", ignore=skip)
            # The campaign's own job always comes from the checkout.
            shutil.copytree(REPO / "tests" / "faults", root / "tests" / "faults", ignore=skip)
            probe = subprocess.run(
                [PYTHON, "-c", _PROBE],
                cwd=root, env={**os.environ, "PYTHONPATH": str(root)}, capture_output=True,
            )  # fmt: skip
            if probe.returncode == 0:
                break
            if ref is not None or attempt == tries - 1:
                raise RuntimeError(f"the code to test does not import:\n{probe.stderr.decode()}")
            time.sleep(5.0)
        yield Code(root, frozenset(probe.stdout.decode().split()))
    finally:
        shutil.rmtree(root, ignore_errors=True)


def timeslice(*args: str) -> list[str]:
    return [PYTHON, "-m", "timeslice", *args]


async def port_open(port: int, timeout: float) -> bool:
    """Whether something accepts connections on 127.0.0.1:`port` within `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 1.0)
        except (OSError, TimeoutError):
            await asyncio.sleep(0.05)
            continue
        writer.close()
        return True
    return False
