"""The v1alpha1 Python client's own package, and its Slime integration, installed at
test time into a virtual environment of their own (their distribution is named
`timeslice` too, so it cannot share ours).

The packages come from `../shared/reference/v1alpha1` beside the clone. Their
sources are copied first (the shared folder is left as it is: pip builds in the
source tree), then installed with pip into a venv kept in the system's temporary
folder, named by a hash of those sources and this Python's version, so that a
second test session reuses it. It is built in a folder of its own and renamed
when complete; a lock file keeps two sessions from building it at once.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT.parent / "shared" / "reference" / "v1alpha1"
PACKAGES = {
    "client": Path("pkg/client/python"),
    "slime": Path("pkg/integrations/slime"),
}
SKIPPED = {"__pycache__", "build", "dist", ".pytest_cache"}
PIP_TIMEOUT_SEC = 600


@dataclass(frozen=True, kw_only=True)
class Reference:
    """An installed copy of the v1alpha1 packages: the venv's interpreter, and the
    copied sources (the Slime integration's tests live there)."""

    python: Path
    client_src: Path
    slime_src: Path


class ReferenceUnavailable(Exception):
    """The v1alpha1 packages cannot be installed here (why is the message)."""


def _ignored(name: str) -> bool:
    return name in SKIPPED or name.endswith((".egg-info", ".pyc"))


def sources_digest() -> str:
    """A hash of every file of both packages, and of this Python's version."""
    digest = hashlib.sha256(sys.version.encode())
    for key, relative in sorted(PACKAGES.items()):
        base = REFERENCE / relative
        for path in sorted(base.rglob("*")):
            parts = path.relative_to(base).parts
            if path.is_file() and not any(_ignored(p) for p in parts):
                digest.update(f"{key}/{'/'.join(parts)}\0".encode())
                digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _copy_sources(into: Path) -> None:
    for key, relative in PACKAGES.items():
        target = into / key
        shutil.copytree(
            REFERENCE / relative,
            target,
            ignore=lambda _dir, names: [n for n in names if _ignored(n)],
            copy_function=shutil.copyfile,  # not the read-only modes of the shared copy
        )
        for folder, _dirs, _files in os.walk(target):
            os.chmod(folder, 0o755)


def _build(into: Path) -> None:
    _copy_sources(into / "src")
    subprocess.run(
        [sys.executable, "-m", "venv", str(into / "venv")],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    subprocess.run(
        [
            str(into / "venv" / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-input",
            str(into / "src" / "client"),
            str(into / "src" / "slime"),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=PIP_TIMEOUT_SEC,
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )


def installed_reference(cache: Path | None = None) -> Reference:
    """The v1alpha1 packages installed in a venv, built on first use and reused after.
    Raises `ReferenceUnavailable` when they cannot be installed."""
    for relative in PACKAGES.values():
        if not (REFERENCE / relative / "pyproject.toml").is_file():
            raise ReferenceUnavailable(f"no v1alpha1 package at {REFERENCE / relative}")
    cache = cache or Path(tempfile.gettempdir())
    home = cache / f"timeslice-v1alpha1-{sources_digest()}"
    ready = home / "READY"
    with open(cache / f"{home.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not ready.is_file():
            shutil.rmtree(home, ignore_errors=True)
            building = Path(tempfile.mkdtemp(prefix=f"{home.name}.", dir=cache))
            try:
                _build(building)
            except (OSError, subprocess.SubprocessError) as exc:
                shutil.rmtree(building, ignore_errors=True)
                detail = getattr(exc, "stderr", "") or ""
                raise ReferenceUnavailable(
                    f"installing the v1alpha1 packages failed: {exc}\n{detail[-2000:]}"
                ) from exc
            # Moved in whole once built: `venv/bin/python` runs from anywhere (only the
            # console scripts, which these tests do not use, name their folder).
            (building / "READY").write_text("ok\n")
            os.rename(building, home)
    return Reference(
        python=home / "venv" / "bin" / "python",
        client_src=home / "src" / "client",
        slime_src=home / "src" / "slime",
    )
