"""Who may do what: the principals of an auth file, and the rule of each role.

An auth file (TOML, `--auth FILE`) names every principal that may call a
service, how it proves who it is, and what it may touch:

    [[principal]]
    name = "trainer-a"
    token_sha256 = "9f86d0..."          # or: cert_subject = "CN=trainer-a"
    role = "job"                         # job | agent | operator | viewer
    jobs = ["trainer-a", "trainer-a-*"]  # job: the job ids it may act as
    groups = ["*"]                       # job, viewer: the groups it may touch or see
    # nodes = ["gpu-1"]                  # agent: the node names it may register as
    # uids = [1001]                      # job: the node users whose processes are its

A job principal's `uids` are the users its processes run as on the nodes: an
agent names a `cuda` job's processes for the principal that registered the job
only when they are those users' (without `uids`, only the agent's own user's,
and none when the agent runs as root). Root (0) is no job's user.

Names beginning with `timeslice:` are reserved: none is a principal's. The
orchestrator's own discovery from Kubernetes labels registers the jobs it finds
as `DISCOVERY_REGISTRANT`, which no auth file can give to a caller.

A principal proves itself by a bearer token (the file keeps only its SHA-256,
so that the file grants nothing to whoever reads it) or by the subject of a
client certificate that the server's client CA verified (mTLS). Patterns are
shell-style (`fnmatch`, case-sensitive): `*` matches any id.

The roles:

- `job`: acquire, yield, keep alive, register a job, watch and read status, only
  for its job ids and its groups;
- `agent`: keep an agent session, only as one of its nodes, and read a group's
  status (to check a fencing token it is sent);
- `operator`: everything, including force-release, job reset, group nodes and
  the agent's commands from the orchestrator;
- `viewer`: list groups, read their status and watch them, for its groups.

Pure: no I/O but reading the file in `read_auth_file`, no clock. `check`
answers one question (may this principal do this verb on this job, group or
node?) and raises `PermissionDeniedError` naming the principal when it may not.
"""

from __future__ import annotations

import fnmatch
import hashlib
import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, Final

from timeslice.api.bounds import MAX_ITEMS, id_problem
from timeslice.errors import InvalidArgumentError, PermissionDeniedError

_SHA256_HEX: Final = re.compile(r"[0-9a-f]{64}\Z")
_KEYS: Final = {"name", "token_sha256", "cert_subject", "role", "jobs", "groups", "nodes", "uids"}
# Principal names of this prefix are reserved for the system's own registrants.
RESERVED_PREFIX: Final = "timeslice:"
# Who registered a job the orchestrator's Kubernetes discovery found (see
# `timeslice.agent.access`: an agent trusts it only on an operator's SwitchGroup).
DISCOVERY_REGISTRANT: Final = "timeslice:discovery"
# The largest uid Linux has (uid_t is 32 bits; -1 means "none").
_MAX_UID: Final = 2**32 - 2


class Role(StrEnum):
    JOB = "job"
    AGENT = "agent"
    OPERATOR = "operator"
    VIEWER = "viewer"


class Verb(StrEnum):
    """What a call does, as the rule of each role names it."""

    # the orchestrator's
    ACQUIRE = "acquire"
    YIELD = "yield"
    KEEP_ALIVE = "keep_alive"
    REGISTER_JOB = "register_job"
    WATCH = "watch"
    STATUS = "status"  # ListGroups, GetGroupStatus
    FORCE_RELEASE = "force_release"
    RESET_JOB = "reset_job"
    SET_GROUP_NODES = "set_group_nodes"
    AGENT_SESSION = "agent_session"
    # the agent's
    SNAPSHOT = "snapshot"  # Snapshot, Restore, GetOperation of the caller's own job
    WORKLOAD_CHANNEL = "workload_channel"
    AGENT_STATUS = "agent_status"
    SWITCH = "switch"  # SwitchGroup, and any request carrying a fencing token


# What each role may do; what it may do it on is `Principal.covers`'.
ROLE_VERBS: Final[Mapping[Role, frozenset[Verb]]] = {
    Role.JOB: frozenset(
        {
            Verb.ACQUIRE,
            Verb.YIELD,
            Verb.KEEP_ALIVE,
            Verb.REGISTER_JOB,
            Verb.WATCH,
            Verb.STATUS,
            Verb.SNAPSHOT,
            Verb.WORKLOAD_CHANNEL,
            Verb.AGENT_STATUS,
        }
    ),
    # An agent reads a group's status to check a fencing token new to it.
    Role.AGENT: frozenset({Verb.AGENT_SESSION, Verb.STATUS}),
    Role.OPERATOR: frozenset(Verb),
    Role.VIEWER: frozenset({Verb.STATUS, Verb.WATCH, Verb.AGENT_STATUS}),
}


@dataclass(frozen=True, kw_only=True)
class Principal:
    """One caller the auth file names."""

    name: str
    role: Role
    token_sha256: str = ""
    cert_subject: str = ""
    jobs: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()
    nodes: tuple[str, ...] = ()
    # job: the users its processes run as on the nodes.
    uids: tuple[int, ...] = ()

    def may_act_as(self, job: str) -> bool:
        return self.role is Role.OPERATOR or _matches(job, self.jobs)

    def may_touch(self, group: str) -> bool:
        """Whether `group` is one of its own (what it may see of a list of groups, or
        of a watch of them all, is the groups this is true of)."""
        return self.role in (Role.OPERATOR, Role.AGENT) or _matches(group, self.groups)

    def may_be(self, node: str) -> bool:
        return self.role is Role.OPERATOR or _matches(node, self.nodes)


@dataclass(frozen=True)
class AuthPolicy:
    """Every principal, found by the SHA-256 of its token or its certificate subject."""

    principals: tuple[Principal, ...]

    def __post_init__(self) -> None:
        names = [p.name for p in self.principals]
        if len(set(names)) != len(names):
            raise InvalidArgumentError("two principals have the same name")
        hashes = [p.token_sha256 for p in self.principals if p.token_sha256]
        subjects = [p.cert_subject for p in self.principals if p.cert_subject]
        if len(set(hashes)) != len(hashes):
            raise InvalidArgumentError("two principals have the same token")
        if len(set(subjects)) != len(subjects):
            raise InvalidArgumentError("two principals have the same certificate subject")

    def by_token(self, token: str) -> Principal | None:
        """The principal whose token this is, or None."""
        digest = token_sha256(token)
        return next((p for p in self.principals if p.token_sha256 == digest), None)

    def by_subject(self, subject: str) -> Principal | None:
        """The principal of this certificate subject ("CN=...,O=..."), or None."""
        return next((p for p in self.principals if p.cert_subject == subject), None)

    def by_name(self, name: str) -> Principal | None:
        """The principal of this name, or None."""
        return next((p for p in self.principals if p.name == name), None)


def token_sha256(token: str) -> str:
    """The hex SHA-256 of a token, as an auth file keeps it."""
    return hashlib.sha256(token.encode()).hexdigest()


def check(
    principal: Principal, verb: Verb, *, job: str = "", group: str = "", node: str = ""
) -> None:
    """Raise `PermissionDeniedError` unless `principal` may do `verb` on the job,
    group and node named (each only when given)."""
    if verb not in ROLE_VERBS[principal.role]:
        raise PermissionDeniedError(
            f"principal {principal.name} ({principal.role}) may not {verb.replace('_', ' ')}"
        )
    if job and not principal.may_act_as(job):
        raise PermissionDeniedError(f"principal {principal.name} may not act as job {job}")
    if group and not principal.may_touch(group):
        raise PermissionDeniedError(f"principal {principal.name} may not touch group {group}")
    if node and not principal.may_be(node):
        raise PermissionDeniedError(f"principal {principal.name} may not act as node {node}")


def subject_of(cert: Mapping[str, Any] | None) -> str:
    """A peer certificate's subject (`ssl.SSLSocket.getpeercert()`), as an auth file
    names it: "CN=trainer-a,O=lab", in the certificate's order; "" for none."""
    if not cert:
        return ""
    short = {
        "commonName": "CN",
        "organizationName": "O",
        "organizationalUnitName": "OU",
        "countryName": "C",
        "stateOrProvinceName": "ST",
        "localityName": "L",
        "domainComponent": "DC",
        "emailAddress": "emailAddress",
    }
    parts = [
        f"{short.get(key, key)}={value}" for rdn in cert.get("subject", ()) for key, value in rdn
    ]
    return ",".join(parts)


def read_auth_file(path: str | Path) -> AuthPolicy:
    """The auth file at `path`, checked: one line naming the file and the problem."""
    where = str(path)
    try:
        data = tomllib.loads(Path(path).read_text())
    except OSError as exc:
        raise InvalidArgumentError(f"{where}: cannot read the auth file: {exc.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise InvalidArgumentError(f"{where}: not a valid TOML file: {exc}") from None
    return parse_auth(data, where)


def parse_auth(data: Mapping[str, Any], where: str = "the auth file") -> AuthPolicy:
    """An `AuthPolicy` from the parsed TOML of an auth file."""
    unknown = sorted(set(data) - {"principal"})
    if unknown:
        raise InvalidArgumentError(f"{where}: unknown key {unknown[0]!r} (expected [[principal]])")
    entries = data.get("principal", [])
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise InvalidArgumentError(f"{where}: principal must be an array of tables ([[principal]])")
    if len(entries) > MAX_ITEMS * 16:
        raise InvalidArgumentError(f"{where}: at most {MAX_ITEMS * 16} principals")
    principals = tuple(
        _principal(entry, f"{where}: principal {i + 1}") for i, entry in enumerate(entries)
    )
    try:
        return AuthPolicy(principals)
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(f"{where}: {exc}") from None


def _principal(entry: Mapping[str, Any], where: str) -> Principal:
    unknown = sorted(set(entry) - _KEYS)
    if unknown:
        raise InvalidArgumentError(f"{where}: unknown key {unknown[0]!r}")
    name = _text(entry, "name", where)
    if not name:
        raise InvalidArgumentError(f"{where}: name is missing")
    where = f"{where} ({name})"
    if name.startswith(RESERVED_PREFIX):
        raise InvalidArgumentError(
            f"{where}: names beginning with {RESERVED_PREFIX!r} are reserved"
        )
    role_name = _text(entry, "role", where)
    if role_name not in set(Role):
        raise InvalidArgumentError(
            f"{where}: role must be one of {', '.join(Role)}, not {role_name!r}"
        )
    role = Role(role_name)
    token = _text(entry, "token_sha256", where).lower()
    subject = _text(entry, "cert_subject", where)
    if bool(token) == bool(subject):
        raise InvalidArgumentError(f"{where}: give exactly one of token_sha256 and cert_subject")
    if token and not _SHA256_HEX.match(token):
        raise InvalidArgumentError(f"{where}: token_sha256 must be 64 hex digits")
    jobs, groups, nodes = (_patterns(entry, key, where) for key in ("jobs", "groups", "nodes"))
    needs = {Role.JOB: ("jobs", "groups"), Role.VIEWER: ("groups",), Role.AGENT: ("nodes",)}
    given = {"jobs": jobs, "groups": groups, "nodes": nodes}
    for key in needs.get(role, ()):
        if not given[key]:
            raise InvalidArgumentError(f"{where}: a {role} principal needs {key}")
    for key, values in given.items():
        if values and key not in needs.get(role, ()):
            raise InvalidArgumentError(f"{where}: {key} means nothing for a {role} principal")
    uids = _uids(entry, where)
    if uids and role is not Role.JOB:
        raise InvalidArgumentError(f"{where}: uids means nothing for a {role} principal")
    return Principal(
        name=name,
        role=role,
        token_sha256=token,
        cert_subject=subject,
        jobs=jobs,
        groups=groups,
        nodes=nodes,
        uids=uids,
    )


def _uids(entry: Mapping[str, Any], where: str) -> tuple[int, ...]:
    values = entry.get("uids", [])
    if not isinstance(values, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in values
    ):
        raise InvalidArgumentError(f"{where}: uids must be a list of user ids (integers)")
    if len(values) > MAX_ITEMS:
        raise InvalidArgumentError(f"{where}: uids has more than {MAX_ITEMS} entries")
    for uid in values:
        if uid == 0:
            raise InvalidArgumentError(
                f"{where}: uids may not name root (0): an operator principal acts on any process"
            )
        if not 0 < uid <= _MAX_UID:
            raise InvalidArgumentError(f"{where}: uid {uid} is not a user id")
    return tuple(values)


def _text(entry: Mapping[str, Any], key: str, where: str) -> str:
    value = entry.get(key, "")
    if not isinstance(value, str):
        raise InvalidArgumentError(f"{where}: {key} must be a string")
    if (problem := id_problem(value)) is not None:
        raise InvalidArgumentError(f"{where}: {key} {problem}")
    return value


def _patterns(entry: Mapping[str, Any], key: str, where: str) -> tuple[str, ...]:
    values = entry.get(key, [])
    if not isinstance(values, list) or not all(isinstance(v, str) and v for v in values):
        raise InvalidArgumentError(f"{where}: {key} must be a list of non-empty strings")
    if len(values) > MAX_ITEMS:
        raise InvalidArgumentError(f"{where}: {key} has more than {MAX_ITEMS} patterns")
    for value in values:
        if (problem := id_problem(value)) is not None:
            raise InvalidArgumentError(f"{where}: a pattern of {key} {problem}")
    return tuple(values)


def _matches(value: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(value, pattern) for pattern in patterns)
