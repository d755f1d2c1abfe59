"""The lock table's invariants, checked after every test step (and by the
hypothesis state machines after every rule)."""

from __future__ import annotations

from collections.abc import Mapping

from timeslice.orchestrator.model import Group


def check_groups(groups: Mapping[str, Group]) -> None:
    """Raise AssertionError if an invariant of `groups` does not hold: at most one
    holder per group, never queued itself, holding the group's newest token, its
    context live (or being switched to); a job queued once per group, a bundle
    waiter queued in every group of its bundle with one ticket; a free group has
    nobody queued but bundle waiters it is kept for; one call in one place."""
    # call id -> (job, bundle) of every place the call is attached to
    calls: dict[str, list[tuple[str, tuple[str, ...]]]] = {}
    for name, g in groups.items():
        assert g.name == name, (name, g.name)
        assert g.token >= 0
        assert not set(g.queue) & set(g.quarantined), f"{name}: a quarantined job waits"
        for job, w in g.queue.items():
            assert w.job == job, (job, w.job)
            assert not w.bundle or name in w.bundle, f"{name}: {job}'s bundle {w.bundle}"
            for other in w.bundle:
                peer = groups[other].queue.get(job)
                assert peer is not None and peer.ticket == w.ticket, f"{job} not in {other}"
            calls.setdefault(w.call_id, []).append((job, w.bundle))
        h = g.holder
        if h is None:
            kept = any(w.bundle for w in g.queue.values())
            assert kept or not g.queue, f"{name}: waiters queued on a free group"
            continue
        assert h.job not in g.queue, f"{name}: holder {h.job} is also queued"
        assert h.token == g.token, f"{name}: holder token {h.token} is not {g.token}"
        assert h.job not in g.quarantined, f"{name}: quarantined {h.job} holds it"
        assert h.switching or not g.revoked_job, f"{name}: {h.job} holds, revoked set"
        if h.switching:
            assert g.active_job == h.job, f"{name}: switching to {h.job}, not active"
            assert g.loaded_job != h.job, f"{name}: switching to {h.job}, already loaded"
        else:
            assert g.active_job == g.loaded_job == h.job, f"{name}: holder's context not live"
        calls.setdefault(h.call_id, []).append((h.job, h.bundle))
    for call, places in calls.items():
        if call and len(places) > 1:
            job, bundle = places[0]
            assert bundle and set(places) == {(job, bundle)}, f"call {call} in {places}"
            assert len(places) <= len(bundle), f"call {call} in {places}"
