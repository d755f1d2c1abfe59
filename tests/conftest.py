"""Fixtures that tests anywhere may share. Keep this small and cheap to import."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests import ports
from tests.certs import Certs, have_openssl, make_certs
from timeslice.security.callers import CURRENT, Caller


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """A journal URL for an SQLite file of the test's own."""
    return f"sqlite:///{tmp_path / 'journal.db'}"


@pytest.fixture
def free_port() -> int:
    """A TCP port on 127.0.0.1 free now, that no connection will take meanwhile (for
    a server that cannot take port 0, such as one in another process: `tests.ports`)."""
    return ports.free_port()


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    """One set of test certificates for the whole run (tests/certs.py): a CA, a server
    certificate for 127.0.0.1 and localhost, client certificates, and another CA."""
    if not have_openssl():
        message = "the openssl command is not installed (the tests make their certificates with it)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture
def as_caller() -> Iterator[Callable[[Caller], Caller]]:
    """Make the current context's caller (what the servers' edge sets for a call) the
    one given, for the rest of the test."""
    tokens = []

    def use(caller: Caller) -> Caller:
        tokens.append(CURRENT.set(caller))
        return caller

    yield use
    for token in reversed(tokens):
        CURRENT.reset(token)
