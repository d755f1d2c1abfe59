"""How the command line words a failure (`timeslice/cli_errors.py`)."""

from __future__ import annotations

import errno
import socket

import pytest

from timeslice.cli_errors import CommandError, Scope, describe, redact, shown
from timeslice.errors import (
    DeadlineExceededError,
    TimeSliceError,
    NotHolderError,
    UnavailableError,
)

TARGET = Scope(target="10.0.0.1:50051")


def raised_from(exc: BaseException, cause: BaseException) -> BaseException:
    try:
        raise exc from cause
    except BaseException as caught:
        return caught


def test_a_refused_connection_names_the_orchestrator() -> None:
    refused = ConnectionRefusedError(errno.ECONNREFUSED, "Connect call failed ('10.0.0.1', 50051)")
    unavailable = raised_from(UnavailableError("ListGroups: [Errno 111] ..."), refused)
    assert describe(unavailable, TARGET) == (
        "cannot reach the orchestrator at 10.0.0.1:50051: connection refused (is it running?)"
    )
    # An Acquire that retried until its --timeout ran out, with the same cause below.
    deadline = raised_from(
        DeadlineExceededError("Acquire(g/j): the time limit ran out"), unavailable
    )
    assert describe(deadline, TARGET) == describe(unavailable, TARGET)


def test_a_host_name_that_does_not_resolve() -> None:
    unknown = socket.gaierror(socket.EAI_NONAME, "Name or service not known")
    unavailable = raised_from(UnavailableError("ListGroups"), unknown)
    assert describe(unavailable, TARGET) == (
        "cannot reach the orchestrator at 10.0.0.1:50051: name or service not known"
        " (check --target)"
    )


def test_the_orchestrators_answers_keep_their_status() -> None:
    assert describe(NotHolderError("j does not hold g"), TARGET) == (
        "j does not hold g (FAILED_PRECONDITION)"
    )
    # A deadline with no socket error below it is what it says.
    assert describe(DeadlineExceededError("Acquire(g/j): not granted"), TARGET) == (
        "Acquire(g/j): not granted (DEADLINE_EXCEEDED)"
    )


def test_a_servers_own_errors_are_their_message() -> None:
    journal = TimeSliceError("journal.db is in use by the orchestrator on host-1")
    assert describe(journal, Scope()) == "journal.db is in use by the orchestrator on host-1"
    assert describe(CommandError("no journal at x.db"), Scope()) == "no journal at x.db"


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (
            OSError(errno.EADDRINUSE, "Address already in use"),
            "address already in use (another server runs there? pick another --port)",
        ),
        (
            OSError(errno.EADDRNOTAVAIL, "Cannot assign requested address"),
            "cannot assign requested address (is --host an address of this machine?)",
        ),
        (PermissionError(errno.EACCES, "Permission denied"), "permission denied (ports below"),
        (socket.gaierror(socket.EAI_NONAME, "Name or service not known"), "(check --host)"),
    ],
)
def test_listening_errors_say_what_to_change(error: OSError, expected: str) -> None:
    message = describe(error, Scope(listen="0.0.0.0:80"))
    assert message.startswith("cannot listen on 0.0.0.0:80: ") and expected in message


def test_a_file_error_names_the_file() -> None:
    error = PermissionError(errno.EACCES, "Permission denied", "/var/lib/timeslice/journal.db")
    assert describe(error, Scope(listen="0.0.0.0:80")) == (
        "/var/lib/timeslice/journal.db: permission denied"
    )


def test_a_missing_extra_says_what_to_install() -> None:
    missing = ModuleNotFoundError("No module named 'asyncpg'", name="asyncpg")
    wrapped = raised_from(CommandError("cannot read the journal"), missing)
    assert describe(wrapped, Scope()) == (
        "the PostgreSQL journal needs asyncpg: pip install 'timeslice[postgres]'"
    )
    other = ModuleNotFoundError("No module named 'yaml'", name="yaml")
    assert "ModuleNotFoundError: No module named 'yaml'" in describe(other, Scope())


def test_anything_else_names_its_type_and_points_to_debug() -> None:
    assert describe(KeyError("x"), Scope()) == (
        "KeyError: 'x' (run with --debug for the traceback)"
    )


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("postgresql://user:secret@host/db", "postgresql://user:***@host/db"),
        ("postgresql://user:s%40cret@host:5432/db", "postgresql://user:***@host:5432/db"),
        ("postgresql://host/db", "postgresql://host/db"),
        ("sqlite:////var/lib/timeslice/journal.db", "sqlite:////var/lib/timeslice/journal.db"),
        ("journal.db", "journal.db"),
    ],
)
def test_urls_are_shown_without_their_password(url: str, expected: str) -> None:
    assert shown(url) == expected


def test_messages_lose_the_password_in_any_form() -> None:
    url = "postgresql://user:s%40cret@host/db"
    text = redact(f"cannot open {url}; postgresql+asyncpg://user:s@cret@host/db failed", [url])
    assert "cret" not in text and text.count("user:***@host/db") == 2
