"""TLS for the services and their clients, and the credentials a client finds in
its environment.

- `ServerTls`: a service's certificate and key, and, for mutual TLS, the CA whose
  client certificates it requires (`--tls-cert`, `--tls-key`, `--tls-client-ca`).
- `ClientTls`: the CA a client trusts (the system's when none), and its own
  certificate and key for a server that requires one (`--tls-ca`, `--tls-cert`,
  `--tls-key`; `TIMESLICE_TLS_CA`, `TIMESLICE_TLS_CERT`, `TIMESLICE_TLS_KEY`).
- `token_from_env()`: the bearer token of `TIMESLICE_TOKEN`.

Both configurations check their files when they are made, so that a wrong path
or a key of another certificate is one clear line at start-up, naming the option
it came from, not a handshake failure later. `context()` builds a fresh
`ssl.SSLContext` each time (TLS 1.2 at least, ALPN "h2", as gRPC needs).
"""

from __future__ import annotations

import logging
import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from timeslice.errors import InvalidArgumentError

log = logging.getLogger(__name__)

ENV_CA: Final = "TIMESLICE_TLS_CA"
ENV_CERT: Final = "TIMESLICE_TLS_CERT"
ENV_KEY: Final = "TIMESLICE_TLS_KEY"
ENV_TOKEN: Final = "TIMESLICE_TOKEN"

# HTTP/2 forbids the weaker TLS 1.2 suites (RFC 7540, 9.2.2); TLS 1.3 has only good ones.
_CIPHERS: Final = "ECDHE+AESGCM:ECDHE+CHACHA20:DHE+AESGCM:DHE+CHACHA20"
# A PEM file of certificates or a key larger than this is not one.
MAX_PEM_BYTES: Final = 1 << 20
MAX_TOKEN_CHARS: Final = 4096


@dataclass(frozen=True, kw_only=True)
class ServerTls:
    """A service's TLS: its certificate chain and key (PEM files), and, when
    `client_ca` is set, the CA that every client's certificate must be signed by
    (mTLS: a client without one, or with another CA's, fails the handshake).

    `names` is how errors name the options (`--tls-cert`, ...)."""

    cert: str
    key: str
    client_ca: str = ""
    names: str = field(default="--tls-", compare=False, repr=False)

    def __post_init__(self) -> None:
        if not self.cert or not self.key:
            raise InvalidArgumentError(
                f"{_option(self.names, 'cert')} and {_option(self.names, 'key')} go together: both are needed to serve TLS"
            )
        self.context()

    @property
    def mutual(self) -> bool:
        """Whether clients must present a certificate."""
        return bool(self.client_ca)

    def context(self) -> ssl.SSLContext:
        """A server context for grpclib: TLS >= 1.2, ALPN h2, the client certificate
        required and verified against `client_ca` when it is set."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.sslobject_class = _LoggedHandshake
        _h2(context)
        _load_pair(context, self.cert, self.key, self.names)
        if self.client_ca:
            _load_ca(context, self.client_ca, _option(self.names, "client_ca"))
            context.verify_mode = ssl.CERT_REQUIRED
        return context


@dataclass(frozen=True, kw_only=True)
class ClientTls:
    """A client's TLS: the CA that signed the server's certificate (empty: the
    system's trusted CAs), and the client's own certificate and key, for a server
    that requires one (both or neither).

    `names` is how errors name the options (`--tls-ca`, or `TIMESLICE_TLS_` for
    the environment's)."""

    ca: str = ""
    cert: str = ""
    key: str = ""
    names: str = field(default="--tls-", compare=False, repr=False)

    def __post_init__(self) -> None:
        if bool(self.cert) != bool(self.key):
            raise InvalidArgumentError(
                f"{_option(self.names, 'cert')} and {_option(self.names, 'key')} go together: give both or neither"
            )
        self.context()

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ClientTls | None:
        """The TLS of `TIMESLICE_TLS_CA`, `TIMESLICE_TLS_CERT` and `TIMESLICE_TLS_KEY`;
        None when none of them is set."""
        env = os.environ if environ is None else environ
        ca, cert, key = (env.get(name, "").strip() for name in (ENV_CA, ENV_CERT, ENV_KEY))
        if not (ca or cert or key):
            return None
        return cls(ca=ca, cert=cert, key=key, names="TIMESLICE_TLS_")

    def context(self) -> ssl.SSLContext:
        """A client context for grpclib: the server's certificate verified (against
        `ca` alone, or the system's CAs) with its host name, TLS >= 1.2, ALPN h2."""
        if self.ca:
            # The given CA alone: with the system's too, any public CA could vouch
            # for a server of this name.
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            _load_ca(context, self.ca, _option(self.names, "ca"))
        else:
            context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
        _h2(context)
        if self.cert:
            _load_pair(context, self.cert, self.key, self.names)
        return context


def token_from_env(environ: Mapping[str, str] | None = None) -> str | None:
    """The bearer token of `TIMESLICE_TOKEN` (None when unset or empty), checked."""
    env = os.environ if environ is None else environ
    token = env.get(ENV_TOKEN, "").strip()
    return check_token(token, ENV_TOKEN) if token else None


def check_token(token: str, what: str = "token") -> str:
    """`token` if it can travel as a bearer token: 1 to 4096 printable ASCII
    characters, no spaces."""
    if not 0 < len(token) <= MAX_TOKEN_CHARS or not all(33 <= ord(c) < 127 for c in token):
        raise InvalidArgumentError(
            f"{what}: a token is 1 to {MAX_TOKEN_CHARS} printable ASCII characters, no spaces"
        )
    return token


class _LoggedHandshake(ssl.SSLObject):
    """A server's TLS connection whose refused handshakes are logged: asyncio drops
    them silently (outside its debug mode), and a client certificate of the wrong
    CA, or none where one is required, is a refusal an operator should see."""

    def do_handshake(self) -> None:
        try:
            super().do_handshake()
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
            raise
        except ssl.SSLError as exc:
            reason = getattr(exc, "verify_message", None) or _reason(exc)
            log.warning("refused a TLS handshake: %s", reason)
            raise


def _option(names: str, field: str) -> str:
    """How an error names a field: an option (`--tls-client-ca`), an environment
    variable (`TIMESLICE_TLS_CERT`) or a file's key (`tls.client_ca`), by how
    `names` ends."""
    if names.endswith("-"):
        return names + field.replace("_", "-")
    if names.endswith("_"):
        return names + field.upper()
    return names + field


def _h2(context: ssl.SSLContext) -> None:
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_ciphers(_CIPHERS)
    context.set_alpn_protocols(["h2"])


def _pem(path: str, option: str, marker: bytes, kind: str) -> None:
    """Refuse, in one line, a file that is missing, unreadable or not a PEM `kind`."""
    try:
        with Path(path).open("rb") as file:
            head = file.read(MAX_PEM_BYTES + 1)
    except FileNotFoundError:
        raise InvalidArgumentError(f"{option}: {path}: no such file") from None
    except IsADirectoryError:
        raise InvalidArgumentError(f"{option}: {path} is a directory, not a file") from None
    except OSError as exc:
        raise InvalidArgumentError(f"{option}: cannot read {path}: {exc.strerror}") from None
    if len(head) > MAX_PEM_BYTES:
        raise InvalidArgumentError(f"{option}: {path} is over {MAX_PEM_BYTES} bytes")
    if marker not in head:
        raise InvalidArgumentError(f"{option}: {path} is not a PEM {kind}")


def _load_ca(context: ssl.SSLContext, path: str, option: str) -> None:
    _pem(path, option, b"-----BEGIN CERTIFICATE-----", "certificate")
    try:
        context.load_verify_locations(cafile=path)
    except ssl.SSLError as exc:
        raise InvalidArgumentError(f"{option}: {path}: not a usable CA ({_reason(exc)})") from None


def _load_pair(context: ssl.SSLContext, cert: str, key: str, names: str) -> None:
    cert_option, key_option = _option(names, "cert"), _option(names, "key")
    _pem(cert, cert_option, b"-----BEGIN CERTIFICATE-----", "certificate")
    _pem(key, key_option, b"PRIVATE KEY-----", "private key")

    def no_password() -> bytes:
        raise InvalidArgumentError(f"{key_option}: {key} is encrypted; give an unencrypted key")

    try:
        context.load_cert_chain(cert, key, password=no_password)
    except ssl.SSLError as exc:
        if "KEY_VALUES_MISMATCH" in str(exc) or "key values mismatch" in str(exc):
            raise InvalidArgumentError(
                f"{key_option}: {key} does not match {cert_option} {cert}"
            ) from None
        raise InvalidArgumentError(
            f"{cert_option}, {key_option}: {cert} and {key} cannot be used ({_reason(exc)})"
        ) from None


def _reason(exc: ssl.SSLError) -> str:
    return str(exc.reason or exc.strerror or exc).lower().replace("_", " ")
