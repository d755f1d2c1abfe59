"""Failpoints: named places in a switch where a fault test stops the process.

`TIMESLICE_FAILPOINTS=name[@N][,...]` in a process's environment makes it kill
itself with SIGKILL the Nth time (default: the first) it reaches one of those
places, exactly as `kill -9` would at that moment: the tests of restarts in the
middle of a switch use it to stop the orchestrator at each step. Unset (always,
outside those tests), a failpoint costs one dict lookup.
"""

from __future__ import annotations

import os
import signal
from typing import Final


def _armed(spec: str) -> dict[str, int]:
    armed = {}
    for item in filter(None, spec.split(",")):
        name, _, count = item.partition("@")
        armed[name] = int(count or 1)
    return armed


# name -> how many more times it is reached before it fires
ARMED: Final = _armed(os.environ.get("TIMESLICE_FAILPOINTS", ""))

# After the grant that starts a switch is journaled, before any agent is asked.
SWITCH_JOURNALED: Final = "switch-journaled"
# After every agent has done its part, before the switch's end is journaled.
SWITCH_MOVED: Final = "switch-moved"


def failpoint(name: str) -> None:
    """Die here, by SIGKILL, if the failpoint `name` is armed and its count is up."""
    if name in ARMED:
        ARMED[name] -= 1
        if ARMED[name] <= 0:
            os.kill(os.getpid(), signal.SIGKILL)
