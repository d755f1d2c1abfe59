"""Certificates for tests, made with `openssl` in a temporary folder.

`make_certs(folder)` writes:

- a CA (`ca`), and a server certificate it signed (`server`) for 127.0.0.1 and
  localhost (subjectAltName IP:127.0.0.1, IP:::1, DNS:localhost);
- client certificates it signed, one per subject in `CLIENT_SUBJECTS`
  (`client("trainer-a")` -> the pair for CN=trainer-a);
- a second CA of its own (`other_ca`), unrelated to the first, and a client
  certificate it signed (`other_client`, CN=trainer-a too, so that only the CA
  tells them apart).

The session-scoped fixture `certs` (in tests/conftest.py) makes one set for the
whole run; import `make_certs` for a set of your own.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

# The client certificates every set has (their CN).
CLIENT_SUBJECTS = ("trainer-a", "trainer-b", "agent-gpu-1", "operator", "orchestrator")


@dataclass(frozen=True, kw_only=True)
class CertPair:
    """A certificate and its private key (PEM files)."""

    cert: str
    key: str


@dataclass(frozen=True, kw_only=True)
class Certs:
    """One set of test certificates: every path is a PEM file."""

    folder: str
    ca: str
    server: CertPair
    clients: dict[str, CertPair] = field(default_factory=dict)
    other_ca: str
    other_client: CertPair

    def client(self, cn: str) -> CertPair:
        """The client certificate of CN=`cn`, signed by `ca`."""
        return self.clients[cn]


def have_openssl() -> bool:
    """Whether the `openssl` command is there."""
    return shutil.which("openssl") is not None


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=30)


def _new_ca(folder: Path, name: str) -> tuple[str, str]:
    cert, key = folder / f"{name}.pem", folder / f"{name}-key.pem"
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-days",
        "2",
        "-subj",
        f"/CN={name}",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
        "-keyout",
        str(key),
        "-out",
        str(cert),
    )
    return str(cert), str(key)


def _signed(folder: Path, name: str, subject: str, ca: tuple[str, str], ext: str) -> CertPair:
    """A key and a certificate for `subject`, signed by `ca` with the extensions `ext`."""
    cert, key, csr = folder / f"{name}.pem", folder / f"{name}-key.pem", folder / f"{name}.csr"
    extfile = folder / f"{name}.ext"
    extfile.write_text(ext)
    _openssl(
        "req",
        "-new",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-subj",
        subject,
        "-keyout",
        str(key),
        "-out",
        str(csr),
    )
    _openssl(
        "x509",
        "-req",
        "-in",
        str(csr),
        "-CA",
        ca[0],
        "-CAkey",
        ca[1],
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        str(extfile),
        "-out",
        str(cert),
    )
    return CertPair(cert=str(cert), key=str(key))


_SERVER_EXT = (
    "basicConstraints=CA:FALSE\n"
    "keyUsage=critical,digitalSignature,keyEncipherment\n"
    "extendedKeyUsage=serverAuth,clientAuth\n"
    "subjectAltName=IP:127.0.0.1,IP:::1,DNS:localhost\n"
)
_CLIENT_EXT = (
    "basicConstraints=CA:FALSE\n"
    "keyUsage=critical,digitalSignature,keyEncipherment\n"
    "extendedKeyUsage=clientAuth\n"
)


def make_certs(folder: Path, subjects: tuple[str, ...] = CLIENT_SUBJECTS) -> Certs:
    """A CA, a server certificate for 127.0.0.1/localhost, a client certificate per
    CN in `subjects`, and an unrelated CA with a client certificate, under `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    ca = _new_ca(folder, "ca")
    other = _new_ca(folder, "other-ca")
    server = _signed(folder, "server", "/CN=localhost", ca, _SERVER_EXT)
    clients = {cn: _signed(folder, f"client-{cn}", f"/CN={cn}", ca, _CLIENT_EXT) for cn in subjects}
    other_client = _signed(folder, "other-client", "/CN=trainer-a", other, _CLIENT_EXT)
    return Certs(
        folder=str(folder),
        ca=ca[0],
        server=server,
        clients=clients,
        other_ca=other[0],
        other_client=other_client,
    )
