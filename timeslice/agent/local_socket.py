"""The agent's Unix socket (`--socket PATH`), where node-local jobs and workloads
reach it: the same services as on TCP, with each caller known by its peer
credentials (SO_PEERCRED: its pid and uid; see `timeslice.security.callers`).

The socket file is made mode 0666: any local user may connect, for what a
caller may do is decided per call from its uid (`timeslice.agent.access`), not
by who can open the file. A file left at PATH by an agent that died is removed
at start only if nothing listens on it (a connection is refused); a live
socket there, or anything that is not a socket, is an error. The agent removes
its own socket file when it closes (only if the file is still the one it made).
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat
from dataclasses import dataclass
from typing import Final

from timeslice.errors import ConflictError, InvalidArgumentError

SOCKET_MODE: Final = 0o666
# sun_path holds 108 bytes on Linux, its terminating NUL included.
MAX_PATH_BYTES: Final = 107


@dataclass(frozen=True, kw_only=True)
class BoundSocket:
    """A listening Unix socket and the file it made (device and inode)."""

    sock: socket.socket
    path: str
    file_id: tuple[int, int]


def check_socket_path(path: str) -> None:
    """Refuse a path no Unix socket can be bound at."""
    if not path:
        raise InvalidArgumentError("the socket path must not be empty")
    if "\0" in path:
        raise InvalidArgumentError("the socket path must not contain NUL")
    if len(os.fsencode(path)) > MAX_PATH_BYTES:
        raise InvalidArgumentError(
            f"the socket path is over {MAX_PATH_BYTES} bytes (a Unix socket's limit)"
        )


def bind_unix(path: str) -> BoundSocket:
    """A listening, non-blocking Unix socket at `path`, mode 0666; a stale socket
    file there (nothing listening) is removed first."""
    check_socket_path(path)
    _remove_stale(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
        os.chmod(path, SOCKET_MODE)
        sock.listen(128)
        sock.setblocking(False)
        info = os.stat(path)
    except OSError as exc:
        sock.close()
        raise ConflictError(f"cannot listen on {path}: {exc.strerror or exc}") from None
    return BoundSocket(sock=sock, path=path, file_id=(info.st_dev, info.st_ino))


def remove_socket(bound: BoundSocket) -> None:
    """Remove the socket file, if it is still the one `bind_unix` made."""
    with contextlib.suppress(OSError):
        info = os.lstat(bound.path)
        if stat.S_ISSOCK(info.st_mode) and (info.st_dev, info.st_ino) == bound.file_id:
            os.unlink(bound.path)


def _remove_stale(path: str) -> None:
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(info.st_mode):
        raise ConflictError(f"{path} exists and is not a socket: not removed")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(1.0)
        probe.connect(path)
    except ConnectionRefusedError:
        os.unlink(path)  # nothing listens: a stale file
        return
    except OSError as exc:
        raise ConflictError(
            f"cannot tell whether {path} is in use: {exc.strerror or exc}"
        ) from None
    finally:
        probe.close()
    raise ConflictError(f"something listens on {path} already (another agent?)")
