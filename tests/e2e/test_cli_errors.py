"""What a person sees when a `timeslice` command fails: one line on stderr,
`error: ...`, that names the cause and what to do; exit status 1 when something
failed, 2 for a bad option; a traceback only with `--debug`."""

from __future__ import annotations

import os
import socket
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)

# Runs the command line in a process where `import asyncpg` fails, as it does
# where the postgres extra is not installed.
WITHOUT_ASYNCPG = (
    "import sys; sys.modules['asyncpg'] = None; from timeslice.cli import main; main()"
)

# Quiet servers: what they log at INFO would make the one line hard to check.
QUIET = ("--log-level", "WARNING")


def timeslice(cwd: Path, *args: str, without_asyncpg: bool = False) -> tuple[int, list[str]]:
    """Run `timeslice ARGS` to its end; its exit status and stderr's lines."""
    entry = ["-c", WITHOUT_ASYNCPG] if without_asyncpg else ["-m", "timeslice"]
    env = {k: v for k, v in os.environ.items() if k != "TIMESLICE_DEBUG"}
    done = subprocess.run(
        [sys.executable, *entry, *args],
        capture_output=True,
        text=True,
        timeout=45,
        cwd=cwd,
        env=env,
    )
    return done.returncode, done.stderr.splitlines()


def one_error(lines: list[str]) -> str:
    """The one line stderr holds, which must be an error."""
    assert len(lines) == 1, "\n".join(lines)
    assert lines[0].startswith("error: "), lines[0]
    return lines[0]


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port another server listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


# --- the servers --------------------------------------------------------------------


@pytest.mark.parametrize(
    "server", [["orchestrator"], ["agent", "--backend", "noop"]], ids=["orchestrator", "agent"]
)
def test_a_busy_port_is_named_with_what_to_do(
    tmp_path: Path, busy_port: int, server: list[str]
) -> None:
    code, lines = timeslice(
        tmp_path, "serve", *server, "--port", str(busy_port), "--db", "memory", *QUIET
    )
    assert code == 1
    assert one_error(lines) == (
        f"error: cannot listen on 127.0.0.1:{busy_port}: address already in use"
        " (another server runs there? pick another --port)"
    )


def test_debug_prints_the_traceback_above_the_line(tmp_path: Path, busy_port: int) -> None:
    code, lines = timeslice(
        tmp_path, "--debug", "serve", "orchestrator", "--port", str(busy_port), "--db", "memory",
        *QUIET,
    )  # fmt: skip
    assert code == 1
    assert lines[0] == "Traceback (most recent call last):"
    assert "OSError: [Errno 98] Address already in use" in lines
    assert lines[-1].startswith(f"error: cannot listen on 127.0.0.1:{busy_port}:")
    assert not any("Server is not started" in line for line in lines)


@pytest.mark.parametrize("server", ["orchestrator", "agent"])
def test_an_unknown_log_level_lists_the_levels(tmp_path: Path, server: str) -> None:
    code, lines = timeslice(tmp_path, "serve", server, "--db", "memory", "--log-level", "LOUD")
    assert code == 2
    line = one_error(lines)
    assert "'LOUD'" in line
    assert all(level in line for level in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"))


@pytest.mark.parametrize("server", ["orchestrator", "agent"])
def test_an_unknown_http2_server_lists_the_servers(tmp_path: Path, server: str) -> None:
    code, lines = timeslice(tmp_path, "serve", server, "--db", "memory", "--http2", "nghttp2")
    assert code == 2
    line = one_error(lines)
    assert "http2 must be one of h2core, grpclib, not 'nghttp2'" in line


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('hold_limit = "ten"', "hold_limit must be a number, not the string 'ten'"),
        ('port = "x"', "port must be an integer, not the string 'x'"),
        ("group_nodes = 3", "group_nodes must be a table of groups"),
        ("hold_limt = 5", "unknown key(s) hold_limt"),
        ("port = ", "is not valid TOML: Invalid value (at line 1, column 8)"),
    ],
    ids=["number", "integer", "table", "unknown", "syntax"],
)
def test_a_bad_config_file_names_the_file_and_the_key(
    tmp_path: Path, text: str, expected: str
) -> None:
    config = tmp_path / "orchestrator.toml"
    config.write_text(text + "\n")
    code, lines = timeslice(tmp_path, "serve", "orchestrator", "--config", str(config), *QUIET)
    assert code == 2
    line = one_error(lines)
    assert line.startswith(f"error: {config}")
    assert expected in line


def test_a_postgresql_journal_without_asyncpg_says_what_to_install(tmp_path: Path) -> None:
    code, lines = timeslice(
        tmp_path, "serve", "orchestrator", "--port", "0", "--db",
        "postgresql://user:secret@127.0.0.1:1/db", *QUIET, without_asyncpg=True,
    )  # fmt: skip
    assert code == 1
    assert one_error(lines) == (
        "error: the PostgreSQL journal needs asyncpg: pip install 'timeslice[postgres]'"
    )


def test_a_journal_password_is_never_printed(tmp_path: Path, free_port: int) -> None:
    pytest.importorskip("asyncpg")
    url = f"postgresql://user:secret@127.0.0.1:{free_port}/db"
    code, lines = timeslice(tmp_path, "serve", "orchestrator", "--port", "0", "--db", url, *QUIET)
    assert code == 1
    line = one_error(lines)
    assert f"user:***@127.0.0.1:{free_port}/db" in line and "secret" not in line
    code, lines = timeslice(
        tmp_path, "--debug", "serve", "orchestrator", "--port", "0", "--db", url, *QUIET
    )
    assert code == 1 and len(lines) > 1
    assert not [line for line in lines if "secret" in line]


@pytest.mark.skipif(
    "TIMESLICE_TEST_POSTGRES_URL" not in os.environ, reason="TIMESLICE_TEST_POSTGRES_URL is not set"
)
def test_the_startup_line_shows_no_password(tmp_path: Path, free_port: int) -> None:
    from sqlalchemy.engine import make_url

    url = make_url(os.environ["TIMESLICE_TEST_POSTGRES_URL"])
    if not url.password:
        pytest.skip("the test database's URL has no password")
    process = subprocess.Popen(
        [sys.executable, "-m", "timeslice", "serve", "orchestrator", "--port", str(free_port),
         "--db", url.render_as_string(hide_password=False), *QUIET],
        stderr=subprocess.PIPE, text=True, cwd=tmp_path,
    )  # fmt: skip
    assert process.stderr is not None
    try:
        line = process.stderr.readline()
    finally:
        process.terminate()
        process.wait(10)
        process.stderr.close()
    assert line.startswith("timeslice orchestrator serving on "), line
    assert ":***@" in line and str(url.password) not in line


def test_a_folder_as_the_journal_is_one_line(tmp_path: Path) -> None:
    folder = tmp_path / "journals"
    folder.mkdir()
    code, lines = timeslice(tmp_path, "serve", "orchestrator", "--port", "0", "--db", str(folder))
    assert code == 1
    line = one_error(lines)
    assert str(folder) in line and "folder" in line


def test_a_garbage_file_as_the_journal_is_one_line(tmp_path: Path) -> None:
    garbage = tmp_path / "journal.db"
    garbage.write_bytes(b"not a database at all\n" * 200)
    code, lines = timeslice(tmp_path, "serve", "orchestrator", "--port", "0", "--db", str(garbage))
    assert code == 1
    line = one_error(lines)
    assert str(garbage) in line and "SQLite" in line
    assert garbage.read_bytes() == b"not a database at all\n" * 200


# --- replay ---------------------------------------------------------------------------


def test_replay_of_a_journal_that_does_not_exist(tmp_path: Path) -> None:
    code, lines = timeslice(tmp_path, "replay", "gone.db", "-o", "page.html")
    assert code == 1
    assert one_error(lines) == "error: no journal at gone.db: the file does not exist"
    assert not (tmp_path / "gone.db").exists()


@pytest.mark.parametrize("kind", ["garbage", "other application's"])
def test_replay_of_a_file_that_is_no_journal(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "notes.db"
    if kind == "garbage":
        path.write_text("just text\n" * 100)
    else:
        with sqlite3.connect(path) as conn:
            conn.execute("CREATE TABLE notes (x)")
    code, lines = timeslice(tmp_path, "replay", str(path), "-o", "page.html")
    assert code == 1
    line = one_error(lines)
    assert str(path) in line
    assert not (tmp_path / "page.html").exists()


def test_replay_without_asyncpg_says_what_to_install(tmp_path: Path) -> None:
    code, lines = timeslice(
        tmp_path, "replay", "postgresql://user:secret@127.0.0.1:1/db", "-o", "page.html",
        without_asyncpg=True,
    )  # fmt: skip
    assert code == 1
    assert one_error(lines) == (
        "error: the PostgreSQL journal needs asyncpg: pip install 'timeslice[postgres]'"
    )


# --- the operator commands ----------------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [
        ["status"],
        ["acquire", "g", "j", "--timeout", "1"],
        ["yield", "g", "j"],
        ["force-release", "g"],
        ["reset-job", "g", "j"],
        ["group-nodes", "g", "gpu-1"],
    ],
    ids=lambda command: command[0],
)
def test_an_orchestrator_that_does_not_listen(
    tmp_path: Path, free_port: int, command: list[str]
) -> None:
    code, lines = timeslice(tmp_path, *command, "--target", f"127.0.0.1:{free_port}")
    assert code == 1
    assert one_error(lines) == (
        f"error: cannot reach the orchestrator at 127.0.0.1:{free_port}: connection refused"
        " (is it running?)"
    )


def test_a_target_that_is_no_address_is_a_bad_option(tmp_path: Path) -> None:
    code, lines = timeslice(tmp_path, "status", "--target", "localhost")
    assert code == 2
    assert "--target" in one_error(lines) and "'localhost'" in lines[0]
