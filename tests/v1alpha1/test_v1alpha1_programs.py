"""Programs written for the v1alpha1 Python client run unchanged against our
orchestrator and agent, with the v1alpha1 client's own package and with ours in
its place.

Each program (`programs/`) uses only the v1alpha1 client's documented calls and
import paths, and prints what it saw. It runs twice: with the v1alpha1 package
installed at test time (`reference.py`), which proves the program is v1alpha1
code and that our servers answer that client as the v1alpha1 protocol says; and
with our package, which proves ours is a drop-in for it. Both runs must see the
same, and what they see is checked here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.v1alpha1.conftest import SLIME_STUB, run_program
from tests.v1alpha1.reference import Reference

pytestmark = pytest.mark.timeout(300)

ORCHESTRATOR_SEES = {
    "names": [
        True,
        True,
        True,
        True,
        ["UNSPECIFIED", "IDLE", "RUNNING", "TRANSITIONING", "SAVED", "FAULTED"],
        [
            "group_id",
            "group_state",
            "state_timestamp",
            "locking_job",
            "active_job",
            "waiter_queue_depth",
            "loaded_job",
        ],
        ["agent", "job_id", "job_state"],
    ],
    "acquire": [True, True],
    "status": [True, "g", "LOCKED", "job-a", 0],
    # As the v1alpha1 server answers a Yield by a job that does not hold the lock.
    "release_by_other": "PERMISSION_DENIED",
    # Given up at its timeout (within half a second), and gone from the queue.
    "timeout": ["DEADLINE_EXCEEDED", True],
    "queue_after_timeout": 0,
    "release": [True, True, 0, True],
    "idle": "IDLE_YIELDED",
    "with": [True, "job-b"],
    "after_with": "",
    "decorated": ["job-a", ""],
    "list_groups": True,
    "unknown_group": "NOT_FOUND",
    "no_job_id": "ValueError",
    "override": "job-c",
    "override_with": [True, "job-e"],
}


def test_orchestrator_calls_see_the_same_with_either_client(
    python: Path, orchestrator_address: str, tmp_path: Path
) -> None:
    seen = run_program(python, "orchestrator_calls.py", orchestrator_address, "g", cwd=tmp_path)
    assert seen == ORCHESTRATOR_SEES


AGENT_SEES = {
    "names": [True, True, True],
    "handle": True,
    "status": [True, [["trainer", "JOB_STATE_RUNNING"]]],
    # The default group finds the job registered in group g1 by its id alone.
    "snapshot_default_group": [True, "OPERATION_STATUS_COMPLETE"],
    "restore_positional": "OPERATION_STATUS_COMPLETE",
    "snapshot_positional": "OPERATION_STATUS_COMPLETE",
    "restore_default_group": "OPERATION_STATUS_COMPLETE",
    # Known in g1 and g2, the id alone is refused with an error naming both.
    "ambiguous": [True, True],
    "named_group": "OPERATION_STATUS_COMPLETE",
    "unknown_job": [True, True],
    "unknown_operation": True,
    "health": "SERVING",
    "calls": [
        [
            ["snapshot", "offload", []],
            ["restore", []],
            ["snapshot", "discard", ["weights"]],
            ["restore", []],
        ],
        [["snapshot", "offload", []]],
    ],
}


def test_agent_calls_see_the_same_with_either_client(
    python: Path, agent_address: str, tmp_path: Path
) -> None:
    seen = run_program(python, "agent_calls.py", agent_address, cwd=tmp_path)
    assert seen == AGENT_SEES


def test_the_slime_integration_tests_pass_against_our_orchestrator(
    python: Path,
    implementation: str,
    reference: Reference,
    orchestrator_address: str,
    tmp_path: Path,
) -> None:
    # The integration's sources on the path for both runs (the v1alpha1 venv has
    # them installed too), and the Slime stand-in.
    paths = [str(SLIME_STUB), str(reference.slime_src)]
    env = {
        "PYTHONPATH": ":".join(paths),
        "TIMESLICE_JOB_ID": f"cb-{implementation}",
        "TIMESLICE_ORCH_ADDR": orchestrator_address,
        "TIMESLICE_TRAINER_GROUP": "trainers-cb",
        "TIMESLICE_SAMPLER_GROUP": "samplers-cb",
    }
    seen = run_program(
        python,
        "slime_tests.py",
        orchestrator_address,
        str(reference.slime_src),
        cwd=tmp_path,
        env=env,
    )
    assert seen["failures"] == [] and seen["errors"] == []
    assert seen["run"] == 18  # every test of the integration
    operations = seen["orchestrator_saw"]
    assert isinstance(operations, list) and len(operations) > 50
    # Every acquire was granted by the orchestrator (the job holds the group after
    # it), and after every release the group was free.
    for op, group, holder in operations:
        assert group in ("trainers", "samplers")
        assert holder == ("job-a" if op == "acquire" else ""), (op, group, holder)
    job = f"cb-{implementation}"
    assert seen["phases"] == [
        ["init", [job, job], ["", ""]],
        ["generate", ["", job], ["", ""]],
        ["train", [job, ""], ["", ""]],
        ["weight_sync", [job, job], ["", ""]],
    ]
