"""Grants bound to the principal that acquired them, and leases whose ids carry a
secret: a Yield, KeepAlive or Acquire of the same job id by another principal is
refused and changes nothing; what anyone may see of a lease lacks its secret;
journals and snapshots written before either existed still load."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.unit.test_state import Harness
from timeslice.errors import LeaseLostError, PermissionDeniedError
from timeslice.orchestrator import events as ev
from timeslice.orchestrator.model import owned_by
from timeslice.orchestrator.state import LockTable


@pytest.fixture
def t() -> Harness:
    return Harness()


def acquire(job: str, principal: str, secret: str, group: str = "g", **kw: Any) -> ev.Acquire:
    kw.setdefault("call_id", f"call-{job}-{principal}")
    return ev.Acquire(
        now=kw.pop("now", 0.0),
        group=group,
        job=job,
        principal=principal,
        lease_secret=secret,
        **kw,
    )


def test_the_lease_id_carries_the_secret_and_what_others_see_does_not(t: Harness) -> None:
    [granted] = t.handle(acquire("alice", "p-alice", "s3cr3t", lease_ttl=10.0))
    assert isinstance(granted, ev.Granted)
    assert granted.lease.lease_id == "lease-1-s3cr3t"
    h = t.table.groups["g"].holder
    assert h is not None and (h.principal, h.lease_secret) == ("p-alice", "s3cr3t")
    assert h.shown_lease == ev.LeaseInfo(lease_id="lease-1", ttl=10.0, expires_at=10.0)
    # the token alone (what a status shows) renews nothing
    t.refuse(ev.KeepAlive(now=1, group="g", job="alice", lease_id="lease-1"), LeaseLostError)
    [renewed] = t.handle(ev.KeepAlive(now=1, group="g", job="alice", lease_id="lease-1-s3cr3t"))
    assert isinstance(renewed, ev.LeaseRenewed) and renewed.lease.expires_at == 11.0


def test_a_refused_lease_is_not_repeated_in_the_error(t: Harness) -> None:
    t.handle(acquire("alice", "p-alice", "s3cr3t"))
    error = t.refuse(
        ev.KeepAlive(now=1, group="g", job="alice", lease_id="lease-1-guess"), LeaseLostError
    )
    assert "guess" not in str(error) and "s3cr3t" not in str(error)


def test_another_principal_may_not_yield_renew_or_take_the_grant_again(t: Harness) -> None:
    t.handle(acquire("alice", "p-alice", "s3cr3t"))
    for event in [
        ev.Yield(now=1, group="g", job="alice", principal="p-twin"),
        ev.Yield(now=1, group="g", job="alice", token=1, principal="p-twin"),  # a known token
        ev.KeepAlive(now=1, group="g", job="alice", lease_id="lease-1-s3cr3t", principal="p-twin"),
        acquire("alice", "p-twin", "other", request_id="new-request"),
    ]:
        error = t.refuse(event, PermissionDeniedError)
        assert "another principal" in str(error) and "p-alice" not in str(error)
    assert t.holder() == "alice"
    # its own principal may, with the same lease as before
    [superseded, again] = t.handle(
        acquire("alice", "p-alice", "fresh", call_id="call-2", request_id="r2")
    )
    assert isinstance(superseded, ev.Superseded)
    assert isinstance(again, ev.Granted) and again.lease.lease_id == "lease-1-s3cr3t"
    [answer, *_] = t.handle(ev.Yield(now=2, group="g", job="alice", principal="p-alice"))
    assert isinstance(answer, ev.Yielded)


def test_a_place_in_the_queue_is_bound_too_and_the_grant_it_gets(t: Harness) -> None:
    t.handle(acquire("alice", "p-alice", "sa"))
    [queued] = t.handle(acquire("bob", "p-bob", "sb"))
    assert isinstance(queued, ev.Queued)
    # another principal acting as bob cannot take its place (nor fail its call)
    t.refuse(acquire("bob", "p-twin", "st", call_id="call-twin"), PermissionDeniedError)
    [*_, grant] = t.handle(ev.Yield(now=1, group="g", job="alice", principal="p-alice"))
    assert isinstance(grant, ev.Granted) and grant.lease.lease_id == "lease-2-sb"
    h = t.table.groups["g"].holder
    assert h is not None and h.principal == "p-bob"
    t.refuse(ev.Yield(now=2, group="g", job="bob", principal="p-twin"), PermissionDeniedError)


def test_unnamed_callers_are_bound_by_nobody_and_bind_nobody(t: Harness) -> None:
    """No auth policy (every caller unnamed) behaves as before; trusted in-process
    code (unnamed) may act on a named grant; a grant made unnamed is bound to the
    first principal that takes it again."""
    assert owned_by("", "p") and owned_by("p", "") and owned_by("p", "p")
    assert not owned_by("p", "q")
    t.handle(acquire("alice", "", "s"))
    t.handle(acquire("alice", "p-alice", "s2", call_id="call-2"))
    h = t.table.groups["g"].holder
    assert h is not None and h.principal == "p-alice"
    t.refuse(ev.Yield(now=1, group="g", job="alice", principal="p-twin"), PermissionDeniedError)
    t.yield_("alice", now=1)  # unnamed: trusted


def test_a_bundle_is_bound_on_every_group(t: Harness) -> None:
    t.handle(acquire("alice", "p-alice", "s", more_groups=("h",)))
    t.refuse(
        acquire("alice", "p-twin", "x", more_groups=("h",), call_id="c2"), PermissionDeniedError
    )
    t.refuse(ev.Yield(now=1, group="h", job="alice", principal="p-twin"), PermissionDeniedError)


def test_binding_and_secret_survive_a_restart_and_a_snapshot(t: Harness) -> None:
    t.handle(acquire("alice", "p-alice", "sa"))
    t.handle(acquire("bob", "p-bob", "sb"))
    t.handle(ev.Recover(now=5, grace=10.0))
    table = LockTable.from_dict(json.loads(json.dumps(t.table.to_dict())))
    again = Harness(table)
    again.refuse(
        ev.KeepAlive(now=6, group="g", job="alice", lease_id="lease-1-sa", principal="p-twin"),
        PermissionDeniedError,
    )
    again.handle(ev.KeepAlive(now=6, group="g", job="alice", lease_id="lease-1-sa"))
    # bob comes back after the restart with a new call (and a new secret)
    again.handle(acquire("bob", "p-bob", "sb2", call_id="call-bob-1.1"))
    again.refuse(acquire("bob", "p-twin", "x", call_id="c3"), PermissionDeniedError)
    [*_, grant] = again.handle(ev.Yield(now=7, group="g", job="alice", principal="p-alice"))
    assert isinstance(grant, ev.Granted) and grant.lease.lease_id == "lease-2-sb2"


def test_a_journal_from_before_principals_and_secrets_folds() -> None:
    """Events journaled without `principal` and `lease_secret` read as unnamed and
    secretless: the grant's lease id is the old `lease-<token>`."""
    old = [
        {"kind": "Acquire", "now": 0.0, "group": "g", "job": "a", "call_id": "0.1",
         "request_id": "", "lease_ttl": 5.0, "wait_deadline": None, "priority": 0,
         "more_groups": []},
        {"kind": "Acquire", "now": 1.0, "group": "g", "job": "b", "call_id": "0.2",
         "request_id": "", "lease_ttl": None, "wait_deadline": None, "priority": 0,
         "more_groups": []},
        {"kind": "Yield", "now": 2.0, "group": "g", "job": "a", "request_id": "", "token": 1},
    ]  # fmt: skip
    table = LockTable()
    for data in old:
        table.handle(ev.event_from_dict(data))
        table.validate()
    h = table.groups["g"].holder
    assert h is not None and (h.job, h.principal, h.lease_secret) == ("b", "", "")
    assert h.lease.lease_id == "lease-2"
    # anyone who may act as b may renew it, as before
    table.handle(ev.KeepAlive(now=3, group="g", job="b", lease_id="lease-2", principal="p"))


def test_a_snapshot_from_before_principals_and_secrets_loads() -> None:
    table = LockTable()
    table.handle(ev.Acquire(now=0, group="g", job="a", call_id="0.1"))
    table.handle(ev.Acquire(now=0, group="g", job="b", call_id="0.2"))
    data = json.loads(json.dumps(table.to_dict()))
    [group] = data["groups"]
    for record in [group["holder"], *group["queue"]]:
        del record["principal"], record["lease_secret"]
    loaded = LockTable.from_dict(data)
    loaded.validate()
    h = loaded.groups["g"].holder
    assert h is not None and h.lease.lease_id == "lease-1" and h.principal == ""
    assert loaded.groups["g"].queue["b"].principal == ""


def test_new_fields_round_trip_through_the_journal_form() -> None:
    for event in [
        acquire("a", "p-a", "s", request_id="r"),
        ev.Yield(now=1, group="g", job="a", principal="p-a"),
        ev.KeepAlive(now=1, group="g", job="a", lease_id="lease-1-s", principal="p-a"),
    ]:
        assert ev.event_from_dict(json.loads(json.dumps(ev.event_to_dict(event)))) == event
