"""deploy/make-certs.sh makes certificates that the services' own TLS accepts for the
names the manifests dial: the orchestrator's Service names, and the pod DNS name each
agent advertises (computed by the DaemonSet's own command, run here with a pod's
environment); a name outside them fails the handshake."""

from __future__ import annotations

import shlex
import socket
import ssl
import subprocess
import threading
from pathlib import Path

import pytest

from tests.optional import need, need_command
from timeslice.security.tls import ClientTls, ServerTls

yaml = need("yaml")

ROOT = Path(__file__).resolve().parents[2]
POD = {
    "PATH": "/usr/bin:/bin",
    "POD_IP": "10.244.3.17",
    "POD_NAMESPACE": "timeslice",
    "CLUSTER_DOMAIN": "cluster.local",
}


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    need_command("openssl")
    out = tmp_path_factory.mktemp("deploy-certs")
    subprocess.run(
        [str(ROOT / "deploy" / "make-certs.sh"), str(out)],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return out


def handshake(certs: Path, leaf: str, hostname: str) -> str:
    """'ok', or why a client trusting the CA refuses `leaf`'s certificate for `hostname`."""
    server = ServerTls(cert=str(certs / f"{leaf}.pem"), key=str(certs / f"{leaf}-key.pem"))
    client = ClientTls(ca=str(certs / "ca.pem")).context()
    ours, theirs = socket.socketpair()
    ours.settimeout(10)
    theirs.settimeout(10)

    def serve() -> None:
        try:
            with server.context().wrap_socket(theirs, server_side=True) as tls:
                tls.recv(1)
        except (ssl.SSLError, OSError):
            pass

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        with client.wrap_socket(ours, server_hostname=hostname) as tls:
            tls.sendall(b".")
        return "ok"
    except ssl.SSLCertVerificationError as exc:
        return exc.verify_message
    finally:
        ours.close()
        thread.join(10)


def advertised() -> str:
    """The --advertise address the agent's DaemonSet command makes for POD."""
    agent = ROOT / "deploy" / "base" / "agent.yaml"
    [daemonset] = [d for d in yaml.safe_load_all(agent.read_text()) if d["kind"] == "DaemonSet"]
    [box] = daemonset["spec"]["template"]["spec"]["containers"]
    shell, flag, script, zero = box["command"]
    assert (shell, flag) == ("/bin/sh", "-c") and script.startswith("exec timeslice ")
    echoed = subprocess.run(
        [shell, flag, "exec echo " + script.removeprefix("exec timeslice "), zero, "--x"],
        env=POD,
        capture_output=True,
        text=True,
        check=True,
        timeout=10,
    ).stdout
    [address] = [w.split("=", 1)[1] for w in shlex.split(echoed) if w.startswith("--advertise=")]
    return address


def test_the_agent_advertises_its_pod_dns_name() -> None:
    assert advertised() == "10-244-3-17.timeslice.pod.cluster.local:9001"


def test_the_agents_certificate_covers_the_name_it_advertises(certs: Path) -> None:
    host = advertised().rpartition(":")[0]
    assert handshake(certs, "agent", host) == "ok"
    assert "mismatch" in handshake(certs, "agent", "10-244-3-17.other.pod.cluster.local")


@pytest.mark.parametrize(
    "name",
    ["timeslice-orchestrator", "timeslice-orchestrator.timeslice.svc"],
)
def test_the_orchestrators_certificate_covers_its_service_names(certs: Path, name: str) -> None:
    assert handshake(certs, "orchestrator", name) == "ok"


def test_another_name_is_refused(certs: Path) -> None:
    assert "mismatch" in handshake(certs, "orchestrator", "timeslice-agent")
