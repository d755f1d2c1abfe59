"""The committed code in timeslice/api/gen is what the pinned generators make of
the .proto files in timeslice/api/proto."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
GENERATORS = ["betterproto2-compiler", "grpcio-tools", "ruff"]
HOW_TO_REGENERATE = (
    "Regenerate with the pinned generators: pip install -e '.[dev]' && "
    "python scripts/gen_proto.py, then commit timeslice/api/gen."
)


_EXACT_PIN = re.compile(
    r"\s*(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*==\s*(?P<version>[^\s;,]+)\s*"
)


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _exact_pins() -> dict[str, str]:
    """`name==version` requirements anywhere in pyproject.toml's project table."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    specs = [*project["dependencies"], *sum(project["optional-dependencies"].values(), [])]
    pins = {}
    for spec in specs:
        if match := _EXACT_PIN.fullmatch(spec):
            pins[_canonical(match["name"])] = match["version"]
    return pins


def _installed(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        pytest.fail(f"{name} is not installed. {HOW_TO_REGENERATE}")


@pytest.mark.parametrize("name", GENERATORS)
def test_generator_is_pinned_and_installed_at_the_pin(name: str) -> None:
    pins = _exact_pins()
    assert name in pins, (
        f"pyproject.toml must pin {name} with ==: other versions generate other code"
    )
    installed = _installed(name)
    assert installed == pins[name], (
        f"{name} {installed} is installed but pyproject.toml pins {pins[name]}. {HOW_TO_REGENERATE}"
    )


def test_runtime_and_compiler_share_major_minor() -> None:
    runtime, compiler = _installed("betterproto2"), _installed("betterproto2-compiler")
    assert runtime.split(".")[:2] == compiler.split(".")[:2], (
        f"betterproto2 {runtime} cannot load code from betterproto2-compiler {compiler}: "
        "pin both to the same major.minor in pyproject.toml"
    )


def test_generated_code_is_current() -> None:
    # The compiler runs `ruff` by name: find the one installed beside this interpreter.
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_proto.py"), "--check"],
        capture_output=True,
        text=True,
        env={**os.environ, "PATH": path},
        timeout=60,
    )
    assert result.returncode == 0, (
        "timeslice/api/gen does not match the .proto files "
        f"(scripts/gen_proto.py --check exited {result.returncode}):\n"
        f"{result.stdout}{result.stderr[-2000:]}\n{HOW_TO_REGENERATE}"
    )
