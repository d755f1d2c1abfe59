"""What importing a part of timeslice costs: the pure tables load no I/O stack,
the clients no server, SQL or numpy; and no module imports another that imports
it back."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
IO_STACKS = ("asyncio", "grpclib", "sqlalchemy", "numpy", "betterproto2")


def loaded_by(module: str) -> set[str]:
    """The top-level packages a fresh interpreter has loaded after `import module`."""
    code = f"import json, sys; import {module}; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    return {name.partition(".")[0] for name in json.loads(out)}


@pytest.mark.parametrize(
    "table",
    [
        "timeslice.orchestrator.state",
        "timeslice.agent.state",
        "timeslice.orchestrator.events",
        "timeslice.orchestrator.agent_views",
        "timeslice.ids",
        "timeslice.errors",
    ],
)
def test_a_pure_core_loads_no_io_stack(table: str) -> None:
    loaded = loaded_by(table)
    assert not loaded & set(IO_STACKS), sorted(loaded & set(IO_STACKS))


@pytest.mark.parametrize("client", ["timeslice", "timeslice.client"])
def test_a_client_loads_no_server_sql_or_numpy(client: str) -> None:
    loaded = loaded_by(client)
    assert not loaded & {"sqlalchemy", "numpy", "asyncpg", "torch"}, loaded


def test_the_workloads_load_torch_only_when_the_torch_workload_is_imported() -> None:
    assert "torch" not in loaded_by("timeslice.workloads")


def test_the_orchestrator_client_loads_no_agent_client_or_workload_channel() -> None:
    code = (
        "import json, sys; from timeslice.client import TimeSliceOrchestratorClient; "
        "print(json.dumps([m for m in sys.modules if m.startswith('timeslice.client')]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    loaded = set(json.loads(out))
    assert "timeslice.client._sync" in loaded
    assert not loaded & {"timeslice.client.agent", "timeslice.client.workload"}, loaded


def test_importing_the_package_loads_only_the_errors_and_the_lazy_names() -> None:
    code = (
        "import sys, timeslice; print(sorted(m for m in sys.modules if m.startswith('timeslice')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "['timeslice', 'timeslice._lazy', 'timeslice.errors']"


def test_the_public_names_import_on_first_use() -> None:
    import timeslice

    for name in timeslice.__all__:
        assert getattr(timeslice, name) is not None, name
    with pytest.raises(AttributeError):
        timeslice.NoSuchThing  # noqa: B018


def test_no_module_of_the_package_imports_itself_back() -> None:
    done = subprocess.run(
        [sys.executable, "scripts/check_imports.py"], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
