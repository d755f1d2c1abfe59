"""`timeslice serve ...` is safe by default: on a non-loopback host without TLS and
--auth it exits at once with one line, unless --insecure, which then says what it
leaves open; with both it serves, and the client commands call it with
--tls-ca and a token from --token or TIMESLICE_TOKEN."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from tests.certs import Certs
from timeslice.security.principals import token_sha256

pytestmark = pytest.mark.timeout(90)

TIMESLICE = [sys.executable, "-m", "timeslice"]
# The server's own line, not the --insecure warning (which says "serving on" too).
SERVING = re.compile(r"^timeslice (?:orchestrator|agent \S+) serving on (\S+):(\d+)")


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIMESLICE_")}
    return {**env, **extra}


@pytest.mark.parametrize("service", ["orchestrator", "agent"])
def test_a_non_loopback_host_without_tls_and_auth_exits_with_one_line(
    service: str, certs: Certs
) -> None:
    tls = ["--tls-cert", certs.server.cert, "--tls-key", certs.server.key]
    for extra in ([], tls):
        done = subprocess.run(
            [*TIMESLICE, "serve", service, "--host", "0.0.0.0", "--port", "0", "--db", "memory"]
            + extra,
            capture_output=True,
            text=True,
            timeout=60,
            env=clean_env(),
        )
        assert done.returncode != 0
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1, done.stderr
        assert lines[0].startswith(f"error: the {service} refuses to listen on 0.0.0.0 without")
        assert "--insecure" in lines[0]


@asynccontextmanager
async def serving(*args: str, env: dict[str, str]) -> AsyncIterator[tuple[int, list[str]]]:
    """`timeslice serve ARGS` until its "serving on" line: its port and the lines
    it wrote before it; stopped with SIGTERM at the end."""
    process = await asyncio.create_subprocess_exec(
        *TIMESLICE, "serve", *args, stderr=subprocess.PIPE, env=env
    )
    assert process.stderr is not None
    lines: list[str] = []
    try:
        async with asyncio.timeout(60):
            while not (match := SERVING.search(lines[-1] if lines else "")):
                line = await process.stderr.readline()
                assert line, f"it exited: {''.join(lines)}"
                lines.append(line.decode())
        yield int(match.group(2)), lines
    finally:
        if process.returncode is None:
            process.terminate()
        await asyncio.wait_for(process.wait(), 30)


async def test_insecure_serves_on_every_interface_and_says_what_it_leaves_open() -> None:
    args = ["orchestrator", "--host", "0.0.0.0", "--port", "0", "--db", "memory", "--insecure"]
    async with serving(*args, env=clean_env()) as (_, lines):
        warning = [line for line in lines if "(--insecure)" in line]
        assert len(warning) == 1, lines
        assert "without TLS and without authentication" in warning[0]
        assert "anyone who can reach it may" in warning[0]


async def client(*args: str, env: dict[str, str]) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        *TIMESLICE, *args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_tls_and_auth_serve_every_interface_and_client_commands_bring_credentials(
    certs: Certs, tmp_path: Path
) -> None:
    auth = tmp_path / "auth.toml"
    auth.write_text(
        "[[principal]]\n"
        'name = "ops"\n'
        f'token_sha256 = "{token_sha256("ops-token-1")}"\n'
        'role = "operator"\n'
    )
    args = ["orchestrator", "--host", "0.0.0.0", "--port", "0", "--db", "memory"]
    args += ["--tls-cert", certs.server.cert, "--tls-key", certs.server.key, "--auth", str(auth)]
    async with serving(*args, env=clean_env()) as (port, lines):
        assert not [line for line in lines if "--insecure" in line]
        target = ["--target", f"127.0.0.1:{port}"]
        # The credentials from the environment, as a program would take them.
        env = clean_env(TIMESLICE_TLS_CA=certs.ca, TIMESLICE_TOKEN="ops-token-1")
        code, out, err = await client("acquire", "g", "job-a", *target, env=env)
        assert code == 0, err
        assert out.startswith("job-a holds g")
        # The same from the options.
        options = ["--tls-ca", certs.ca, "--token", "ops-token-1"]
        code, out, err = await client("status", "g", *target, *options, env=clean_env())
        assert code == 0, err
        assert "holder=job-a" in out
        code, out, err = await client(
            "status", *target, "--tls-ca", certs.ca, "--token", "wrong", env=clean_env()
        )
        assert code == 1
        assert err.strip().splitlines() == [
            "error: the token is not known to this server (UNAUTHENTICATED)"
        ]
        # Another CA than the server's: the client does not trust it, and says so at once.
        other = ["--tls-ca", certs.other_ca, "--token", "ops-token-1"]
        code, out, err = await client("status", *target, *other, env=clean_env())
        assert code == 1 and len(err.strip().splitlines()) == 1, err
        assert "its certificate is not trusted" in err
