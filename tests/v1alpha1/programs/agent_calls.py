"""A program written for the v1alpha1 Python client: a workload registered from plain
code with `register_workload`, moved by `SnapshotAgentClient` in each positional form
the client documents, with the default (empty) group as its callers send it.

Run with either package named `timeslice` installed (the v1alpha1 client's, or
ours): ``python agent_calls.py AGENT_ADDRESS``. It prints one line,
``RESULT {json}``, of what it saw; the tests compare it across both.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable

import grpc

from timeslice import SnapshotAgentClient as TopLevelClient
from timeslice.snapshot_agent import (
    SnapshotAgentClient,
    WorkloadHandle,
    register_workload,
    snapshot_agent_pb2,
)
from timeslice.snapshot_agent.adapters import resolve_adapter
from timeslice.snapshot_agent.client import SnapshotAgentError
from timeslice.snapshot_agent.types import GetOperationResponse, StatusResponse
from timeslice.snapshot_agent.workload import register_workload as same_register


class Workload:
    """A workload as the v1alpha1 README describes one: snapshot(mode, tags) and
    restore(tags), with the modes it supports."""

    supported_modes = ["offload", "discard"]
    default_mode = "offload"

    def __init__(self) -> None:
        self.calls: list[list[object]] = []

    def snapshot(self, mode: str, tags: list[str]) -> None:
        self.calls.append(["snapshot", mode, list(tags)])

    def restore(self, tags: list[str]) -> None:
        self.calls.append(["restore", list(tags)])


def wait_until(check: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(f"not within {timeout} s: {what}")
        time.sleep(0.02)


def known(client: SnapshotAgentClient, job: str) -> int:
    return sum(s.job_id == job for s in client.status().job_statuses)


def main() -> None:
    agent = sys.argv[1]
    seen: dict[str, object] = {}
    seen["names"] = [
        TopLevelClient is SnapshotAgentClient,
        same_register is register_workload,
        callable(resolve_adapter),
    ]

    trainer = Workload()
    handle = register_workload(agent, job_id="trainer", group="g1", workload=trainer)
    seen["handle"] = isinstance(handle, WorkloadHandle)

    with SnapshotAgentClient(endpoint=agent) as client:
        wait_until(lambda: known(client, "trainer") == 1, "the workload registered")
        status = client.status()
        seen["status"] = [
            isinstance(status, StatusResponse),
            [(s.job_id, s.state) for s in status.job_statuses],
        ]

        # The default group: the job is found by its id alone.
        saved = client.snapshot_and_wait("trainer", poll_interval_sec=0.05)
        seen["snapshot_default_group"] = [isinstance(saved, GetOperationResponse), saved.status]
        # (job_id, group, poll_interval_sec), positionally.
        back = client.restore_and_wait("trainer", "g1", 0.05)
        seen["restore_positional"] = back.status
        # (job_id, group, backend_config), positionally.
        config = snapshot_agent_pb2.BackendConfig(
            app_channel=snapshot_agent_pb2.AppChannelConfig(
                mode=snapshot_agent_pb2.SUSPEND_MODE_DISCARD, tags=["weights"]
            )
        )
        started = client.snapshot("trainer", "g1", config)
        seen["snapshot_positional"] = client.wait_for_operation(started.operation_id, 0.05).status
        # (job_id, group, poll_interval_sec, backend_config), positionally.
        again = client.restore_and_wait("trainer", "", 0.05, None)
        seen["restore_default_group"] = again.status

        # The same job id in a second group: the empty group cannot choose.
        other = Workload()
        second = register_workload(agent, job_id="trainer", group="g2", workload=other)
        wait_until(lambda: known(client, "trainer") == 2, "the second workload registered")
        try:
            client.snapshot("trainer")
            seen["ambiguous"] = "started"
        except SnapshotAgentError as error:
            seen["ambiguous"] = [
                error.code == grpc.StatusCode.FAILED_PRECONDITION,
                "g1" in (error.details or "") and "g2" in (error.details or ""),
            ]
        seen["named_group"] = client.snapshot_and_wait("trainer", "g2", 0.05).status

        try:
            client.snapshot("nobody")
            seen["unknown_job"] = "started"
        except SnapshotAgentError as error:
            seen["unknown_job"] = [
                error.code == grpc.StatusCode.NOT_FOUND,
                isinstance(error.details, str),
            ]
        try:
            client.get_operation("no-such-operation")
            seen["unknown_operation"] = "found"
        except SnapshotAgentError as error:
            seen["unknown_operation"] = error.code == grpc.StatusCode.NOT_FOUND
        seen["health"] = client.check_health().status
        seen["calls"] = [trainer.calls, other.calls]
    handle.close()
    second.close(timeout=5.0)
    print("RESULT " + json.dumps(seen), flush=True)


if __name__ == "__main__":
    main()
