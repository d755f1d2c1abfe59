"""etcd and Redis servers for `anchors.py`: found on PATH or installed from
Debian's packages, started on loopback in a temporary directory, durable with
their defaults or the strictest setting, stopped and removed at the end.

  etcd   Debian's `etcd-server` (/usr/bin/etcd, 3.4): one member, its data and
         write-ahead log in the temporary directory; it fsyncs the log before
         it answers a write, as it does by default.
  Redis  Debian's `redis-server`: `appendonly yes` with `appendfsync always`
         (the append-only file is fsynced before a write is answered), no RDB
         snapshots.

A server's CPU is read from /proc/PID/stat (user + system time of all its
threads), in the shape `common.measure_rate` asks an orchestrator for.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.anchor_clients import EtcdLock, redis_connection
from benchmarks.common import Usage, channel, free_port, now, process_cpu

#: Each system: the program it runs and the Debian package that has it.
PROGRAMS = {"etcd": ("etcd", "etcd-server"), "redis": ("redis-server", "redis-server")}
POLICY_RC_D = Path("/usr/sbin/policy-rc.d")
APT_TIMEOUT = 300.0


@dataclass(frozen=True)
class Found:
    """Where each system's program is, or why it cannot be had."""

    paths: dict[str, str]
    missing: dict[str, str]  # system -> why


def find_programs(systems: list[str], install: bool) -> Found:
    """The programs of `systems` on PATH; with `install`, those missing are
    installed first from Debian's packages when that is possible (root, apt-get)."""
    paths = {s: path for s in systems if (path := shutil.which(PROGRAMS[s][0]))}
    absent = [s for s in systems if s not in paths]
    why = "not on PATH"
    if absent and install:
        why = apt_install([PROGRAMS[s][1] for s in absent])
        for system in absent:
            if path := shutil.which(PROGRAMS[system][0]):
                paths[system] = path
    return Found(paths, {s: why for s in systems if s not in paths})


def apt_install(packages: list[str]) -> str:
    """Install `packages` with apt-get, their services left stopped; why they are
    still missing, should they be."""
    apt = shutil.which("apt-get")
    if apt is None or os.geteuid() != 0:
        return "not on PATH, and apt-get cannot install it here (needs root and apt-get)"
    print(f"installing {' '.join(packages)} with apt-get ...", flush=True)
    command = [apt, "install", "-y", "--no-install-recommends", *packages]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    with services_not_started():
        done = _run(command, env)
        if done.returncode != 0:  # stale package lists, most often: refresh once
            _run([apt, "update"], env)
            done = _run(command, env)
    stop_services(packages)
    if done.returncode != 0:
        last = (done.stderr or done.stdout or "").strip().splitlines()[-1:] or ["no output"]
        return f"apt-get install failed ({done.returncode}): {last[0]}"
    return "apt-get installed the package, but its program is not on PATH"


def _run(command: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(command, env=env, capture_output=True, text=True,
                              timeout=APT_TIMEOUT, check=False)  # fmt: skip
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(command, 124, "", f"timed out after {APT_TIMEOUT:g} s")


@contextlib.contextmanager
def services_not_started() -> Any:
    """A policy-rc.d that forbids starting services (exit 101) while packages
    install, unless one is there already (a container's usually forbids them)."""
    if POLICY_RC_D.exists():
        yield
        return
    POLICY_RC_D.write_text("#!/bin/sh\nexit 101\n")
    POLICY_RC_D.chmod(0o755)
    try:
        yield
    finally:
        POLICY_RC_D.unlink(missing_ok=True)


def stop_services(packages: list[str]) -> None:
    """Where systemd runs, stop and disable the packages' services (its start is
    not always asked of policy-rc.d)."""
    systemctl = shutil.which("systemctl")
    if systemctl is None or not Path("/run/systemd/system").is_dir():
        return
    units = {"etcd-server": "etcd", "redis-server": "redis-server"}
    for package in packages:
        subprocess.run([systemctl, "disable", "--now", units.get(package, package)],
                       capture_output=True, timeout=60, check=False)  # fmt: skip


def version(path: str) -> str:
    """The program's name and version, from what `PATH --version` prints ("etcd
    Version: 3.4.23", "Redis server v=7.0.15 sha=..."): "etcd 3.4.23", "Redis 7.0.15"."""
    try:
        done = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return f"{Path(path).name} (version unknown)"
    return version_of(done.stdout)


def version_of(printed: str) -> str:
    words = printed.split()
    for i, word in enumerate(words):
        if word == "Version:" and i + 1 < len(words):
            return f"{words[0]} {words[i + 1]}"
        if word.startswith("v="):
            return f"{words[0]} {word[2:]}"
    return words[0] if words else "version unknown"


# --- running a server -----------------------------------------------------------------------


class External:
    """A server process this benchmark started: its address, and its CPU (`ask`
    answers "usage" as a `ServerProcess` does, so that `measure_rate` reads it)."""

    def __init__(self, process: subprocess.Popen[bytes], address: str, log: Path) -> None:
        self.process, self.address, self.log = process, address, log

    def cpu(self) -> float:
        """CPU seconds of every thread of the process so far."""
        return process_cpu(self.process.pid)

    async def ask(self, command: Any) -> Any:
        if command != "usage":
            raise ValueError(f"unknown command {command!r}")
        return Usage(time=now(), cpu=self.cpu(), gc=0.0, full_gcs=0, objects=-1)


@contextlib.asynccontextmanager
async def started(
    command: Callable[[Path], list[str]],
    address: str,
    ready: Callable[[str], Awaitable[None]],
    name: str,
) -> AsyncIterator[External]:
    """`command(DIR)` in a new temporary directory DIR, once `ready(address)`
    returns; stopped (SIGTERM, then SIGKILL) and DIR removed on leaving."""
    with tempfile.TemporaryDirectory(prefix=f"timeslice-bench-{name}-") as tmp:
        log = Path(tmp) / "server.log"
        with log.open("wb") as out:
            process = subprocess.Popen(command(Path(tmp)), stdout=out, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL)  # fmt: skip
        server = External(process, address, log)
        try:
            await _until_ready(server, ready, name)
            yield server
        finally:
            process.terminate()
            try:
                await asyncio.to_thread(process.wait, 15)
            except subprocess.TimeoutExpired:
                process.kill()
                await asyncio.to_thread(process.wait, 5)


async def _until_ready(
    server: External, ready: Callable[[str], Awaitable[None]], name: str
) -> None:
    deadline = now() + 30
    while True:
        if server.process.poll() is not None:
            tail = server.log.read_text(errors="replace").strip().splitlines()[-3:]
            raise RuntimeError(f"{name} exited ({server.process.returncode}): {' | '.join(tail)}")
        try:
            await asyncio.wait_for(ready(server.address), 2)
            return
        except Exception as error:  # not listening yet, or still starting: it answers an error
            if now() > deadline:
                raise RuntimeError(f"{name} did not answer in 30 s: {error!r}") from error
        await asyncio.sleep(0.1)


def etcd_command(program: str, client: int, peer: int) -> Callable[[Path], list[str]]:
    def command(tmp: Path) -> list[str]:
        peer_url, client_url = f"http://127.0.0.1:{peer}", f"http://127.0.0.1:{client}"
        return [program, "--name", "bench", "--data-dir", str(tmp / "data"),
                "--listen-client-urls", client_url, "--advertise-client-urls", client_url,
                "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
                "--initial-cluster", f"bench={peer_url}", "--initial-cluster-state", "new",
                "--logger", "zap", "--log-level", "warn"]  # fmt: skip

    return command


async def etcd_ready(address: str) -> None:
    async with channel(address) as ch:
        await EtcdLock(ch, "ready").contenders()


def etcd(program: str) -> contextlib.AbstractAsyncContextManager[External]:
    """One etcd member on loopback ports free a moment ago."""
    client, peer = free_port(), free_port()
    return started(etcd_command(program, client, peer), f"127.0.0.1:{client}", etcd_ready, "etcd")


def redis_command(program: str, port: int) -> Callable[[Path], list[str]]:
    def command(tmp: Path) -> list[str]:
        return [program, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(tmp),
                "--appendonly", "yes", "--appendfsync", "always", "--save", "",
                "--daemonize", "no", "--protected-mode", "no", "--loglevel", "warning"]  # fmt: skip

    return command


async def redis_ready(address: str) -> None:
    async with redis_connection(address) as client:
        await client.ping()


def redis(program: str) -> contextlib.AbstractAsyncContextManager[External]:
    """One Redis server on a loopback port free a moment ago, every write fsynced."""
    port = free_port()
    return started(redis_command(program, port), f"127.0.0.1:{port}", redis_ready, "redis")
