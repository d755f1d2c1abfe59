"""TLS settings, the environment's credentials, and the rule that keeps a service
without TLS and auth on loopback: each bad input is one line naming the option."""

from __future__ import annotations

import ssl
import subprocess
from pathlib import Path

import pytest

from tests.certs import Certs
from timeslice.agent.config import AgentConfig
from timeslice.errors import InvalidArgumentError
from timeslice.orchestrator.config import OrchestratorConfig
from timeslice.security.exposure import check_exposure, is_loopback, left_open
from timeslice.security.principals import AuthPolicy
from timeslice.security.tls import ClientTls, ServerTls, check_token, token_from_env


def test_a_server_context_is_tls12_h2_and_asks_for_client_certs_only_with_a_client_ca(
    certs: Certs,
) -> None:
    plain = ServerTls(cert=certs.server.cert, key=certs.server.key)
    assert not plain.mutual
    context = plain.context()
    assert context.minimum_version == ssl.TLSVersion.TLSv1_2
    assert context.verify_mode == ssl.CERT_NONE
    mutual = ServerTls(cert=certs.server.cert, key=certs.server.key, client_ca=certs.ca)
    assert mutual.mutual and mutual.context().verify_mode == ssl.CERT_REQUIRED


def test_a_client_context_verifies_the_server_and_its_host_name(certs: Certs) -> None:
    pair = certs.client("trainer-a")
    context = ClientTls(ca=certs.ca, cert=pair.cert, key=pair.key).context()
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert context.minimum_version == ssl.TLSVersion.TLSv1_2
    assert len(context.get_ca_certs()) == 1


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda c: ServerTls(cert="/no/such.pem", key=c.server.key), "--tls-cert: /no/such.pem: no such file"),
        (lambda c: ServerTls(cert=c.server.cert, key=c.ca), "--tls-key: .*ca.pem is not a PEM private key"),
        (lambda c: ServerTls(cert=c.server.key, key=c.server.key), "--tls-cert: .* is not a PEM certificate"),
        (lambda c: ServerTls(cert=c.server.cert, key=c.other_client.key),
         "--tls-key: .*other-client-key.pem does not match --tls-cert .*server.pem"),
        (lambda c: ServerTls(cert=c.server.cert, key=""), "--tls-cert and --tls-key go together"),
        (lambda c: ServerTls(cert=c.server.cert, key=c.server.key, client_ca=c.folder),
         "--tls-client-ca: .* is a directory"),
        (lambda c: ClientTls(ca=c.server.key), "--tls-ca: .* is not a PEM certificate"),
        (lambda c: ClientTls(ca=c.ca, cert=c.server.cert), "--tls-cert and --tls-key go together"),
    ],
)  # fmt: skip
def test_bad_tls_files_are_refused_in_one_line_naming_the_option(
    certs: Certs, make: object, message: str
) -> None:
    with pytest.raises(InvalidArgumentError, match=message) as raised:
        make(certs)  # type: ignore[operator]
    assert "\n" not in str(raised.value)


def test_an_unreadable_or_encrypted_key_is_refused(certs: Certs, tmp_path: Path) -> None:
    unreadable = tmp_path / "key.pem"
    unreadable.write_bytes(Path(certs.server.key).read_bytes())
    unreadable.chmod(0)
    try:
        unreadable.read_bytes()
    except PermissionError:
        with pytest.raises(InvalidArgumentError, match="--tls-key: cannot read .*key.pem"):
            ServerTls(cert=certs.server.cert, key=str(unreadable))
    encrypted = tmp_path / "encrypted.pem"
    subprocess.run(
        ["openssl", "ec", "-in", certs.server.key, "-aes256", "-passout", "pass:x"]
        + ["-out", str(encrypted)],
        check=True,
        capture_output=True,
    )
    with pytest.raises(InvalidArgumentError, match="is encrypted"):
        ServerTls(cert=certs.server.cert, key=str(encrypted))


def test_the_environment_gives_tls_and_a_token_or_nothing(certs: Certs) -> None:
    assert ClientTls.from_env({}) is None
    assert token_from_env({"TIMESLICE_TOKEN": "  "}) is None
    assert ClientTls.from_env({"TIMESLICE_TLS_CA": certs.ca}) == ClientTls(ca=certs.ca)
    pair = certs.client("trainer-a")
    env = {"TIMESLICE_TLS_CA": certs.ca, "TIMESLICE_TLS_CERT": pair.cert}
    with pytest.raises(InvalidArgumentError, match="TIMESLICE_TLS_CERT and TIMESLICE_TLS_KEY"):
        ClientTls.from_env(env)
    env["TIMESLICE_TLS_KEY"] = pair.key
    assert ClientTls.from_env(env) == ClientTls(ca=certs.ca, cert=pair.cert, key=pair.key)
    assert token_from_env({"TIMESLICE_TOKEN": "s3cret\n"}) == "s3cret"
    with pytest.raises(InvalidArgumentError, match="TIMESLICE_TOKEN: a token is"):
        token_from_env({"TIMESLICE_TOKEN": "two words"})
    with pytest.raises(InvalidArgumentError):
        check_token("x" * 4097)


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("127.0.0.1", True), ("127.8.0.1", True), ("::1", True), ("[::1]", True),
     ("localhost", True), ("0.0.0.0", False), ("", False), ("::", False),
     ("10.0.0.5", False), ("gpu-1.lab", False)],
)  # fmt: skip
def test_what_counts_as_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_a_non_loopback_host_needs_tls_and_auth_or_insecure(certs: Certs) -> None:
    tls = ServerTls(cert=certs.server.cert, key=certs.server.key)
    policy = AuthPolicy(principals=())
    for config in (OrchestratorConfig, AgentConfig):
        for kwargs in ({}, {"tls": tls}, {"auth": policy}):
            with pytest.raises(InvalidArgumentError, match="refuses to listen on 0.0.0.0") as e:
                config(host="0.0.0.0", **kwargs)  # type: ignore[arg-type]
            assert "--insecure" in str(e.value)
        config(host="0.0.0.0", tls=tls, auth=policy)
        config(host="0.0.0.0", insecure=True)
        config(host="127.0.0.1")


def test_an_insecure_service_says_what_it_leaves_open() -> None:
    assert left_open("the agent", "127.0.0.1:1", host="127.0.0.1", tls=False, auth=False) is None
    assert left_open("the agent", "0.0.0.0:1", host="0.0.0.0", tls=True, auth=True) is None
    both = left_open("the orchestrator", "0.0.0.0:5", host="0.0.0.0", tls=False, auth=False)
    assert both is not None and both.startswith(
        "the orchestrator is serving on 0.0.0.0:5 without TLS and without authentication"
    )
    assert "force release" in both and "tokens included" in both
    no_tls = left_open("the agent", "0.0.0.0:5", host="0.0.0.0", tls=False, auth=True)
    assert no_tls is not None and "without TLS (--insecure)" in no_tls
    check_exposure("x", "0.0.0.0", tls=False, auth=False, insecure=True)


def test_the_config_file_takes_tls_and_auth_tables(certs: Certs, tmp_path: Path) -> None:
    from timeslice.config_file import read_orchestrator_config

    auth = tmp_path / "auth.toml"
    auth.write_text(
        '[[principal]]\nname = "ops"\ncert_subject = "CN=operator"\nrole = "operator"\n'
    )
    config = tmp_path / "orchestrator.toml"
    config.write_text(
        f'auth = "{auth}"\n'
        f'[tls]\ncert = "{certs.server.cert}"\nkey = "{certs.server.key}"\nclient_ca = "{certs.ca}"\n'
        f'[agent_tls]\nca = "{certs.ca}"\n'
    )
    values = read_orchestrator_config(config)
    assert values["tls"] == ServerTls(
        cert=certs.server.cert, key=certs.server.key, client_ca=certs.ca
    )
    assert values["agent_tls"] == ClientTls(ca=certs.ca)
    assert values["auth"].by_subject("CN=operator").name == "ops"
    OrchestratorConfig(host="0.0.0.0", **values)  # TLS and auth: any interface
    config.write_text(f'[tls]\ncert = "{certs.server.cert}"\nkey = "{certs.ca}"\n')
    with pytest.raises(InvalidArgumentError, match=r"orchestrator.toml: tls.key: .* is not a PEM"):
        read_orchestrator_config(config)
    config.write_text('[agent_tls]\ncafile = "x"\n')
    with pytest.raises(InvalidArgumentError, match=r"unknown key\(s\) agent_tls.cafile"):
        read_orchestrator_config(config)
