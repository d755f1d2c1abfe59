"""How `benchmarks/anchor_servers.py` finds the baselines' programs and names
their versions (no server is started here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import anchor_servers


@pytest.mark.parametrize(
    ("printed", "named"),
    [
        ("etcd Version: 3.4.23\nGit SHA: Not provided\nGo Version: go1.19.8\n", "etcd 3.4.23"),
        ("Redis server v=7.0.15 sha=00000000:0 malloc=jemalloc-5.3.0 bits=64\n", "Redis 7.0.15"),
        ("", "version unknown"),
    ],
)
def test_a_version_is_named_from_what_the_program_prints(printed: str, named: str) -> None:
    assert anchor_servers.version_of(printed) == named


def test_a_program_off_path_is_missing_and_says_why(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    found = anchor_servers.find_programs(["etcd", "redis"], install=False)
    assert found.paths == {}
    assert found.missing == {"etcd": "not on PATH", "redis": "not on PATH"}


def test_without_apt_get_nothing_is_installed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no apt-get either
    found = anchor_servers.find_programs(["redis"], install=True)
    assert "apt-get cannot install it here" in found.missing["redis"]
