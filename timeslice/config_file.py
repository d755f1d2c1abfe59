"""The orchestrator's configuration from a TOML file (`serve orchestrator --config`).

The keys are the fields of `OrchestratorConfig`; the per-group ones are tables:

    db = "sqlite:////var/lib/timeslice/journal.db"
    policy = "fifo"
    hold_limit = 900
    switch_timeout = 120
    auth = "/etc/timeslice/auth.toml"      # the principals (--auth)

    [group_nodes]          # the nodes each group spans
    rollout = ["gpu-1", "gpu-2"]
    trainer = ["10.0.0.7:9001"]

    [hold_limits]          # per group
    rollout = 600

    [policies]             # per group
    trainer = "lrs"

    [tls]                  # the server's TLS (--tls-cert, --tls-key, --tls-client-ca)
    cert = "/etc/timeslice/server.pem"
    key = "/etc/timeslice/server-key.pem"
    client_ca = "/etc/timeslice/ca.pem"
    [agent_tls]            # how it calls the agents (--agent-tls-ca, -cert, -key)
    ca = "/etc/timeslice/ca.pem"

(Four slashes make the path absolute: `sqlite:///journal.db` is relative to the
working directory; a bare path works too.) Unknown keys and values of the wrong type are refused with
the file and the key named; the values themselves are checked by
`OrchestratorConfig` as for every other way of making one.
"""

from __future__ import annotations

import tomllib
import types
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any, Union, get_args, get_origin, get_type_hints

from timeslice.errors import InvalidArgumentError
from timeslice.orchestrator.server import OrchestratorConfig
from timeslice.security.principals import read_auth_file
from timeslice.security.tls import ClientTls, ServerTls

_TABLES = {"group_nodes", "hold_limits", "policies"}
_TLS_TABLES: dict[str, tuple[type[ServerTls] | type[ClientTls], tuple[str, ...]]] = {
    "tls": (ServerTls, ("cert", "key", "client_ca")),
    "agent_tls": (ClientTls, ("ca", "cert", "key")),
}

# A setting's type: what a message calls it, and which TOML values are of it
# (TOML's integers are numbers too; its booleans, ints to Python, are neither).
_KINDS: dict[type, tuple[str, Callable[[Any], bool]]] = {
    str: ("a string", lambda v: isinstance(v, str)),
    int: ("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    float: ("a number", lambda v: isinstance(v, int | float) and not isinstance(v, bool)),
    bool: ("true or false", lambda v: isinstance(v, bool)),
}


def read_orchestrator_config(path: str | Path) -> dict[str, Any]:
    """The `OrchestratorConfig` fields a TOML file sets, ready to pass to it."""
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise InvalidArgumentError(f"cannot read {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise InvalidArgumentError(f"{path} is not valid TOML: {exc}") from None
    hints = get_type_hints(OrchestratorConfig)
    known = {f.name for f in fields(OrchestratorConfig)}
    if unknown := sorted(set(data) - known):
        raise InvalidArgumentError(
            f"{path}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
        )
    values: dict[str, Any] = {}
    for key, value in data.items():
        if key == "auth":
            if not isinstance(value, str):
                raise InvalidArgumentError(f"{path}: auth must be the path of an auth file")
            values[key] = read_auth_file(value)
        elif key in _TLS_TABLES:
            values[key] = _tls(path, key, value)
        elif key in _TABLES:
            if not isinstance(value, dict):
                raise InvalidArgumentError(f"{path}: {key} must be a table of groups")
            values[key] = {
                group: _group_value(path, key, group, item) for group, item in value.items()
            }
        elif isinstance(value, dict | list):
            raise InvalidArgumentError(f"{path}: {key} takes a single value")
        else:
            _check_kind(path, key, value, hints[key])
            values[key] = value
    return values


def _check_kind(path: str | Path, key: str, value: Any, hint: Any) -> None:
    """Refuse `value` unless it is of the setting's type (`float | None`: a number,
    since TOML has no null)."""
    kinds = [k for k in get_args(hint) if k is not type(None)] if _is_union(hint) else [hint]
    known = [_KINDS[k] for k in kinds if k in _KINDS]
    if not known:
        return  # a type TOML cannot spell: OrchestratorConfig judges it
    if any(accepts(value) for _, accepts in known):
        return
    wanted = " or ".join(name for name, _ in known)
    if isinstance(value, str):
        given = f"the string {value!r}"
    else:
        given = str(value).lower() if isinstance(value, bool) else repr(value)  # as TOML spells it
    raise InvalidArgumentError(f"{path}: {key} must be {wanted}, not {given}")


def _is_union(hint: Any) -> bool:
    return get_origin(hint) in (Union, types.UnionType)


def _group_value(path: str | Path, key: str, group: str, value: Any) -> Any:
    if key == "group_nodes":
        if not isinstance(value, list) or not all(isinstance(n, str) for n in value):
            raise InvalidArgumentError(f"{path}: group_nodes.{group} must be a list of nodes")
        return tuple(value)
    if key == "hold_limits" and not _KINDS[float][1](value):
        raise InvalidArgumentError(f"{path}: hold_limits.{group} must be a number of seconds")
    if key == "policies" and not isinstance(value, str):
        raise InvalidArgumentError(f"{path}: policies.{group} must be a policy's name")
    return value


def _tls(path: str | Path, key: str, value: Any) -> ServerTls | ClientTls:
    """The [tls] or [agent_tls] table: its files, checked as the options' are."""
    kind, keys = _TLS_TABLES[key]
    if not isinstance(value, dict):
        raise InvalidArgumentError(f"{path}: {key} must be a table ({', '.join(keys)})")
    if unknown := sorted(set(value) - set(keys)):
        raise InvalidArgumentError(
            f"{path}: unknown key(s) {key}.{', '.join(unknown)}; known: {', '.join(keys)}"
        )
    if not all(isinstance(item, str) for item in value.values()):
        raise InvalidArgumentError(f"{path}: the values of {key} must be file paths")
    return kind(**value, names=f"{path}: {key}.")
