"""The agent's Unix socket file (`timeslice.agent.local_socket`): mode 0666, a stale
file replaced, a live socket or anything else at the path refused, and only its
own file removed at the end."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import pytest

from timeslice.agent.local_socket import bind_unix, check_socket_path, remove_socket
from timeslice.errors import ConflictError, InvalidArgumentError

pytestmark = pytest.mark.timeout(10)


def test_a_socket_every_user_may_open_removed_at_the_end(tmp_path: Path) -> None:
    path = tmp_path / "a.sock"
    bound = bind_unix(str(path))
    try:
        assert stat.S_ISSOCK(path.stat().st_mode)
        assert stat.S_IMODE(path.stat().st_mode) == 0o666
        with socket.socket(socket.AF_UNIX) as client:
            client.connect(str(path))
    finally:
        bound.sock.close()
    remove_socket(bound)
    assert not path.exists()


def test_a_stale_socket_file_is_replaced_a_live_one_refused(tmp_path: Path) -> None:
    path = tmp_path / "a.sock"
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(path))
    stale.close()  # the file stays, nothing listens
    bound = bind_unix(str(path))
    try:
        with pytest.raises(ConflictError, match="listens on"):
            bind_unix(str(path))
        assert path.exists()  # the live one is left alone
    finally:
        bound.sock.close()
        remove_socket(bound)


def test_anything_else_at_the_path_is_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "a.sock"
    path.write_text("not a socket")
    with pytest.raises(ConflictError, match="not a socket"):
        bind_unix(str(path))
    assert path.read_text() == "not a socket"


def test_only_its_own_file_is_removed(tmp_path: Path) -> None:
    path = tmp_path / "a.sock"
    bound = bind_unix(str(path))
    bound.sock.close()
    os.unlink(path)
    path.write_text("someone else's")  # made after ours went away
    remove_socket(bound)
    assert path.read_text() == "someone else's"


@pytest.mark.parametrize(
    ("path", "says"), [("", "empty"), ("a\0b", "NUL"), ("/" + "x" * 120, "107")]
)
def test_paths_no_socket_can_have(path: str, says: str) -> None:
    with pytest.raises(InvalidArgumentError, match=says):
        check_socket_path(path)
