"""The tests' server ports are drawn where no outgoing connection takes its end."""

from __future__ import annotations

import socket

from tests.ports import ephemeral_range, free_port


def test_ports_are_free_outside_the_ephemeral_range_and_never_given_twice() -> None:
    low, high = ephemeral_range()
    assert 1024 < low <= high <= 65535
    drawn = [free_port() for _ in range(50)]
    assert len(set(drawn)) == len(drawn)
    assert not any(low <= port <= high for port in drawn)
    for port in drawn[:5]:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))  # free indeed
