"""Pipelined switches: the next holder's context comes in while the others' leave.

A switch on a node moves every other live context of the group off the
accelerators and then the next holder's back. The two transfers go opposite
ways (device to host, host to device), and PCIe is full duplex, so they can run
at the same time: a switch then takes about the longer of the two rather than
their sum. What must hold meanwhile is that the incoming context never needs
more accelerator memory than the outgoing ones have given back.

A workload that moves its context tag by tag (it registers `pipelined`) lets
the agent do that. Its snapshot goes one tag at a time and says, after each,
how much accelerator memory it freed; the next holder's restore goes one tag at
a time too, each tag once the memory it filled when it was last snapshotted fits
in what has been freed so far (`Room`). Once every outgoing snapshot has ended,
well or not, the rest comes in without waiting, as in a switch that is not
pipelined. A tag whose size is not known waits for that.

Nothing comes in before the first outgoing step has ended, so a switch moved
tag by tag takes at least that step and the whole restore after it: the finer
the tags, the nearer it comes to the longer transfer alone (two states of three
tags, a half and two quarters: three quarters of the time moved whole; each
tag cut in eight: 0.55 of it, by `model`).

The freed bytes are the outgoing workload's word, as every snapshot's result
is: a workload that claims more than it freed can make the next restore run out
of memory (it then fails, and faults its job), exactly as one that claims a
snapshot it did not do.

`Room` is the pure ledger, `Pace` the switch's asyncio view of it, and `model`
the same rule run over transfer times: what a switch would take, pipelined or
not, for given tag sizes and link bandwidths (the figures of the benchmarks).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass
class Room:
    """Accelerator memory during a pipelined switch: bytes the outgoing contexts
    have freed, bytes the incoming one has been let in for, and whether every
    outgoing snapshot has ended (then there is no more to wait for)."""

    freed: int = 0
    taken: int = 0
    open: bool = False

    def fits(self, nbytes: int | None) -> bool:
        """Whether `nbytes` more may come in now (None: a size not known, which
        waits for every snapshot to end)."""
        if self.open:
            return True
        return nbytes is not None and self.taken + nbytes <= self.freed

    def free(self, nbytes: int | None) -> None:
        """An outgoing step freed `nbytes` (None or negative: counted as nothing)."""
        if nbytes is not None and nbytes > 0:
            self.freed += nbytes

    def take(self, nbytes: int | None) -> None:
        """Let `nbytes` in; only once they fit."""
        if not self.fits(nbytes):
            raise ValueError(f"{nbytes} bytes do not fit ({self.freed - self.taken} free)")
        self.taken += nbytes or 0


class Pace:
    """One pipelined switch's `Room`, shared by its snapshots and its restore."""

    def __init__(self) -> None:
        self.room = Room()
        self._changed = asyncio.Event()

    def freed(self, nbytes: int | None) -> None:
        """A snapshot step freed `nbytes` of accelerator memory."""
        self.room.free(nbytes)
        self._changed.set()

    def open(self) -> None:
        """Every snapshot of the switch has ended: nothing more to wait for."""
        self.room.open = True
        self._changed.set()

    async def enter(self, nbytes: int | None) -> None:
        """Wait until `nbytes` fit, and take them."""
        while not self.room.fits(nbytes):
            self._changed.clear()
            await self._changed.wait()
        self.room.take(nbytes)


@dataclass(frozen=True)
class Timeline:
    """What a switch would take, by `model`: when each outgoing step ends, when
    each incoming step starts, and when the switch ends (the last byte in, or
    out if that is later), in seconds from its start."""

    out_ends: tuple[float, ...]
    in_starts: tuple[float, ...]
    end: float


def model(
    outgoing: Sequence[int],
    incoming: Sequence[int | None],
    *,
    d2h: float,
    h2d: float,
    pipelined: bool,
    step_cost: float = 0.0,
) -> Timeline:
    """A switch's transfers over a full-duplex link: `outgoing`, the bytes each
    outgoing step frees, in the order they leave, at `d2h` bytes per second;
    `incoming`, the bytes of each step of the restore, at `h2d`. A step also
    costs `step_cost` seconds of its own (the command's round trip). Pipelined,
    each incoming step starts once the one before it ended and `Room` lets it
    in; else the restore starts when the last outgoing step ends."""
    if d2h <= 0 or h2d <= 0:
        raise ValueError("bandwidths must be positive")
    out_ends: list[float] = []
    clock = 0.0
    for nbytes in outgoing:
        clock += step_cost + nbytes / d2h
        out_ends.append(clock)
    out_done = clock
    room = Room(open=not outgoing or not pipelined)
    left = list(zip(out_ends, outgoing, strict=True))  # outgoing steps not counted in yet
    clock = 0.0 if pipelined else out_done
    in_starts: list[float] = []
    for size in incoming:
        while not room.fits(size):  # wait for the next outgoing step to end
            at, gone = left.pop(0)
            clock = max(clock, at)
            room.free(gone)
            room.open = not left
        room.take(size)
        in_starts.append(clock)
        clock += step_cost + (size or 0) / h2d
        while left and left[0][0] <= clock:  # what ended meanwhile, for the next step
            room.free(left.pop(0)[1])
            room.open = not left
    return Timeline(out_ends=tuple(out_ends), in_starts=tuple(in_starts), end=max(clock, out_done))
