"""An agent's SwitchGroup answer is one the orchestrator reads whole, whatever its
workloads said: a long error or fault is cut to the free-text bound, not sent to be
refused."""

from __future__ import annotations

from timeslice.agent.events import Job, JobState, Operation, OpStatus
from timeslice.agent.messages import switch_group_reply
from timeslice.agent.switching import SwitchReport, SwitchStep
from timeslice.api.bounds import MAX_TEXT_BYTES
from timeslice.api.gen.snapshot_agent import v1alpha1 as pb
from timeslice.api.wire import decode_strict
from timeslice.kinds import Liveness, OpKind

LONG = "é" * 5000  # 10,000 bytes of UTF-8


def test_long_errors_and_faults_are_cut_to_the_bound() -> None:
    failed = Operation(
        op_id="op-7",
        kind=OpKind.SNAPSHOT,
        group="g",
        job="a",
        backend="noop",
        params={},
        started=1.0,
        deadline=31.0,
        status=OpStatus.FAILED,
        finished=1.5,
        error=LONG,
    )
    faulted = Job(
        group="g",
        job="a",
        backend="noop",
        config={},
        claims=[],
        state=JobState.FAULTED,
        since=1.5,
        fault=LONG,
        operation="op-7",
    )
    report = SwitchReport(
        steps=[
            SwitchStep(job="a", kind=OpKind.SNAPSHOT, op=failed),
            SwitchStep(job="b", kind=OpKind.RESTORE, op=None, error=LONG, refused=True),
        ],
        restored=False,
        next_state=None,
        faulted=[faulted],
    )
    data = switch_group_reply(report, "n1", [faulted], 9, lambda job: Liveness.ALIVE)
    answer = decode_strict(pb.SwitchGroupResponse, data)  # refused if any text is over
    for text in (answer.steps[0].error, answer.steps[1].error, answer.faulted[0].fault):
        assert text is not None
        assert 0 < len(text.encode()) <= MAX_TEXT_BYTES
        assert text.startswith("éé") and text.endswith("...")
    assert answer.steps[0].status == pb.OperationStatus.FAILED
    assert answer.steps[1].refused
