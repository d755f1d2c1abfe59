"""The orchestrator's configuration from a TOML file (`serve orchestrator --config`).

The keys are the fields of `OrchestratorConfig`; the per-group ones are tables:

    db = "sqlite:///var/lib/timeslice/journal.db"
    policy = "fifo"
    hold_limit = 900
    switch_timeout = 120

    [group_nodes]          # the nodes each group spans
    rollout = ["gpu-1", "gpu-2"]
    trainer = ["10.0.0.7:9001"]

    [hold_limits]          # per group
    rollout = 600

    [policies]             # per group
    trainer = "lrs"

Unknown keys and values of the wrong type are refused with the key named; the
values themselves are checked by `OrchestratorConfig` as for every other way
of making one.
"""

from __future__ import annotations

import tomllib
from dataclasses import fields
from pathlib import Path
from typing import Any

from timeslice.errors import InvalidArgumentError
from timeslice.orchestrator.server import OrchestratorConfig

_TABLES = {"group_nodes", "hold_limits", "policies"}


def read_orchestrator_config(path: str | Path) -> dict[str, Any]:
    """The `OrchestratorConfig` fields a TOML file sets, ready to pass to it."""
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise InvalidArgumentError(f"cannot read {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise InvalidArgumentError(f"{path} is not valid TOML: {exc}") from None
    known = {f.name for f in fields(OrchestratorConfig)}
    if unknown := sorted(set(data) - known):
        raise InvalidArgumentError(
            f"{path}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
        )
    values: dict[str, Any] = {}
    for key, value in data.items():
        if key in _TABLES:
            if not isinstance(value, dict):
                raise InvalidArgumentError(f"{path}: {key} must be a table of groups")
            values[key] = {
                group: _group_value(path, key, group, item) for group, item in value.items()
            }
        elif isinstance(value, dict | list):
            raise InvalidArgumentError(f"{path}: {key} takes a single value")
        else:
            values[key] = value
    return values


def _group_value(path: str | Path, key: str, group: str, value: Any) -> Any:
    if key == "group_nodes":
        if not isinstance(value, list) or not all(isinstance(n, str) for n in value):
            raise InvalidArgumentError(f"{path}: group_nodes.{group} must be a list of nodes")
        return tuple(value)
    if key == "hold_limits" and not isinstance(value, int | float):
        raise InvalidArgumentError(f"{path}: hold_limits.{group} must be a number of seconds")
    if key == "policies" and not isinstance(value, str):
        raise InvalidArgumentError(f"{path}: policies.{group} must be a policy's name")
    return value
