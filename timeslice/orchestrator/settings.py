"""What operators and agents set, as the lock table keeps it: hold limits and
queue policies per group, the nodes each group spans, where each node's agent is
reached, the backend each job's contexts need and the principal that registered it.

`Settings.handle` applies the five setting events (checking them first, so that
a refused one changes nothing); the lock table reads the result when it grants
and when it arms a holder's deadlines. Pure: no clock, no I/O.
"""

from __future__ import annotations

from copy import deepcopy
from typing import Any, TypeVar

from timeslice.errors import InvalidArgumentError
from timeslice.ids import check_id, check_node, parse_target
from timeslice.orchestrator import events as ev
from timeslice.orchestrator.events import EVERY_GROUP
from timeslice.orchestrator.model import GroupPolicy, HoldLimit

_V = TypeVar("_V")

SettingEvent = (
    ev.SetHoldLimit | ev.SetPolicy | ev.SetGroupNodes | ev.RegisterAgent | ev.SetJobBackend
)


class Settings:
    """Every setting the table holds; `EVERY_GROUP`'s limit and policy hold for the
    groups that have none of their own."""

    def __init__(self) -> None:
        self.hold_limits: dict[str, HoldLimit] = {}
        self.policies: dict[str, GroupPolicy] = {}
        # The nodes each group spans, and where each node's agent is reached.
        self.nodes: dict[str, tuple[str, ...]] = {}
        self.agents: dict[str, str] = {}
        # Per group, job and node ("" every node): the backend config the job registered.
        self.job_backends: dict[str, dict[str, dict[str, dict[str, Any]]]] = {}
        # The same keys: the principal that registered each one, when it had one.
        self.job_registrants: dict[str, dict[str, dict[str, str]]] = {}

    def handle(self, e: SettingEvent) -> None:
        """Apply one setting; raise (changing nothing) if it is not valid."""
        match e:
            case ev.SetHoldLimit():
                self._set_hold_limit(e)
            case ev.SetPolicy():
                self._set_policy(e)
            case ev.SetGroupNodes():
                self._set_group_nodes(e)
            case ev.RegisterAgent():
                check_node(e.node)
                parse_target(e.address)
                self.agents[e.node] = e.address
            case ev.SetJobBackend():
                self._set_job_backend(e)

    def hold_limit_of(self, group: str) -> HoldLimit:
        """`group`'s hold limit and grace."""
        return self.hold_limits.get(group) or self.hold_limits.get(EVERY_GROUP) or HoldLimit()

    def policy(self, group: str) -> GroupPolicy:
        """How `group` picks its next holder, and the priority aging it uses."""
        return self.policies.get(group) or self.policies.get(EVERY_GROUP) or GroupPolicy()

    def _set_hold_limit(self, e: ev.SetHoldLimit) -> None:
        if e.max_hold is not None and e.max_hold <= 0:
            raise InvalidArgumentError("a hold limit must be positive")
        if not e.grace >= 0:
            raise InvalidArgumentError("a hold limit's grace must not be negative")
        self.hold_limits[e.group] = HoldLimit(max_hold=e.max_hold, grace=e.grace)

    def _set_policy(self, e: ev.SetPolicy) -> None:
        if e.policy not in list(ev.Policy):
            raise InvalidArgumentError(
                f"unknown policy {e.policy!r}; expected one of {', '.join(ev.Policy)}"
            )
        if not e.aging > 0:
            raise InvalidArgumentError("priority aging must be a positive number of seconds")
        self.policies[e.group] = GroupPolicy(kind=ev.Policy(e.policy), aging=e.aging)

    def _set_group_nodes(self, e: ev.SetGroupNodes) -> None:
        check_id("group_id", e.group)
        for node in e.nodes:
            check_node(node)
        if len(set(e.nodes)) != len(e.nodes):
            raise InvalidArgumentError(f"group {e.group} names a node twice: {list(e.nodes)}")
        if e.nodes:
            self.nodes[e.group] = tuple(e.nodes)
        else:
            self.nodes.pop(e.group, None)

    def _set_job_backend(self, e: ev.SetJobBackend) -> None:
        check_id("group_id", e.group)
        check_id("job_id", e.job)
        if e.node:
            check_node(e.node)
        if e.by:
            check_id("by", e.by)
        _put(
            self.job_backends,
            e.group,
            e.job,
            e.node,
            None if e.backend is None else dict(e.backend),
        )
        _put(self.job_registrants, e.group, e.job, e.node, e.by if e.backend is not None else "")

    def registrant(self, group: str, job: str, node: str) -> str:
        """The principal that registered the backend `job` has on `node` ("" none)."""
        return self.job_registrants.get(group, {}).get(job, {}).get(node, "")

    def to_dict(self) -> dict[str, Any]:
        """The settings' part of the table's snapshot."""
        return {
            "hold_limits": {name: h.max_hold for name, h in self.hold_limits.items()},
            "hold_graces": {name: h.grace for name, h in self.hold_limits.items()},
            "policies": {name: [str(p.kind), p.aging] for name, p in self.policies.items()},
            "nodes": {name: list(nodes) for name, nodes in self.nodes.items()},
            "agents": dict(self.agents),
            "job_backends": deepcopy(self.job_backends),
            "job_registrants": deepcopy(self.job_registrants),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Settings:
        """The inverse of `to_dict` (of a table's whole snapshot, read for its settings)."""
        settings = cls()
        graces = data.get("hold_graces", {})
        settings.hold_limits = {
            name: HoldLimit(max_hold=limit, grace=graces.get(name, 0.0))
            for name, limit in data["hold_limits"].items()
        }
        settings.policies = {
            name: GroupPolicy(kind=ev.Policy(p), aging=a)
            for name, (p, a) in data.get("policies", {}).items()
        }
        settings.nodes = {name: tuple(nodes) for name, nodes in data.get("nodes", {}).items()}
        settings.agents = dict(data.get("agents", {}))
        settings.job_backends = deepcopy(data.get("job_backends", {}))
        settings.job_registrants = deepcopy(data.get("job_registrants", {}))
        return settings


def _put(
    table: dict[str, dict[str, dict[str, _V]]], group: str, job: str, node: str, value: _V | None
) -> None:
    """Set (None or "": remove) `table[group][job][node]`, dropping what is left empty."""
    jobs = table.setdefault(group, {})
    per_node = jobs.setdefault(job, {})
    if value is None or value == "":
        per_node.pop(node, None)
    else:
        per_node[node] = value
    if not per_node:
        del jobs[job]
    if not jobs:
        del table[group]
