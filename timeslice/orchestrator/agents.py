"""The orchestrator's view of the agents on its groups' nodes.

A group names the agents of the nodes it spans (`OrchestratorConfig.group_nodes`).
`GetGroupStatus` reports what each of them says of the group's jobs, and the
group as STATE_UNKNOWN when one of them cannot be reached.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from timeslice.client.agent import AsyncSnapshotAgentClient
from timeslice.client.agent_types import StatusResponse

# How long a status question to one agent may take before it counts as unreachable.
STATUS_TIMEOUT = 1.0


@dataclass(frozen=True)
class AgentJobView:
    """One agent's word on one job: its state as named on the wire ("SAVED", ...)."""

    agent: str
    job: str
    state: str


class AgentDirectory:
    """One client per agent address, made when first needed."""

    def __init__(self, timeout: float = STATUS_TIMEOUT) -> None:
        self.timeout = timeout
        self._clients: dict[str, AsyncSnapshotAgentClient] = {}

    def client(self, address: str) -> AsyncSnapshotAgentClient:
        """The client of the agent at `address`."""
        client = self._clients.get(address)
        if client is None:
            client = AsyncSnapshotAgentClient(
                address, call_timeout_sec=self.timeout, reconnect_timeout_sec=0
            )
            self._clients[address] = client
        return client

    async def job_states(
        self, group: str, addresses: Sequence[str]
    ) -> tuple[list[AgentJobView], bool]:
        """What every agent says of `group`'s jobs, and whether every agent answered."""
        answers = await asyncio.gather(
            *(self.client(a).status(timeout_sec=self.timeout) for a in addresses),
            return_exceptions=True,
        )
        views: list[AgentJobView] = []
        for address, answer in zip(addresses, answers, strict=True):
            if isinstance(answer, StatusResponse):
                agent = answer.node_name or address
                views += [
                    AgentJobView(agent, job.job_id, job.state.removeprefix("JOB_STATE_"))
                    for job in answer.job_statuses
                    if job.group in (group, "")
                ]
        return views, all(isinstance(a, StatusResponse) for a in answers)

    async def close(self) -> None:
        clients, self._clients = self._clients, {}
        await asyncio.gather(*(c.close() for c in clients.values()), return_exceptions=True)
