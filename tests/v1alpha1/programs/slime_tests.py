"""The v1alpha1 Slime integration's own tests, run against a real orchestrator with a
real client, then its `TimesliceCallback` through a training step.

``python slime_tests.py ORCHESTRATOR_ADDRESS SLIME_SOURCES`` with the integration
(`timeslice_slime`) and a Slime stand-in (`slime.utils.phase_callback`) on the
path, and a `timeslice` package installed: the v1alpha1 client's or ours. The
tests (``SLIME_SOURCES/tests/test_callback.py``) record each lock operation in a
`FakeClient`; here that class is replaced by one that records the same and also
sends it, through `TimeSliceOrchestratorClient`, to the orchestrator. It prints
one line, ``RESULT {json}``: the tests' outcome, what the orchestrator saw, and
the callback's locks in each phase.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import unittest
from pathlib import Path
from typing import Any

from timeslice import TimeSliceOrchestratorClient


def load_tests_module(sources: Path) -> Any:
    path = sources / "tests" / "test_callback.py"
    spec = importlib.util.spec_from_file_location("slime_test_callback", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    address, sources = sys.argv[1], Path(sys.argv[2])
    tests = load_tests_module(sources)
    orchestrator_saw: list[list[str]] = []
    watcher = TimeSliceOrchestratorClient(address)

    class OrchestratorClient(TimeSliceOrchestratorClient):
        """The tests' FakeClient, over the real client: each acquire and release is
        recorded as the tests expect, and checked against the orchestrator."""

        def __init__(self, events: list[tuple[str, str]], job_id: str, group_id: str) -> None:
            super().__init__(target=address, job_id=job_id, group_id=group_id)
            self.events = events
            self.closed = False

        def acquire(self, group_id: str, timeout_sec: float | None = None) -> Any:  # type: ignore[override]
            assert group_id == self.group_id
            result = super().acquire(group_id=group_id, timeout_sec=timeout_sec)
            holder = watcher.get_status(group_id=group_id).group.locking_job
            orchestrator_saw.append(["acquire", group_id, holder])
            self.events.append(("acquire", group_id))
            return result

        def release(self, group_id: str) -> Any:  # type: ignore[override]
            assert group_id == self.group_id
            result = super().release(group_id=group_id)
            holder = watcher.get_status(group_id=group_id).group.locking_job
            orchestrator_saw.append(["release", group_id, holder])
            self.events.append(("release", group_id))
            return result

        def close(self) -> None:
            self.closed = True
            super().close()

    tests.FakeClient = OrchestratorClient
    suite = unittest.defaultTestLoader.loadTestsFromModule(tests)
    outcome = unittest.TextTestRunner(stream=sys.stderr, verbosity=2).run(suite)

    # The integration's own callback, configured from the environment as in a job.
    from timeslice_slime import TimesliceCallback

    trainers = os.environ["TIMESLICE_TRAINER_GROUP"]
    samplers = os.environ["TIMESLICE_SAMPLER_GROUP"]

    def holders() -> list[str]:
        return [watcher.get_status(group_id=g).group.locking_job for g in (trainers, samplers)]

    callback = TimesliceCallback()
    phases: list[list[object]] = []
    for phase, role in [
        ("init", "both"),
        ("generate", "sampler"),
        ("train", "trainer"),
        ("weight_sync", "both"),
    ]:
        callback.on_phase_begin(phase, role, {"rollout_id": 0})
        during = holders()
        callback.on_phase_end(phase, role, {"rollout_id": 0})
        phases.append([phase, during, holders()])
    callback.close()
    watcher.close()

    print(
        "RESULT "
        + json.dumps(
            {
                "run": outcome.testsRun,
                "failures": [str(test) for test, _ in outcome.failures],
                "errors": [str(test) for test, _ in outcome.errors],
                "orchestrator_saw": orchestrator_saw,
                "phases": phases,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
