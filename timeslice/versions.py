"""The package's version, as the command line and both services report it.

It comes from the installed distribution's metadata, so that a service and the
`timeslice` command that asks it say the same thing when they are the same
install, and `timeslice inspect` can tell when an agent runs another one.
"""

from __future__ import annotations

import importlib.metadata
from functools import cache

DISTRIBUTION = "timeslice"
# What a source tree that was never installed says.
UNKNOWN = "unknown"


@cache
def package_version() -> str:
    """The installed `timeslice` distribution's version ("unknown" when not installed)."""
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return UNKNOWN
