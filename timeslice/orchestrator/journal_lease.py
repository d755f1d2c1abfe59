"""The leader lease of a PostgreSQL journal: the I/O around `leadership`'s rule.

One row in `leader_lease` (epoch, holder, expires_at on the database's clock, and
the address the holder advertised at takeover, which standbys hand to clients):
the active renews it with `UPDATE ... WHERE epoch = :mine AND holder = :me`, a
standby takes it over with one conditional UPDATE that raises the epoch only if
the lease has expired. Every append and snapshot of the journal locks the row
(`FOR SHARE`) in its own transaction and commits only if the row still names the
writer's epoch (`fence`): a takeover, which updates the row, waits for an append
in flight to commit, and every append after it fails. A deposed or frozen writer
so commits nothing once a standby has taken over.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import zlib
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from timeslice.errors import JournalClaimLostError
from timeslice.orchestrator import leadership as ld
from timeslice.orchestrator.journal_claim import CLOSE_TIMEOUT, within
from timeslice.orchestrator.leadership import LeaseRow, Role, Standing

log = logging.getLogger(__name__)

#: The longest address a lease row keeps (a target: see `timeslice.targets`).
MAX_ADDRESS = 300

_metadata = sa.MetaData()

lease_table = sa.Table(
    "leader_lease",
    _metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("epoch", sa.BigInteger, nullable=False),
    sa.Column("holder", sa.String(200), nullable=False),
    sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("address", sa.String(MAX_ADDRESS), nullable=False, server_default=""),
    sa.CheckConstraint("id = 1", name="leader_lease_one_row"),
)

_ROW = (
    "epoch, holder, extract(epoch FROM expires_at)::float8 AS expires_at,"
    " extract(epoch FROM now())::float8 AS now, address"
)
# The column came after the table: a table made before it gets it here.
_ADD_ADDRESS = sa.text(
    f"ALTER TABLE leader_lease ADD COLUMN IF NOT EXISTS address varchar({MAX_ADDRESS})"
    " NOT NULL DEFAULT ''"
)
_SEED = sa.text(
    "INSERT INTO leader_lease (id, epoch, holder, expires_at)"
    " VALUES (1, 0, '', '-infinity') ON CONFLICT (id) DO NOTHING"
)
_READ = sa.text(f"SELECT {_ROW} FROM leader_lease WHERE id = 1")
_TAKE = sa.text(
    "UPDATE leader_lease SET epoch = :epoch, holder = :me, address = :address,"
    " expires_at = now() + make_interval(secs => :lease)"
    f" WHERE id = 1 AND epoch = :epoch - 1 AND expires_at < now() RETURNING {_ROW}"
)
_RENEW = sa.text(
    "UPDATE leader_lease SET expires_at = now() + make_interval(secs => :lease)"
    f" WHERE id = 1 AND epoch = :epoch AND holder = :me RETURNING {_ROW}"
)
_FENCE = sa.text(
    "SELECT epoch FROM leader_lease WHERE id = 1 AND epoch = :epoch AND holder = :me FOR SHARE"
)
_EVICT_HOLDER = sa.text(
    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
    " WHERE application_name = :holder AND pid <> pg_backend_pid()"
)
_RELEASE = sa.text(
    "UPDATE leader_lease SET expires_at = '-infinity'"
    f" WHERE id = 1 AND epoch = :epoch AND holder = :me RETURNING {_ROW}"
)


#: The advisory lock candidates take, in turn, to create the lease table.
SCHEMA_KEYS = (
    zlib.crc32(b"timeslice") & 0x7FFFFFFF,
    zlib.crc32(b"timeslice.journal.schema") & 0x7FFFFFFF,
)
_SCHEMA_LOCK = sa.text("SELECT pg_advisory_xact_lock(:a, :b)")


def _row(found: Any) -> LeaseRow | None:
    if found is None:
        return None
    return LeaseRow(
        epoch=found.epoch,
        holder=found.holder,
        expires_at=found.expires_at,
        now=found.now,
        address=found.address,
    )


def create_lease_table(conn: sa.Connection) -> None:
    """Create the lease row's table if it is missing (with the journal's schema).
    Candidates started together on an empty database each try: a transaction lock
    makes them take turns, since PostgreSQL's CREATE TABLE IF NOT EXISTS is not
    safe against a concurrent one."""
    conn.execute(_SCHEMA_LOCK, dict(zip("ab", SCHEMA_KEYS, strict=True)))
    _metadata.create_all(conn)
    # Only when it is missing: ALTER TABLE would lock the row's table (and every
    # fenced append of the active) even when there is nothing to add.
    if "address" not in {c["name"] for c in sa.inspect(conn).get_columns("leader_lease")}:
        conn.execute(_ADD_ADDRESS)
    conn.execute(_SEED)


def fence(conn: sa.Connection, epoch: int, me: str, label: str) -> None:
    """In the caller's transaction: hold the lease row as it is until the commit,
    and fail the transaction unless it names `epoch` and `me`."""
    if conn.execute(_FENCE, {"epoch": epoch, "me": me}).first() is None:
        raise JournalClaimLostError(
            f"journal {label}: another orchestrator took the leader lease over"
            f" (this one held epoch {epoch}); it writes nothing more"
        )


class LeaderLease:
    """One candidate's hold on the lease of a PostgreSQL journal.

    `take_over` tries once; once active, `start_renewing` renews every third of the
    lease (a renewal that fails or times out is tried again while the lease holds
    by this process's clock), and `lost` is told (once) when it stops holding
    before a renewal came back, or a renewal finds the row changed: the candidate
    has stepped down for good."""

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        me: str,
        lease: float,
        label: str,
        lost: Callable[[JournalClaimLostError], None],
    ) -> None:
        self._engine, self.me, self.lease, self._label = engine, me, ld.check_lease(lease), label
        self._lost = lost
        #: Where this candidate serves, written into the row when it takes over ("":
        #: unknown); standbys name it to clients they refuse.
        self.address = ""
        self._created = False  # the table is there (made if it was not)
        self.standing: Standing = ld.STANDBY
        #: The row as last read or written (the holder and expiry a standby waits on).
        self.row: LeaseRow | None = None
        self._task: asyncio.Task[None] | None = None
        # Until when (loop time) the lease surely holds, by this process's clock.
        self._held_until = 0.0
        self._row_at = 0.0  # when (loop time) `row` was read

    @property
    def epoch(self) -> int:
        return self.standing.epoch

    async def _statement(self, statement: sa.TextClause, **values: Any) -> LeaseRow | None:
        async with self._engine.begin() as conn:
            return _row((await conn.execute(statement, values)).first())

    async def take_over(self) -> Standing:
        """Take the lease if it has expired (or was never held): the standing after."""
        if self.standing.role is not Role.STANDBY:
            return self.standing
        if not self._created:
            async with self._engine.begin() as conn:
                await conn.run_sync(create_lease_table)
            self._created = True
        self._saw(await self._statement(_READ))
        epoch = ld.takeover_epoch(self.row)
        if epoch is None:
            return self.standing
        address = self.address[:MAX_ADDRESS]
        sent = asyncio.get_running_loop().time()
        try:
            written = await self._take(epoch, address)
        except sa.exc.DBAPIError as exc:  # the row stayed locked: try again at the next wait
            log.info("journal %s: taking the leader lease over failed: %s", self._label, exc)
            return self.standing
        self.standing = ld.after_takeover(written, self.me, epoch)
        if written is not None:
            self._saw(written)
        if self.standing.role is Role.ACTIVE:
            self._held_until = ld.held_until(sent, self.lease)
        return self.standing

    async def _take(self, epoch: int, address: str) -> LeaseRow | None:
        """The takeover statement, once the lease has expired: first end every
        session of the expired holder (a frozen or partitioned writer may hold the
        lease row locked in a transaction the database still thinks open, and its
        advisory lock), then raise the epoch; never waiting on a lock for longer
        than a third of the lease."""
        holder = self.row.holder if self.row is not None else ""
        async with self._engine.begin() as conn:
            if holder and holder != self.me:
                await conn.execute(_EVICT_HOLDER, {"holder": holder})
            wait_ms = max(1, round(ld.renew_every(self.lease) * 1000))
            await conn.execute(sa.text(f"SET LOCAL lock_timeout = {wait_ms}"))
            values = {"epoch": epoch, "me": self.me, "lease": self.lease, "address": address}
            return _row((await conn.execute(_TAKE, values)).first())

    def _saw(self, row: LeaseRow | None) -> None:
        self.row, self._row_at = row, asyncio.get_running_loop().time()

    def leadership(self) -> ld.Leadership:
        """This candidate's standing as a status shows it: an active's own lease (what
        it still counts on by its own clock), else the row as last read."""
        now = asyncio.get_running_loop().time()
        s, row = self.standing, self.row
        if s.role is Role.ACTIVE:
            left = max(0.0, self._held_until - now)
            return ld.Leadership(
                role=s.role, epoch=s.epoch, lease=self.lease, left=left, holder=self.me
            )
        if row is None:
            return ld.Leadership(role=s.role, epoch=s.epoch, lease=self.lease)
        left = max(0.0, row.expires_at - row.now - (now - self._row_at))
        return ld.Leadership(
            role=s.role,
            epoch=max(s.epoch, row.epoch),
            lease=self.lease,
            left=0.0 if s.role is Role.STEPPED_DOWN else left,
            holder=row.holder,
        )

    def check_held(self) -> bool:
        """Whether this candidate is active and its lease surely still holds by its own
        clock (`leadership.held_until`). An active past that point without a renewal
        steps down here and now: it may have been frozen while a standby took over,
        and must not answer even what it could answer from memory (a KeepAlive)."""
        if self.standing.role is not Role.ACTIVE:
            return False
        if asyncio.get_running_loop().time() < self._held_until:
            return True
        self.step_down("its leader lease ran out by its own clock before it was renewed")
        return False

    def wait_hint(self) -> float:
        """How long a standby waits before trying again: until the lease it saw
        expires (by the database's clock as read), at most a third of a lease."""
        longest = ld.renew_every(self.lease)
        if self.row is None:
            return longest
        return min(longest, max(0.02, self.row.expires_at - self.row.now + 0.01))

    def start_renewing(self) -> None:
        if self._task is None and self.standing.role is Role.ACTIVE:
            self._task = asyncio.get_running_loop().create_task(self._renew_loop())

    async def _renew_loop(self) -> None:
        every = ld.renew_every(self.lease)
        pause, why = every, ""
        loop = asyncio.get_running_loop()
        while self.standing.role is Role.ACTIVE:
            await asyncio.sleep(pause)
            sent = loop.time()
            wait = ld.renewal_wait(sent, self._held_until, self.lease, retry=bool(why))
            if wait is None:
                self.step_down(f"its leader lease could not be renewed before it ran out: {why}")
                return
            try:
                row = await within(
                    self._statement(_RENEW, epoch=self.epoch, me=self.me, lease=self.lease), wait
                )
            except Exception as exc:  # a dead, slow or unreachable database: try again
                why = " ".join(str(exc).split()) or type(exc).__name__
                log.warning(
                    "journal %s: renewing the leader lease failed (%s); trying again while"
                    " it holds (%.2f s)", self._label, why, self._held_until - loop.time(),
                )  # fmt: skip
                pause = self.lease * ld.RETRY_SHARE
                continue
            pause, why = every, ""
            after = ld.after_renewal(self.standing, row, self.me)
            if row is not None:
                self._saw(row)
            if after.role is Role.ACTIVE:
                self._held_until = ld.held_until(sent, self.lease)
            elif self.standing.role is Role.ACTIVE:  # deposed by this renewal: say so
                self.step_down(after.why)

    def step_down(self, why: str) -> None:
        """Stop being active (a renewal or an append failed): for good."""
        was = self.standing.role is Role.ACTIVE
        self.standing = ld.step_down(self.standing, why)
        if was:
            self._lost(
                JournalClaimLostError(
                    f"journal {self._label}: the leader lease of epoch {self.epoch} is lost"
                    f" ({why}); this orchestrator steps down"
                )
            )

    async def release(self) -> None:
        """Stop renewing; an active that closes lets the lease expire now, so that a
        standby takes over at once."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if self.standing.role is Role.ACTIVE:
            self.standing = ld.step_down(self.standing, "closed")
            with contextlib.suppress(Exception):  # a database away lets it expire
                await within(self._statement(_RELEASE, epoch=self.epoch, me=self.me), CLOSE_TIMEOUT)
