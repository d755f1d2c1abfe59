"""The command line's security options: TLS and `--auth` for `timeslice serve ...`,
the credentials a server calls the other with, and those of the client commands.

The options are declared here once (typer `Annotated` types) and read into the
same `ServerTls`, `ClientTls` and `AuthPolicy` a program passes to the configs.
Tokens are secrets, so the servers take theirs from the environment only
(`TIMESLICE_AGENT_TOKEN`, `TIMESLICE_ORCHESTRATOR_TOKEN`: a command line is
visible to every user of the machine); a client command takes `--token` or,
better, `TIMESLICE_TOKEN`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Final

import typer

if TYPE_CHECKING:
    from timeslice.security.tls import ClientTls

ENV_AGENT_TOKEN: Final = "TIMESLICE_AGENT_TOKEN"
ENV_ORCHESTRATOR_TOKEN: Final = "TIMESLICE_ORCHESTRATOR_TOKEN"

_SERVE = "Security"
_CLIENT = "Credentials"

# --- serve: the server's own TLS and auth ----------------------------------------------
TlsCert = Annotated[
    str | None,
    typer.Option(
        "--tls-cert", help="Serve TLS with this certificate chain (PEM).", rich_help_panel=_SERVE
    ),
]
TlsKey = Annotated[
    str | None,
    typer.Option(
        "--tls-key",
        help="The private key of --tls-cert (PEM, unencrypted).",
        rich_help_panel=_SERVE,
    ),
]
TlsClientCa = Annotated[
    str | None,
    typer.Option(
        "--tls-client-ca",
        help="Require client certificates signed by this CA (mTLS).",
        rich_help_panel=_SERVE,
    ),
]
AuthFile = Annotated[
    str | None,
    typer.Option(
        "--auth",
        help="The principals and roles that may call (TOML; see README, Security).",
        rich_help_panel=_SERVE,
    ),
]
Insecure = Annotated[
    bool,
    typer.Option(
        "--insecure",
        help="Serve a non-loopback --host without TLS and --auth anyway (anyone who can"
        " reach it may do anything).",
        rich_help_panel=_SERVE,
    ),
]


def _client_tls_options(prefix: str, whom: str, panel: str) -> tuple[Any, Any, Any]:
    ca = Annotated[
        str | None,
        typer.Option(
            f"--{prefix}tls-ca",
            help=f"Connect to {whom} over TLS, trusting this CA (PEM).",
            rich_help_panel=panel,
        ),
    ]
    cert = Annotated[
        str | None,
        typer.Option(
            f"--{prefix}tls-cert",
            help=f"The client certificate to show {whom} (its mTLS).",
            rich_help_panel=panel,
        ),
    ]
    key = Annotated[
        str | None,
        typer.Option(
            f"--{prefix}tls-key",
            help=f"The private key of --{prefix}tls-cert.",
            rich_help_panel=panel,
        ),
    ]
    return ca, cert, key


# --- serve orchestrator: how it calls the agents; serve agent: its orchestrator --------
AgentTlsCa, AgentTlsCert, AgentTlsKey = _client_tls_options("agent-", "the agents", _SERVE)
OrchestratorTlsCa, OrchestratorTlsCert, OrchestratorTlsKey = _client_tls_options(
    "orchestrator-", "the orchestrator", _SERVE
)

# --- client commands ---------------------------------------------------------------------
TlsCa, ClientTlsCert, ClientTlsKey = _client_tls_options("", "the orchestrator", _CLIENT)
Token = Annotated[
    str | None,
    typer.Option(
        "--token",
        help="The bearer token to call with (default: $TIMESLICE_TOKEN, which other users"
        " cannot see as they can a command line).",
        rich_help_panel=_CLIENT,
    ),
]


@dataclass(frozen=True, kw_only=True)
class ClientCredentials:
    """What a client command calls with; None: the environment's (TIMESLICE_TLS_*,
    TIMESLICE_TOKEN)."""

    tls: ClientTls | None = None
    token: str | None = None


def client_tls(
    ca: str | None, cert: str | None, key: str | None, prefix: str = ""
) -> ClientTls | None:
    """The `ClientTls` of `--{prefix}tls-ca/cert/key`, None when none is given."""
    from timeslice.security.tls import ClientTls

    if not (ca or cert or key):
        return None
    return ClientTls(ca=ca or "", cert=cert or "", key=key or "", names=f"--{prefix}tls-")


def client_credentials(
    ca: str | None, cert: str | None, key: str | None, token: str | None
) -> ClientCredentials:
    """A client command's credentials (checked: one line for a bad file or token)."""
    from timeslice.security.tls import check_token

    return ClientCredentials(
        tls=client_tls(ca, cert, key), token=check_token(token, "--token") if token else None
    )


def serve_security(
    *,
    tls_cert: str | None,
    tls_key: str | None,
    tls_client_ca: str | None,
    auth: str | None,
    insecure: bool,
) -> dict[str, Any]:
    """The config fields (`tls`, `auth`, `insecure`) a `serve` command's options set;
    only those given."""
    from timeslice.security.principals import read_auth_file
    from timeslice.security.tls import ServerTls

    values: dict[str, Any] = {}
    if tls_cert or tls_key or tls_client_ca:
        values["tls"] = ServerTls(
            cert=tls_cert or "", key=tls_key or "", client_ca=tls_client_ca or ""
        )
    if auth:
        values["auth"] = read_auth_file(auth)
    if insecure:
        values["insecure"] = True
    return values


def env_token(name: str) -> str:
    """The token of environment variable `name` ("" when unset), checked."""
    from timeslice.security.tls import check_token

    token = os.environ.get(name, "").strip()
    return check_token(token, name) if token else ""
