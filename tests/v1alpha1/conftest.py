"""Fixtures of the drop-in tests: the v1alpha1 packages installed in a venv of their
own, our servers serving from threads, and the programs written for the v1alpha1
client run under either package."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.grpcio_compat import serving_in_thread
from tests.v1alpha1.reference import Reference, ReferenceUnavailable, installed_reference
from timeslice.agent.server import Agent
from timeslice.orchestrator.server import Orchestrator

PROGRAMS = Path(__file__).parent / "programs"
SLIME_STUB = Path(__file__).parent / "slime_stub"
# Which package named `timeslice` a program runs with.
V1ALPHA1, TIMESLICE = "v1alpha1", "timeslice"


@pytest.fixture(scope="session")
def reference() -> Reference:
    """The v1alpha1 client and its Slime integration, installed once per session (and
    kept between sessions). Skipped where they cannot be installed, except under
    CI=true, where that fails the tests."""
    try:
        return installed_reference()
    except ReferenceUnavailable as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the v1alpha1 client could not be installed: {exc}")
        pytest.skip(f"the v1alpha1 client could not be installed: {exc}")


@pytest.fixture(params=[V1ALPHA1, TIMESLICE])
def implementation(request: pytest.FixtureRequest) -> str:
    """Run once with the v1alpha1 client's package, once with ours."""
    return str(request.param)


@pytest.fixture
def python(implementation: str, request: pytest.FixtureRequest) -> Path:
    """The interpreter that has `implementation` as its `timeslice`."""
    if implementation == TIMESLICE:
        return Path(sys.executable)
    reference: Reference = request.getfixturevalue("reference")
    return reference.python


@pytest.fixture
def orchestrator_address(tmp_path: Path) -> Iterator[str]:
    """Our Orchestrator, serving from a thread with an event loop of its own."""
    db = f"sqlite:///{tmp_path / 'journal.db'}"
    with serving_in_thread(lambda: Orchestrator(db=db, port=0), "orchestrator") as address:
        yield address


@pytest.fixture
def agent_address(tmp_path: Path) -> Iterator[str]:
    """Our Agent, serving from a thread; its job table is checked when it stops."""
    db = f"sqlite:///{tmp_path / 'agent.db'}"

    def agent() -> Agent:
        return Agent(node_name="n1", db=db, backends=("noop", "app_channel"))

    with serving_in_thread(agent, "agent", lambda a: a.table.validate()) as address:
        yield address


def run_program(
    python: Path,
    program: str,
    *args: str,
    cwd: Path,
    env: dict[str, str] | None = None,
    timeout: float = 90.0,
) -> dict[str, object]:
    """Run `programs/<program>` with `python`; return what its ``RESULT`` line says.
    Our tree is kept off its path, so that `timeslice` is the interpreter's own."""
    environment = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    environment.update(PYTHONDONTWRITEBYTECODE="1", **(env or {}))
    done = subprocess.run(
        [str(python), str(PROGRAMS / program), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=environment,
        cwd=cwd,
    )
    results = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and results, (
        f"{program} with {python} ended {done.returncode}:\n"
        f"{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    )
    result: dict[str, object] = json.loads(results[-1].removeprefix("RESULT "))
    return result
