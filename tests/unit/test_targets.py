"""Several orchestrator addresses in one target, which one a client tries next, and
the active's address a standby's refusal carries (`timeslice.targets`)."""

from __future__ import annotations

import pytest

from timeslice.errors import InvalidArgumentError
from timeslice.ids import Target
from timeslice.orchestrator.config import OrchestratorConfig
from timeslice.orchestrator.leadership import MAX_LEADER_LEASE, MIN_LEADER_LEASE
from timeslice.targets import (
    MAX_LEASE_MS,
    MAX_TARGETS,
    MIN_LEASE_MS,
    Endpoint,
    active_from_metadata,
    lease_from_metadata,
    format_target,
    is_wildcard,
    next_candidate,
    parse_targets,
    shun_seconds,
)

A = Target(host="h1", port=50051)
B = Target(host="h2", port=50052)


def test_one_target_or_several_separated_by_commas() -> None:
    assert parse_targets("h1:50051") == (A,)
    assert parse_targets("h1:50051, h2:50052") == (A, B)
    assert parse_targets("h1:50051,h1:50051,h2:50052") == (A, B)  # once each
    assert parse_targets("[::1]:1,unix:/run/o.sock") == (
        Target(host="::1", port=1),
        Target(path="/run/o.sock"),
    )


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("h1:50051,", "an empty address"),
        (",h1:50051", "an empty address"),
        ("h1:50051,,h2:1", "an empty address"),
        ("h1:50051,h2", "expected 'host:port'"),
        ("h1:50051,h2:0", "not in 1..65535"),
        (",".join(f"h{i}:1" for i in range(MAX_TARGETS + 1)), f"at most {MAX_TARGETS}"),
        ("h:1," * 2000, "longer than"),
    ],
)
def test_a_bad_list_is_refused_in_one_line(text: str, says: str) -> None:
    with pytest.raises(InvalidArgumentError) as error:
        parse_targets(text)
    assert says in error.value.message
    assert "\n" not in error.value.message and len(error.value.message) < 300


def test_sixteen_addresses_are_allowed() -> None:
    assert len(parse_targets(",".join(f"h{i}:1" for i in range(MAX_TARGETS)))) == MAX_TARGETS


def test_a_target_reads_back_as_written() -> None:
    for text in ("h1:50051", "[::1]:7", "unix:/run/o.sock", "10.0.0.1:1"):
        (target,) = parse_targets(text)
        assert format_target(target) == text


def endpoints(*targets: Target) -> list[Endpoint]:
    return [Endpoint(dial=t, given=t) for t in targets]


def test_the_next_candidate_goes_round_the_list() -> None:
    three = endpoints(A, B, Target(host="h3", port=1))
    assert next_candidate(three, None, None) == 0
    assert [next_candidate(three, i, None) for i in range(3)] == [1, 2, 0]
    assert next_candidate(endpoints(A), 0, None) == 0


def test_a_redirect_to_a_candidate_goes_there_next() -> None:
    three = endpoints(A, B, Target(host="h3", port=1))
    assert next_candidate(three, 0, Target(host="h3", port=1)) == 2
    assert next_candidate(three, 2, A) == 0


def test_a_redirect_elsewhere_or_to_itself_is_ignored() -> None:
    three = endpoints(A, B, Target(host="h3", port=1))
    assert next_candidate(three, 0, Target(host="evil", port=443)) == 1
    assert next_candidate(three, 1, B) == 2  # a standby naming itself
    assert next_candidate(three, 0, Target(host="h2", port=9)) == 1  # another port


def test_a_redirect_to_a_candidate_given_up_on_a_moment_ago_is_not_followed() -> None:
    # The client left A (frozen); a standby still names A until A's lease runs out.
    three = endpoints(A, B, Target(host="h3", port=1))
    assert next_candidate(three, 1, A, shunned={A}) == 2  # down the list instead
    assert next_candidate(three, 1, A, shunned={Target(host="h3", port=1)}) == 0
    # Going round, a candidate given up on is passed over while another is left.
    assert next_candidate(three, 2, None, shunned={A}) == 1
    assert next_candidate(three, 1, None, shunned={A, Target(host="h3", port=1)}) == 1
    assert next_candidate(three, 0, None, shunned={A, B, Target(host="h3", port=1)}) == 1


def test_a_redirect_matches_a_resolved_address_or_the_name_given() -> None:
    name = Target(host="orch.svc", port=50051)
    resolved = [
        Endpoint(dial=Target(host="10.0.0.1", port=50051), given=name),
        Endpoint(dial=Target(host="10.0.0.2", port=50051), given=name),
    ]
    assert next_candidate(resolved, 0, Target(host="10.0.0.2", port=50051)) == 1
    assert next_candidate(resolved, 1, Target(host="10.0.0.1", port=50051)) == 0


def test_the_active_from_a_refusals_metadata() -> None:
    assert active_from_metadata(["h2:50052"]) == B
    assert active_from_metadata(["h2:50052", "h1:50051"]) == B  # the first only
    assert active_from_metadata(["[::1]:9"]) == Target(host="::1", port=9)


@pytest.mark.parametrize(
    "values",
    [[], [""], ["h2"], ["unix:/tmp/x.sock"], ["h1:1,h2:2"], ["h" * 400 + ":1"], [b"h2:1"]],
)
def test_a_bad_or_missing_active_is_no_redirect(values: list[object]) -> None:
    assert active_from_metadata(values) is None


def test_wildcards_name_nobody() -> None:
    assert is_wildcard("0.0.0.0") and is_wildcard("::") and is_wildcard("")
    assert not is_wildcard("127.0.0.1") and not is_wildcard("orch.svc")


@pytest.mark.parametrize("bad", ["h1:1,h2:2", "unix:/run/o.sock", "h1", "h" * 400 + ":1"])
def test_advertise_must_be_one_host_and_port(bad: str) -> None:
    with pytest.raises(InvalidArgumentError):
        OrchestratorConfig(advertise=bad)
    assert OrchestratorConfig(advertise="orch-0.orch:50051").advertise == "orch-0.orch:50051"


def test_the_leader_lease_from_a_refusals_metadata() -> None:
    assert lease_from_metadata(["5000"]) == 5.0
    assert lease_from_metadata(["300", "9000"]) == 0.3  # the first only
    assert lease_from_metadata([]) is None


def test_the_leases_heard_are_those_an_orchestrator_takes() -> None:
    assert (MIN_LEASE_MS / 1000, MAX_LEASE_MS / 1000) == (MIN_LEADER_LEASE, MAX_LEADER_LEASE)


@pytest.mark.parametrize(
    "values", [[""], ["99"], ["3600001"], ["-5"], ["1e3"], ["５００"], ["9" * 400], [b"500"]]
)
def test_a_bad_leader_lease_is_not_heard(values: list[object]) -> None:
    assert lease_from_metadata(values) is None


def test_a_candidate_given_up_on_is_passed_over_while_a_standby_may_name_it() -> None:
    assert shun_seconds(None, 5.0) == 5.0  # no word of the lease: the longest
    assert shun_seconds(0.3, 5.0) == pytest.approx(0.4)  # a lease and a third
    assert shun_seconds(30.0, 5.0) == 5.0  # never longer than the longest
