"""The leader-lease rule: an active renews every third of the lease and steps
down on a renewal that fails or finds another holder or epoch; a standby takes
over only an expired lease, with the next epoch. Against a simulated database
that applies the same conditional updates, in any interleaving: no two
candidates are ever active with one epoch, epochs never go back, and only the
holder of the newest epoch could append."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from timeslice.errors import InvalidArgumentError
from timeslice.orchestrator import leadership as ld
from timeslice.orchestrator.leadership import LeaseRow, Role, Standing


def row(epoch: int = 3, holder: str = "a", expires_at: float = 10.0, now: float = 5.0) -> LeaseRow:
    return LeaseRow(epoch=epoch, holder=holder, expires_at=expires_at, now=now)


def test_an_active_renews_every_third_of_the_lease() -> None:
    assert ld.renew_every(6.0) == 2.0


def test_a_renewal_waits_a_third_of_the_lease_and_a_retry_never_past_its_hold() -> None:
    assert ld.renewal_wait(now=1.0, held_until=10.0, lease=6.0, retry=False) == 2.0
    # the first try goes out even when the loop woke past the hold: the database says
    assert ld.renewal_wait(now=11.0, held_until=10.0, lease=6.0, retry=False) == 2.0
    # a failed renewal is tried again only while the lease holds by our own clock
    assert ld.renewal_wait(now=1.0, held_until=10.0, lease=6.0, retry=True) == 2.0
    assert ld.renewal_wait(now=9.5, held_until=10.0, lease=6.0, retry=True) == 0.5
    assert ld.renewal_wait(now=9.995, held_until=10.0, lease=6.0, retry=True) is None
    assert ld.renewal_wait(now=11.0, held_until=10.0, lease=6.0, retry=True) is None


def test_a_lease_length_out_of_bounds_is_refused() -> None:
    assert ld.check_lease(0.6) == 0.6
    for bad in (0.0, -1.0, float("nan"), float("inf"), 1e9):
        with pytest.raises(InvalidArgumentError, match="leader lease must be between"):
            ld.check_lease(bad)


def test_a_standby_takes_over_only_an_expired_lease_with_the_next_epoch() -> None:
    assert ld.takeover_epoch(None) == 1
    assert ld.takeover_epoch(row(expires_at=10.0, now=5.0)) is None
    assert ld.takeover_epoch(row(expires_at=10.0, now=10.0)) is None  # strictly before now
    assert ld.takeover_epoch(row(expires_at=10.0, now=10.5)) == 4


def test_a_takeover_wins_only_if_the_row_names_us_and_our_epoch() -> None:
    assert ld.after_takeover(row(epoch=4, holder="b"), "b", 4) == Standing(
        role=Role.ACTIVE, epoch=4
    )
    assert ld.after_takeover(None, "b", 4) == ld.STANDBY
    assert ld.after_takeover(row(epoch=4, holder="c"), "b", 4) == ld.STANDBY
    assert ld.after_takeover(row(epoch=5, holder="b"), "b", 4) == ld.STANDBY


def test_an_active_steps_down_on_a_failed_renewal_another_holder_or_a_higher_epoch() -> None:
    active = Standing(role=Role.ACTIVE, epoch=3)
    assert ld.after_renewal(active, row(epoch=3, holder="a"), "a") == active
    failed = ld.after_renewal(active, None, "a")
    assert failed.role is Role.STEPPED_DOWN and "could not be renewed" in failed.why
    other = ld.after_renewal(active, row(epoch=3, holder="b"), "a")
    assert other.role is Role.STEPPED_DOWN and "epoch 3" in other.why
    newer = ld.after_renewal(active, row(epoch=4, holder="a"), "a")
    assert newer.role is Role.STEPPED_DOWN and "epoch 4" in newer.why
    # once deposed, for good: a renewal that would match cannot bring it back
    assert ld.after_renewal(failed, row(epoch=3, holder="a"), "a") == failed
    assert ld.step_down(failed, "again") == failed
    assert ld.step_down(ld.STANDBY, "never active") == ld.STANDBY


class FakeDatabase:
    """One lease row, changed only by the two conditional updates the journal
    runs: a renewal (`WHERE epoch = :mine AND holder = :me`) and a takeover
    (`SET epoch = :next WHERE epoch = :next - 1 AND expires_at < now()`)."""

    def __init__(self, lease: float) -> None:
        self.lease, self.now = lease, 0.0
        self.row: LeaseRow | None = None

    def read(self) -> LeaseRow | None:
        if self.row is None:
            return None
        return LeaseRow(
            epoch=self.row.epoch,
            holder=self.row.holder,
            expires_at=self.row.expires_at,
            now=self.now,
        )

    def take_over(self, me: str, epoch: int) -> LeaseRow | None:
        current = self.read()
        if current is None and epoch != 1:
            return None
        if current is not None and (current.epoch != epoch - 1 or not ld.expired(current)):
            return None
        self.row = LeaseRow(epoch=epoch, holder=me, expires_at=self.now + self.lease, now=self.now)
        return self.row

    def renew(self, me: str, mine: int) -> LeaseRow | None:
        if self.row is None or self.row.epoch != mine or self.row.holder != me:
            return None
        self.row = LeaseRow(epoch=mine, holder=me, expires_at=self.now + self.lease, now=self.now)
        return self.row

    def may_append(self, mine: int) -> bool:
        return self.row is not None and self.row.epoch == mine


steps = st.lists(
    st.tuples(
        st.sampled_from(["tick", "try", "renew", "stale-try", "append"]),
        st.integers(0, 2),
        st.floats(0.0, 1.0),
    ),
    max_size=80,
)


@settings(max_examples=300, deadline=None)
@given(steps)
def test_no_two_candidates_are_ever_active_with_one_epoch(script: list) -> None:
    lease = 0.6
    db = FakeDatabase(lease)
    names = ["a", "b", "c"]
    standing = {name: ld.STANDBY for name in names}
    stale: dict[str, LeaseRow | None] = {name: None for name in names}  # what each read last
    won: dict[int, str] = {}
    highest = 0
    for action, who, amount in script:
        me = names[who]
        if action == "tick":
            db.now += amount
        elif action in ("try", "stale-try"):
            # a standby decides from a read (maybe an old one), the database re-checks
            seen = db.read() if action == "try" else stale[me]
            stale[me] = db.read()
            if standing[me].role is not Role.STANDBY:
                continue
            epoch = ld.takeover_epoch(seen)
            if epoch is None:
                continue
            written = db.take_over(me, epoch)
            now_standing = ld.after_takeover(written, me, epoch)
            if now_standing.role is Role.ACTIVE:
                assert now_standing.epoch not in won, "two candidates won one epoch"
                won[now_standing.epoch] = me
                assert now_standing.epoch > highest, "an epoch went back"
                highest = now_standing.epoch
            standing[me] = now_standing
        elif action == "renew":
            if standing[me].role is Role.ACTIVE:
                standing[me] = ld.after_renewal(standing[me], db.renew(me, standing[me].epoch), me)
                if standing[me].role is Role.ACTIVE:  # a renewal keeps only the true holder
                    assert db.row is not None and (db.row.epoch, db.row.holder) == (
                        standing[me].epoch,
                        me,
                    )
        elif action == "append":
            s = standing[me]
            if s.role is Role.ACTIVE and db.may_append(s.epoch):
                # only the newest epoch's holder ever appends
                assert s.epoch == highest and won[s.epoch] == me
        actives = [n for n in names if standing[n].role is Role.ACTIVE]
        assert len({standing[n].epoch for n in actives}) == len(actives)
        if db.row is not None:
            assert db.row.epoch == highest


def test_the_orchestrator_refuses_a_leader_lease_out_of_bounds() -> None:
    from timeslice.orchestrator.config import OrchestratorConfig

    assert OrchestratorConfig(leader_lease=0.6).leader_lease == 0.6
    with pytest.raises(InvalidArgumentError, match="leader lease must be between"):
        OrchestratorConfig(leader_lease=0)


def test_an_active_counts_on_its_lease_only_from_before_it_asked_and_not_all_of_it() -> None:
    # The database set the expiry after the statement was sent: at least a lease
    # from `sent`; the active counts on less, in case the clocks' rates differ.
    assert ld.held_until(100.0, 5.0) == pytest.approx(100.0 + 5.0 * ld.LOCAL_SHARE)
    assert 100.0 < ld.held_until(100.0, 5.0) < 105.0
    # A renewal every third of the lease always lands before the local hold ends.
    assert ld.renew_every(5.0) < 5.0 * ld.LOCAL_SHARE
