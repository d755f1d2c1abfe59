"""Agents joining groups, and what they see of each holder's workload.

An agent in session reports its node, its address, the groups it serves and the
liveness of its jobs' workloads. What of that the table must remember is handed
to it as events (a new agent's address, a node joining a group); the liveness
stays in the `AgentDirectory`, and is handed to the table as `WorkloadSeen`
whenever it may end a grant: the table decides whether the holder is gone.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from timeslice.errors import InvalidArgumentError
from timeslice.fencing import KEY_BYTES
from timeslice.ids import check_node, parse_target
from timeslice.kinds import Liveness
from timeslice.orchestrator import events as ev
from timeslice.orchestrator.agents import AgentDirectory, KnownAgent
from timeslice.orchestrator.handoff import Journaled


class Membership:
    """Which agents serve which groups, kept in the table as agents report."""

    def __init__(
        self, journaled: Journaled, agents: AgentDirectory, serving: Callable[[], bool]
    ) -> None:
        self._journaled = journaled
        self._agents = agents
        self._serving = serving

    def reported(
        self,
        session: object,
        node: str,
        address: str,
        groups: list[str],
        liveness: dict[tuple[str, str], Liveness],
        accelerators: dict[str, int] | None = None,
        token_key: bytes = b"",
        states: tuple[int, list[tuple[str, str, str]]] | None = None,
    ) -> None:
        """An agent in session reported: register it (journaled when new), join the
        groups it names, and tell the table what it sees of each holder's workload.
        `token_key`: what the switches sent to it prove their tokens with; `states`:
        its job table's version and (group, job, state) of every job."""
        check_node(node)
        parse_target(address)
        if token_key and len(token_key) != KEY_BYTES:
            raise InvalidArgumentError(f"a token key has {KEY_BYTES} bytes")
        table, apply = self._journaled.table, self._journaled.apply
        now = time.time()
        if table.agents.get(node) != address:
            apply(ev.RegisterAgent(now=now, node=node, address=address))
        for group in groups:
            known = table.nodes.get(group, ())
            if node not in known:
                apply(ev.SetGroupNodes(now=now, group=group, nodes=(*known, node)))
        self._agents.reported(
            session, node, address, liveness, accelerators or {}, token_key, states
        )
        for group, nodes in table.nodes.items():
            if node in nodes or address in nodes:
                self.check_holder(group)

    def left(self, session: object, node: str, closed: bool = False) -> None:
        """An agent's session ended (`closed`: by either side, not broken off)."""
        self._agents.left(session, node, closed)

    def check_holder(self, group: str) -> None:
        """Tell the table what the agents of `group`'s nodes see of its holder's
        workload (it revokes a holder whose workload is gone everywhere)."""
        table = self._journaled.table
        g = table.groups.get(group)
        h = g.holder if g is not None else None
        if h is None or h.switching or not self._serving():
            return
        nodes = table.nodes.get(group, ())
        seen = tuple(self._agents.liveness(node, group, h.job) for node in nodes)
        if Liveness.GONE in seen:
            self._journaled.apply(
                ev.WorkloadSeen(now=time.time(), group=group, job=h.job, seen=seen)
            )

    def group_agents(self, group: str) -> list[tuple[str, str | None]]:
        """(node, address or None) for every node of `group`."""
        table = self._journaled.table
        nodes = table.nodes.get(group, ())
        return [(node, self._agents.address(node, table.agents)) for node in nodes]

    def known_agents(self) -> list[KnownAgent]:
        """Every agent known: registered (journaled), in session now, or named by a
        group's nodes; a group node that is the address of a named agent counts as
        that agent. Sorted by node."""
        table, agents = self._journaled.table, self._agents
        groups: dict[str, list[str]] = {node: [] for node in (*table.agents, *agents.addresses)}
        named = {self._agents.address(n, table.agents): n for n in groups}
        for group, nodes in table.nodes.items():
            for node in nodes:
                groups.setdefault(named.get(node, node), []).append(group)
        return [
            KnownAgent(
                node=node,
                address=agents.address(node, table.agents),
                in_session=agents.in_session(node),
                groups=tuple(sorted(set(member_of))),
            )
            for node, member_of in sorted(groups.items())
        ]
