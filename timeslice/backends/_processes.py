"""Whether a process still runs: what the cuda backend checks before it acts, and
what the agent reports as a job's liveness."""

from __future__ import annotations

import os


def pid_exists(pid: int) -> bool:
    """Whether process `pid` exists (and is not a zombie)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # someone else's process: it exists
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            return stat.read().rpartition(")")[2].split()[:1] != ["Z"]
    except FileNotFoundError:
        return not os.path.isdir("/proc/self")  # with /proc there: it has just exited
    except OSError:
        return True  # no /proc to ask: kill(0) said it exists
