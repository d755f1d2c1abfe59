"""The workload channels the agent holds open: one per registered workload.

A workload that does its own offload (a vLLM engine, a trainer that moves its
tensors to pinned host memory, the host-memory workload) registers over the
`WorkloadChannel` stream and is then sent snapshot and restore commands, each
with an id, and answers each with a result. A stream that ends fails whatever
it still owed.

A channel belongs to whoever opened it (`owner`: a uid over the agent's Unix
socket, a principal over TCP). A newer registration of the same job by the same
owner replaces the older stream, which ends with ALREADY_EXISTS saying so; one
by another owner is refused (PERMISSION_DENIED) and the older stays.

A command not answered by its deadline (a frozen workload) leaves the channel
not knowing where the context is (`state` ""), for the workload may still carry
it out; its late answer, which no operation waits for any more, tells it again.
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass, field

from timeslice.agent.oplog import channel_closed, channel_opened
from timeslice.errors import (
    AlreadyExistsError,
    ConflictError,
    DeadlineExceededError,
    InternalError,
    InvalidArgumentError,
    PermissionDeniedError,
    UnavailableError,
)
from timeslice.kinds import SuspendMode


@dataclass(frozen=True)
class Capabilities:
    """What a workload said it supports when it registered."""

    supported_modes: tuple[str, ...] = ()  # empty: no validation
    default_mode: str = SuspendMode.OFFLOAD.value
    tags: tuple[str, ...] = ()
    # Where it keeps an offloaded context ("memory", "file"), in its words; "": not said.
    store: str = ""
    # It moves its context tag by tag (see `timeslice.agent.pipeline`).
    pipelined: bool = False

    def resolve_mode(self, requested: str) -> str:
        """The mode a snapshot command carries: never unspecified."""
        mode = requested or self.default_mode or SuspendMode.OFFLOAD.value
        if self.supported_modes and mode not in self.supported_modes:
            raise InvalidArgumentError(
                f"the workload supports {', '.join(self.supported_modes)}, not {mode}"
            )
        return mode


@dataclass(frozen=True)
class Command:
    """One command for a workload."""

    command_id: str
    kind: str  # "snapshot" or "restore"
    mode: str  # snapshot only
    tags: tuple[str, ...]
    deadline_ms: int


@dataclass(frozen=True)
class Result:
    """A workload's answer to a command."""

    command_id: str
    ok: bool
    error: str = ""
    storage_bytes: int | None = None
    device_bytes: int | None = None


@dataclass
class WorkloadChannel:
    """One registered workload's open stream."""

    group: str
    job: str
    capabilities: Capabilities
    # Where the workload's context is, as far as the channel knows: "" while a command
    # it was sent is past its deadline and unanswered.
    state: str = "RUNNING"
    outbox: asyncio.Queue[Command | None] = field(default_factory=asyncio.Queue)
    pending: dict[str, asyncio.Future[Result]] = field(default_factory=dict)
    closed: str = ""  # why, once closed
    # Whether it closed with a command in flight: its context was being moved.
    interrupted: bool = False
    # Commands given up on unanswered: id -> (kind, the state before the command).
    overdue: dict[str, tuple[str, str]] = field(default_factory=dict)
    failure: Exception | None = None  # the error the stream ends with, if the workload broke it
    # How its last snapshot went tag by tag, when it did (a pipelined workload):
    # each step's tags and the accelerator memory it freed, what its restore
    # brings back in the same steps; None: not known (nothing since it registered,
    # a snapshot of one step, or a restore since).
    steps: list[tuple[tuple[str, ...], int | None]] | None = None
    # Seconds its last snapshot in a switch took (None: none yet): one quicker than
    # `timeslice.backends.app_channel.STEPPED_SNAPSHOT_S` is not worth a command per tag.
    snapshot_seconds: float | None = None
    # Who opened it ("uid 1000", "principal trainer-a", "" anonymous), whether that
    # caller may replace anyone's channel (an operator), and the caller for logs.
    owner: str = ""
    owner_trusted: bool = False
    peer: str = ""

    async def run(self, command: Command, timeout: float) -> Result:
        """Send `command` and wait for its result."""
        if self.closed:
            raise UnavailableError(f"the workload channel of {self.job} is closed: {self.closed}")
        result: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        self.pending[command.command_id] = result
        self.outbox.put_nowait(command)
        try:
            return await asyncio.wait_for(result, timeout)
        except TimeoutError:
            raise DeadlineExceededError(
                f"{self.job} did not answer {command.kind} command {command.command_id} "
                f"within {timeout:.1f} s"
            ) from None
        finally:
            self.pending.pop(command.command_id, None)
            if result.cancelled():  # given up on (deadline, cancel), not answered
                self.overdue[command.command_id] = (command.kind, self.state)
                self.state = ""

    def deliver(self, result: Result) -> bool:
        """A result arrived on the stream; False if no command waits for it any more
        (it came after the command's deadline: then it says where the context is)."""
        waiting = self.pending.get(result.command_id)
        if waiting is None or waiting.done():
            if (overdue := self.overdue.pop(result.command_id, None)) is not None:
                kind, before = overdue
                # As an answer in time would have: done moves it, failed leaves it.
                moved = "SAVED" if kind == "snapshot" else "RUNNING"
                self.state = moved if result.ok else before
            return False
        waiting.set_result(result)
        return True

    def close(self, reason: str) -> None:
        """End the stream; fail every command still waiting."""
        if self.closed:
            return
        self.closed = reason
        self.outbox.put_nowait(None)
        for waiting in self.pending.values():
            if not waiting.done():
                self.interrupted = True
                waiting.set_exception(UnavailableError(f"workload channel closed: {reason}"))


class WorkloadChannels:
    """The open channels, by (group, job)."""

    def __init__(self, node: str = "") -> None:
        self._channels: dict[tuple[str, str], WorkloadChannel] = {}
        self._ids = itertools.count(1)
        self._node = node  # for the log lines

    def check_attach(self, channel: WorkloadChannel, recorded: str = "") -> None:
        """Refuse `channel` (PERMISSION_DENIED) if the job's open channel, or with none
        open the owner `recorded` in the job table (an earlier run's), is another
        owner's, unless `channel`'s owner may replace anyone's."""
        older = self._channels.get((channel.group, channel.job))
        owner = older.owner if older is not None else recorded
        if not owner or owner == channel.owner or channel.owner_trusted:
            return
        raise PermissionDeniedError(
            f"job {channel.job}'s workload channel belongs to another user"
            + (" (open now)" if older is not None else " (registered before the agent restarted)")
        )

    def attach(self, channel: WorkloadChannel) -> None:
        """Make `channel` the job's; an older one (`check_attach` allowing) is closed,
        and told that another channel took its place."""
        self.check_attach(channel)
        key = (channel.group, channel.job)
        older = self._channels.get(key)
        self._channels[key] = channel
        channel_opened(
            group=channel.group,
            job=channel.job,
            owner=channel.owner,
            peer=channel.peer,
            node=self._node,
        )
        if older is not None:
            reason = (
                f"replaced by a newer registration of the same job ({channel.peer or 'anonymous'})"
            )
            older.failure = AlreadyExistsError(
                f"another workload channel of the same user took this one's place for job"
                f" {channel.job}"
            )
            older.close(reason)
            self._closed(older)

    def _closed(self, channel: WorkloadChannel) -> None:
        channel_closed(
            group=channel.group,
            job=channel.job,
            owner=channel.owner,
            peer=channel.peer,
            node=self._node,
            reason=channel.closed,
        )

    def detach(self, channel: WorkloadChannel) -> bool:
        """Forget `channel`; True if it was still the job's current one."""
        key = (channel.group, channel.job)
        if self._channels.get(key) is channel:
            del self._channels[key]
            self._closed(channel)
            return True
        return False

    def __len__(self) -> int:
        """The channels attached now."""
        return len(self._channels)

    def get(self, group: str, job: str) -> WorkloadChannel | None:
        """The job's open channel (a workload registered without a group answers for any)."""
        return self._channels.get((group, job)) or self._channels.get(("", job))

    def command_id(self) -> str:
        """A new, unique command id."""
        return f"cmd-{next(self._ids)}"

    def channel(self, group: str, job: str) -> WorkloadChannel:
        """The job's open channel; ConflictError if it has none."""
        channel = self.get(group, job)
        if channel is None:
            raise ConflictError(f"job {job} has no workload channel open (is it registered?)")
        return channel

    async def send(
        self, group: str, job: str, kind: str, mode: str, tags: tuple[str, ...], timeout: float
    ) -> Result:
        """Run one command on the job's workload; raise if it failed."""
        channel = self.channel(group, job)
        result = await self.step(channel, kind, mode, tags, timeout)
        channel.state = "SAVED" if kind == "snapshot" else "RUNNING"
        channel.steps = None
        return result

    async def step(
        self,
        channel: WorkloadChannel,
        kind: str,
        mode: str,
        tags: tuple[str, ...],
        timeout: float,
    ) -> Result:
        """Run one command on `channel`'s workload, leaving its state to the caller
        (a step of an operation of several); raise if it failed."""
        if kind == "snapshot":
            mode = channel.capabilities.resolve_mode(mode)
        command = Command(self.command_id(), kind, mode, tags, round(timeout * 1000))
        result = await channel.run(command, timeout)
        if not result.ok:
            raise InternalError(
                f"the workload failed to {kind}: {result.error or 'no reason given'}"
            )
        return result

    def close_all(self, reason: str) -> None:
        for channel in list(self._channels.values()):
            channel.close(reason)
            self._closed(channel)
        self._channels.clear()
