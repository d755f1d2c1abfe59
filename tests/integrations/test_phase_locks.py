"""`PhaseLocks`, the plugins' shared core: a phase's groups acquired in one atomic
call, idempotent holding, no wait while holding, and what a lost lease does at a
phase's end."""

from __future__ import annotations

import pytest
from plugin_fakes import RecordingClient

from timeslice.errors import ConflictError, InvalidArgumentError, LeaseLostError
from timeslice.integrations._locks import MAX_PHASE_GROUPS, PhaseLocks

pytestmark = pytest.mark.timeout(10)


def locks() -> tuple[PhaseLocks, RecordingClient]:
    client = RecordingClient()
    return PhaseLocks(client, job_id="job-a"), client


def test_a_phase_acquires_all_its_groups_in_one_call_and_yields_them_last_first() -> None:
    phases, client = locks()
    phases.begin("weight_sync", ["trainer", "sampler"])
    assert client.calls == [("acquire", ("trainer", "sampler"))]
    assert phases.held == {"trainer", "sampler"}
    phases.end("weight_sync")
    assert client.calls[1:] == [("release", "sampler"), ("release", "trainer")]
    assert phases.held == frozenset() and phases.open_phases == {}


def test_holding_is_idempotent_and_a_group_stays_while_an_open_phase_needs_it() -> None:
    phases, client = locks()
    phases.begin("update", ["gpus"])
    phases.begin("sample", ["gpus"])  # held already: nothing sent
    assert client.calls == [("acquire", ("gpus",))]
    phases.end("update")
    assert phases.held == {"gpus"}, "the sample phase still needs it"
    phases.end("sample")
    assert client.calls == [("acquire", ("gpus",)), ("release", "gpus")]


def test_a_phase_that_would_wait_while_the_job_holds_a_group_is_refused() -> None:
    phases, client = locks()
    phases.begin("train", ["trainer"])
    for more in (["sampler"], ["trainer", "sampler"]):
        with pytest.raises(ConflictError, match="while it holds"):
            phases.begin("generate", more)
    assert client.calls == [("acquire", ("trainer",))], "nothing more was sent"
    assert phases.open_phases == {"train": ("trainer",)}
    phases.end("train")
    phases.begin("generate", ["sampler"])  # fine once nothing is held


def test_an_overlapping_phase_whose_groups_are_held_waits_for_nothing() -> None:
    phases, client = locks()
    phases.begin("train", ["trainer", "sampler"])
    phases.begin("generate", ["sampler"])
    phases.end("train")
    assert phases.held == {"sampler"}
    phases.end("generate")
    assert client.calls == [
        ("acquire", ("trainer", "sampler")),
        ("release", "trainer"),
        ("release", "sampler"),
    ]


def test_a_phase_ended_without_beginning_releases_nothing() -> None:
    phases, client = locks()
    phases.end("train")
    assert client.calls == []


def test_a_lost_lease_is_raised_at_the_phase_end_after_every_group_is_released() -> None:
    phases, client = locks()
    phases.begin("init", ["trainer", "sampler"])
    client.lost.add("trainer")
    client.refuse_release.add("sampler")
    with pytest.raises(LeaseLostError, match=r"\['sampler', 'trainer'\]"):
        phases.end("init")
    assert phases.held == frozenset()
    assert [c for c, _ in client.calls].count("release") == 2


def test_holding_releases_only_what_the_block_acquired() -> None:
    phases, client = locks()
    with phases.holding(["trainer", "sampler"]):
        assert phases.held == {"trainer", "sampler"}
    assert phases.held == frozenset()
    phases.acquire(["trainer"])
    with phases.holding(["trainer"]) as result:
        assert result is None  # held already: nothing sent
    assert phases.held == {"trainer"}
    assert client.calls[-1] == ("acquire", ("trainer",))


def test_close_releases_everything_and_closes_the_client() -> None:
    phases, client = locks()
    phases.begin("init", ["trainer", "sampler"])
    client.lost.add("sampler")
    phases.close()  # a lost lease is logged, not raised
    assert phases.held == frozenset() and client.closed


@pytest.mark.parametrize(
    "groups",
    [[], "trainer", [""], ["a/b" * 200], [f"g{i}" for i in range(MAX_PHASE_GROUPS + 1)], [3]],
)
def test_bad_groups_are_refused_before_anything_is_sent(groups: object) -> None:
    phases, client = locks()
    with pytest.raises(InvalidArgumentError):
        phases.begin("p", groups)  # type: ignore[arg-type]
    assert client.calls == []


@pytest.mark.parametrize("phase", ["", "x" * 129, None])
def test_bad_phase_names_are_refused(phase: object) -> None:
    phases, client = locks()
    with pytest.raises(InvalidArgumentError):
        phases.begin(phase, ["trainer"])  # type: ignore[arg-type]
    assert client.calls == []


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(InvalidArgumentError):
        PhaseLocks(RecordingClient(), job_id="")
    with pytest.raises(InvalidArgumentError):
        PhaseLocks(RecordingClient(), job_id="a", acquire_timeout_sec=0)
