"""The stand-in's `PhaseCallback`: the base class Slime's drivers call at the
beginning and end of each phase (``on_phase_begin(phase, role, context)``,
``on_phase_end(phase, role, context)``); the base does nothing."""

from __future__ import annotations

from typing import Any


class PhaseCallback:
    """Told when a phase of a Slime driver begins and ends."""

    def on_phase_begin(self, phase: str, role: str, context: Any = None) -> None:
        """A phase (``"train"``, ``"generate"``, ...) begins for ``role``."""

    def on_phase_end(self, phase: str, role: str, context: Any = None) -> None:
        """The phase ends for ``role``."""

    def close(self) -> None:
        """The driver is done."""
