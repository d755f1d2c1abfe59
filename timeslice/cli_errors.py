"""How the command line reports a failure: one line on stderr that names the cause
and what to do, and an exit status: 1 when something failed, 2 for bad options
(as typer says for the options it parses itself). `timeslice --debug` prints the
traceback above that line.

Every command runs its body inside `user_errors`, so that this is the one place
that decides how an exception reads.
"""

from __future__ import annotations

import errno
import os
import socket
import ssl
import sys
import traceback
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from urllib.parse import quote_plus

import typer

from timeslice.errors import DeadlineExceededError, TimeSliceError, UnavailableError

#: Set by the app's `--debug` option.
debugging: ContextVar[bool] = ContextVar("debugging", default=False)

# Optional dependencies, by the module a feature imports: what to install.
_EXTRAS = {
    "asyncpg": "the PostgreSQL journal needs asyncpg: pip install 'timeslice[postgres]'",
}

# The socket errors of binding a listening address, and what to do about each.
_LISTEN_ADVICE = {
    errno.EADDRINUSE: "another server runs there? pick another --port",
    errno.EADDRNOTAVAIL: "is --host an address of this machine?",
    errno.EACCES: "ports below 1024 need privileges: pick another --port",
}


class CommandError(Exception):
    """A failure the command has already put in words (exit status 1)."""


@dataclass(frozen=True, kw_only=True)
class Scope:
    """What the command was doing, for its messages: the address it listens on,
    the orchestrator it calls, and the database URLs it was given (whose
    passwords are never printed)."""

    listen: str | None = None
    target: str | None = None
    urls: Sequence[str] = ()
    # What runs at `target`, as the messages name it.
    server: str = "the orchestrator"


@contextmanager
def user_errors(scope: Scope | None = None) -> Iterator[None]:
    """Turn an exception of the body into one line on stderr and `typer.Exit`."""
    scope = scope or Scope()
    try:
        yield
    except (typer.Exit, typer.Abort):
        raise
    except typer.BadParameter as exc:
        _report(exc, exc.message, exc.exit_code, scope)
    except Exception as exc:
        _report(exc, describe(exc, scope), 1, scope)


def _report(exc: BaseException, message: str, code: int, scope: Scope) -> None:
    if debugging.get():
        trace = "".join(traceback.format_exception(exc))
        sys.stderr.write(redact(trace, scope.urls))
    typer.echo(f"error: {' '.join(redact(message, scope.urls).split())}", err=True)
    raise typer.Exit(code) from None


def describe(exc: BaseException, scope: Scope) -> str:
    """The cause of `exc` and what to do, in words."""
    if missing := _missing_extra(exc):
        return missing
    if isinstance(exc, CommandError):
        return str(exc)
    if isinstance(exc, UnavailableError | DeadlineExceededError) and scope.target is not None:
        # The socket's own error, below the client's (UnavailableError is an OSError
        # too); an Acquire retries until its --timeout before it gives up.
        if (cause := _socket_error(exc)) is not None:
            if isinstance(cause, ssl.SSLCertVerificationError):
                return (
                    f"cannot reach {scope.server} at {scope.target}: its certificate is not"
                    f" trusted: {cause.verify_message} (check --tls-ca or TIMESLICE_TLS_CA)"
                )
            if isinstance(cause, ssl.SSLError):
                return f"TLS with {scope.server} at {scope.target} failed: {cause.reason}"
            advice = "check --target" if isinstance(cause, socket.gaierror) else "is it running?"
            return f"cannot reach {scope.server} at {scope.target}: {_reason(cause)} ({advice})"
    if isinstance(exc, TimeSliceError):
        message = exc.message or type(exc).__name__
        # An operator reading a client's error wants the status to look it up.
        return f"{message} ({exc.code.name})" if scope.target is not None else message
    if isinstance(exc, OSError):
        if scope.listen is not None and (todo := _listen_advice(exc)):
            return f"cannot listen on {scope.listen}: {_reason(exc)} ({todo})"
        if exc.filename is not None:
            return f"{exc.filename}: {_reason(exc)}"
    if (orig := _database_error(exc)) is not None:
        where = shown(scope.urls[0]) if scope.urls else "the database"
        return f"{where}: {orig}"
    return f"{type(exc).__name__}: {exc} (run with --debug for the traceback)"


def _missing_extra(exc: BaseException) -> str | None:
    for error in _chain(exc):
        if isinstance(error, ModuleNotFoundError) and error.name is not None:
            return _EXTRAS.get(error.name.split(".")[0])
    return None


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """`exc`, then the exception it was raised from (or while handling), and so on."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        yield current
        seen.add(id(current))
        # `raise ... from None` says its context is not the cause.
        suppressed = current.__cause__ is None and current.__suppress_context__
        current = None if suppressed else (current.__cause__ or current.__context__)


def _socket_error(exc: BaseException) -> OSError | None:
    for error in _chain(exc):
        if isinstance(error, OSError) and not isinstance(error, TimeSliceError | TimeoutError):
            return error
    return None


def _listen_advice(exc: OSError) -> str | None:
    if isinstance(exc, socket.gaierror):
        return "check --host"
    if exc.filename is None and exc.errno is not None:
        return _LISTEN_ADVICE.get(exc.errno)
    return None


def _reason(exc: OSError) -> str:
    # asyncio words a refused connection "Connect call failed (...)": the errno says more.
    if isinstance(exc, socket.gaierror) or not exc.errno or exc.errno < 0:
        text = exc.strerror or str(exc) or type(exc).__name__
    else:
        text = os.strerror(exc.errno)
    return text[:1].lower() + text[1:]


def _database_error(exc: BaseException) -> BaseException | None:
    """The driver's own error inside SQLAlchemy's wrapper (whose text adds a link
    and the statement), if `exc` is one."""
    sa_exc = sys.modules.get("sqlalchemy.exc")
    if sa_exc is None or not isinstance(exc, sa_exc.DBAPIError):
        return None
    orig: BaseException | None = exc.orig
    return orig


def shown(url: str) -> str:
    """`url` as it may be printed: without its password."""
    return redact(url, [url])


def redact(text: str, urls: Sequence[str]) -> str:
    """`text` with the password of each of `urls` replaced by ***."""
    for url in urls:
        if "://" not in url or "@" not in url:
            continue
        from sqlalchemy.engine import make_url

        try:
            parsed = make_url(url)
        except Exception:  # not an URL: it can still carry a "user:password@" part
            head, _, _ = url.rpartition("@")
            secret = head.split("://", 1)[1].partition(":")[2]
            if secret:
                text = text.replace(f":{secret}@", ":***@")
            continue
        text = text.replace(url, parsed.render_as_string(hide_password=True))
        if password := parsed.password:
            for form in {str(password), quote_plus(str(password))}:
                text = text.replace(f":{form}@", ":***@")
    return text
