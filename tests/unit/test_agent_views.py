"""`NodeView` keeps, job by job, the word of the newest job-table version."""

from __future__ import annotations

from timeslice.api.gen.snapshot_agent import v1alpha1 as apb
from timeslice.api.gen.timeslice_orchestrator import v1alpha1 as opb
from timeslice.orchestrator.agent_views import NodeView
from timeslice.orchestrator.agents import state_name


def test_a_report_replaces_older_words_and_drops_jobs_it_no_longer_has() -> None:
    view = NodeView()
    view.report(3, [("g", "a", "RUNNING"), ("g", "b", "SAVED"), ("", "x", "IDLE")])
    view.report(5, [("g", "a", "SAVED")])
    assert view.states("g") == [("a", "SAVED")]


def test_an_older_report_arriving_late_changes_nothing_newer() -> None:
    view = NodeView()
    view.group("g", 9, [("a", "SAVED"), ("b", "RUNNING")])  # a switch's answer
    view.report(7, [("g", "a", "TRANSITIONING"), ("g", "b", "SAVED"), ("g", "c", "SAVED")])
    assert view.states("g") == [("a", "SAVED"), ("b", "RUNNING"), ("c", "SAVED")]
    view.report(10, [("g", "a", "SAVED"), ("g", "b", "RUNNING")])
    assert view.states("g") == [("a", "SAVED"), ("b", "RUNNING")]


def test_a_switch_answer_speaks_for_its_group_only() -> None:
    view = NodeView()
    view.report(1, [("g", "a", "RUNNING"), ("g", "gone", "SAVED"), ("h", "z", "RUNNING")])
    view.group("g", 4, [("a", "SAVED"), ("b", "RUNNING")])
    assert view.states("g") == [("a", "SAVED"), ("b", "RUNNING")]
    assert view.states("h") == [("z", "RUNNING")]
    view.group("g", 2, [("a", "RUNNING")])  # older than what is known: ignored
    assert view.states("g") == [("a", "SAVED"), ("b", "RUNNING")]


def test_one_job_s_word_counts_only_when_newer() -> None:
    view = NodeView()
    view.report(5, [("g", "a", "FAULTED")])
    view.job(("g", "a"), 4, "RUNNING")
    assert view.states("g") == [("a", "FAULTED")]
    view.job(("g", "a"), 6, "RUNNING")
    assert view.states("g") == [("a", "RUNNING")]


def test_jobs_of_no_group_show_in_every_group() -> None:
    view = NodeView()
    view.report(1, [("", "v1", "RUNNING"), ("g", "a", "SAVED"), ("h", "b", "SAVED")])
    assert view.states("g") == [("a", "SAVED"), ("v1", "RUNNING")]


def test_every_state_an_agent_may_name_is_one_a_status_shows() -> None:
    """GetGroupStatus shows each job by the name `state_name` gives its state: every
    one must be a state of the status message, a value unknown here included."""
    shown = set(opb.SnapshotAgentJobStateState.__members__)
    values = [*apb.JobState.betterproto_value_to_renamed_proto_names(), -1, 6, 99]
    assert {state_name(apb.JobState(v)) for v in values} <= shown
    assert state_name(apb.JobState.FAULTED) == "FAULTED"
    assert state_name(apb.JobState(99)) == "UNSPECIFIED"
