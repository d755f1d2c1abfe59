"""The agent's engine: every change of the job table saved before it is acted on.

Every change goes the same way as in the orchestrator: the pure `JobTable`
handles the event (or refuses it), the table is saved, and only then are the
effects carried out: an operation started on its backend, a waiting
`GetOperation` answered. Saves are coalesced: a save is due two turns of the
loop after the first change not saved, and one write covers every change made
until then. The write is synchronous (an append to SQLite's WAL, see
`timeslice.agent.store`), so a save is a callback of the loop, not a task, and
nothing runs between a write and its effects. While another writer holds the
file, a task tries the save again until it is free (for as long as SQLite's busy
timeout): only the callers of the changes wait, the loop goes on. One timer, set
for the table's next deadline, fails operations that overrun it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

from timeslice.agent import state as st
from timeslice.agent.oplog import operation_ended, operation_started
from timeslice.agent.pipeline import Pace
from timeslice.agent.state import JobState, JobTable, Operation, OpStatus
from timeslice.agent.store import StateStore
from timeslice.backends import Backend, JobRef, Moved, pipelined
from timeslice.errors import NotFoundError, TimeSliceError, UnavailableError
from timeslice.storage import JournalBusy, while_busy

log = logging.getLogger(__name__)

# Finished operations saved with the job table: what GetOperation can still answer
# after a restart (every pending one is saved too).
SAVED_OPERATIONS = 16


class AgentEngine:
    """Handles events on `table`, saves it to `store`, runs the operations it starts
    through the backend `backend(name)` returns."""

    def __init__(
        self,
        table: JobTable,
        store: StateStore,
        backend: Callable[[str], Backend],
        retention: float,
        node: str = "",
    ) -> None:
        self.table = table
        self._node = node  # for the log lines
        self._store = store
        self._backend = backend
        self._retention = retention
        #: False until the agent serves, and again once it closes.
        self.serving = False
        self.closed = False
        #: Called after every saved change of the job table (the orchestrator link's
        #: reports), on the loop's thread, in the save's callback: it must be cheap.
        self.changed: Callable[[], None] | None = None
        self._waiting: list[asyncio.Future[None]] = []
        self._effects: list[st.Effect] = []
        # The save to come: a callback, or while another writer holds the file a task.
        self._saving: asyncio.Handle | asyncio.Task[None] | None = None
        self._tasks: dict[str, asyncio.Task[None]] = {}  # running operations
        self._background: set[asyncio.Task[None]] = set()
        self.reconciling: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._done: dict[str, asyncio.Event] = {}  # set once an operation's end is saved
        self._ended: dict[str, asyncio.Event] = {}  # set as soon as it is in the table
        self._timer: asyncio.TimerHandle | None = None
        #: Told every operation that ends, once its end is saved (the metrics).
        self.finished: Callable[[Operation], None] | None = None
        #: The pipelined switch's pace lent to the next operation of a job (group,
        #: job), taken when it runs (see `timeslice.agent.pipeline`).
        self.paces: dict[tuple[str, str], Pace] = {}

    @property
    def saved(self) -> bool:
        """Whether every change made so far is saved (no save due)."""
        return self._saving is None

    def apply(self, event: st.Event) -> asyncio.Future[None]:
        """Handle `event`; the future resolves once the table is saved and the
        effects are under way. Raises (changing nothing) if the table refuses it."""
        effects = self.table.handle(event)
        for effect in effects:
            if isinstance(effect, st.Done) and (ended := self._ended.pop(effect.op_id, None)):
                ended.set()
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        self._effects += effects
        self._waiting.append(done)
        if self._saving is None:
            # Two turns of the loop first, so that what is decided in the same moment
            # (a switch starting its restore as its snapshot ends) joins this write.
            self._saving = loop.call_soon(self._save_soon)
        return done

    async def stop(self) -> None:
        """Fail the operations still running, save, and stop every task."""
        for op_id, task in list(self._tasks.items()):
            task.cancel()
            self.apply(
                st.Finish(now=time.time(), op_id=op_id, ok=False, error="the agent shut down")
            )
        if isinstance(self._saving, asyncio.Handle):
            self._saving.cancel()
            self._save()
        if isinstance(self._saving, asyncio.Task):  # the file is held: the last save waits
            await asyncio.gather(self._saving, return_exceptions=True)
        self.closed, self.serving = True, False
        if self._timer is not None:
            self._timer.cancel()
        tasks = [*self._tasks.values(), *self._background]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def wake_waiters(self) -> None:
        """Let every caller waiting for an operation go (the agent is closing)."""
        for event in self._done.values():
            event.set()

    def _save_soon(self) -> None:
        self._saving = asyncio.get_running_loop().call_soon(self._save)

    def _save(self) -> None:
        """Save the table once for every change made since the last save, then act on
        the changes' effects and tell their callers. A save is a synchronous write
        (see `timeslice.agent.store`), so nothing runs between a save and its effects.
        While another writer holds the file, a task tries again (every change made
        meanwhile joins its write) and the loop goes on with what needs no save."""
        self._saving = None
        try:
            self._write()
        except JournalBusy:
            self._saving = self._spawn(self._save_when_free())
        except Exception as exc:
            self._failed(exc)

    async def _save_when_free(self) -> None:
        try:
            await while_busy(self._write)
        except Exception as exc:
            self._failed(exc)
        finally:
            if self._saving is asyncio.current_task():
                self._saving = None
                if self._waiting:  # changed by what the write set going
                    self._saving = asyncio.get_running_loop().call_soon(self._save_soon)

    def _write(self) -> None:
        """Write the table with every change not yet saved, and act on them; raises,
        nothing taken, if the write fails."""
        if not self._waiting:
            return
        self._store.save(self.table.encode(finished=SAVED_OPERATIONS))
        waiting, self._waiting = self._waiting, []
        effects, self._effects = self._effects, []
        self._act(effects)
        for done in waiting:
            if not done.done():
                done.set_result(None)
        self._rearm()
        if self.changed is not None:
            try:
                self.changed()
            except Exception:  # the saved change stands, whatever its listener does
                log.exception("a listener of the job table's changes failed")

    def _failed(self, exc: Exception) -> None:
        """Fail the callers of every change not saved: the table could not be."""
        waiting, self._waiting, self._effects = self._waiting, [], []
        log.error("saving the job table failed: %s", exc)
        error = UnavailableError(f"the agent could not save its job table: {exc}")
        for done in waiting:
            if not done.done():
                done.set_exception(error)

    def _act(self, effects: list[st.Effect]) -> None:
        for effect in effects:
            match effect:
                case st.Run(op_id=op_id):
                    operation_started(self.table.operations[op_id], self._node)
                    self._tasks[op_id] = self._spawn(self._run(op_id))
                case st.Cancel(op_id=op_id):
                    if (task := self._tasks.pop(op_id, None)) is not None:
                        task.cancel()
                case st.Done(op_id=op_id):
                    if (op := self.table.operations.get(op_id)) is not None:
                        operation_ended(op, self._node)
                    if (event := self._done.pop(op_id, None)) is not None:
                        event.set()
                    if self.finished is not None and (op := self.table.operations.get(op_id)):
                        self.finished(op)
                case st.Reconcile(group=group, job=job):
                    task = self._spawn(self._reconcile(group, job))
                    self._background.add(task)
                    self.reconciling[(group, job)] = task
                case st.AwaitOperations() | st.StartOperations() | st.SwitchEnded():
                    raise TypeError(f"a switch plan is answered, not acted on: {effect!r}")
                case _:
                    raise TypeError(f"not an effect: {effect!r}")

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coro)
        task.add_done_callback(self._background.discard)
        return task

    async def _run(self, op_id: str) -> None:
        op = self.table.operations[op_id]
        job = self.table.jobs[(op.group, op.job)]
        ref = JobRef(job.group, job.job, job.config)
        left = op.deadline - time.time()
        finish: st.Finish
        pace = self.paces.pop(job.key, None)
        try:
            backend = self._backend(op.backend)
            params = {**op.params, "timeout": left}
            # asyncio.timeout, not wait_for: no task of its own for the backend's call.
            async with asyncio.timeout(left):
                moved = await _move(backend, op.kind, ref, params, pace)
            finish = st.Finish(
                now=time.time(),
                op_id=op_id,
                ok=True,
                storage_bytes=moved.storage_bytes,
                device_bytes=moved.device_bytes,
            )
        except asyncio.CancelledError:
            return  # its deadline passed, or the agent is shutting down: already finished
        except TimeoutError:
            finish = st.Finish(
                now=time.time(), op_id=op_id, ok=False, error=f"deadline exceeded ({left:.1f} s)"
            )
        except TimeSliceError as exc:
            finish = st.Finish(
                now=time.time(), op_id=op_id, ok=False, error=exc.message or type(exc).__name__
            )
        except Exception as exc:
            log.exception("%s %s failed", op.kind, op_id)
            finish = st.Finish(
                now=time.time(), op_id=op_id, ok=False, error=f"{type(exc).__name__}: {exc}"
            )
        finally:
            self._tasks.pop(op_id, None)
        if not self.closed:
            self.apply(finish)

    async def _reconcile(self, group: str, job_id: str) -> None:
        job = self.table.jobs.get((group, job_id))
        if job is None:
            return
        try:
            where = await self._backend(job.backend).state(JobRef(group, job_id, job.config))
            reason = "" if where else f"backend {job.backend} cannot tell where its context is"
        except Exception as exc:
            where, reason = None, f"backend {job.backend} failed to tell its state: {exc}"
        state = JobState(where) if where in ("RUNNING", "SAVED") else None
        if self.serving:
            await self.apply(
                st.Reconciled(now=time.time(), group=group, job=job_id, state=state, reason=reason)
            )

    def _rearm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        at = self.table.next_deadline()
        if at is not None and self.serving:
            delay = max(0.0, at - time.time())
            self._timer = asyncio.get_running_loop().call_later(delay, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self.apply(st.Tick(now=time.time()))

    # --- waiting for operations -------------------------------------------------------

    async def ended(self, op_id: str, wait: float) -> None:
        """Return once operation `op_id` has ended in the job table (its end perhaps not
        saved yet: see `flush`), or after `wait` seconds."""
        op = self.table.operations.get(op_id)
        if op is not None and op.status is OpStatus.PENDING and wait > 0:
            event = self._ended.setdefault(op_id, asyncio.Event())
            # asyncio.timeout, not wait_for: no task in between, so that this caller
            # runs in the very turn of the loop the operation ends in.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await event.wait()

    async def flush(self) -> None:
        """Return once every change made so far is saved."""
        if self._waiting:  # changes not saved yet: wait for the next save
            saved: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiting.append(saved)
            await saved

    async def operation(self, op_id: str, wait: float = 0.0) -> Operation:
        """Operation `op_id`, once finished or after `wait` seconds, whichever first."""
        op = self.table.operations.get(op_id)
        if op is None:
            raise NotFoundError(
                f"unknown operation {op_id!r} (finished ones are kept {self._retention:.0f} s)"
            )
        if op.status is OpStatus.PENDING and wait > 0:
            event = self._done.setdefault(op_id, asyncio.Event())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), wait)
        return op


async def _move(
    backend: Backend, kind: str, job: JobRef, params: dict[str, Any], pace: Pace | None
) -> Moved:
    """Run a snapshot or restore on `backend`; in a pipelined switch (`pace`), step by
    step where the backend can, else telling the pace only when it ends."""
    snapshot = kind == st.SNAPSHOT
    if pace is None:
        return await (backend.snapshot if snapshot else backend.restore)(job, params)
    if (paced := pipelined(backend)) is not None:
        if snapshot:
            return await paced.snapshot_paced(job, params, pace)
        return await paced.restore_paced(job, params, pace)
    if snapshot:
        moved = await backend.snapshot(job, params)
        pace.freed(moved.device_bytes)
        return moved
    await pace.enter(None)
    return await backend.restore(job, params)
