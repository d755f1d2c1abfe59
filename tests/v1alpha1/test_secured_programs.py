"""Programs written for the v1alpha1 Python client run unchanged against our servers
with TLS and an auth file, given only TIMESLICE_TLS_CA and TIMESLICE_TOKEN in their
environment: they see what they see against the open servers."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.certs import Certs
from tests.integration.grpcio_compat import serving_in_thread
from tests.v1alpha1.conftest import run_program
from tests.v1alpha1.test_v1alpha1_programs import AGENT_SEES, ORCHESTRATOR_SEES
from timeslice.agent.server import Agent
from timeslice.orchestrator.server import Orchestrator
from timeslice.security.principals import AuthPolicy, Principal, Role, token_sha256
from timeslice.security.tls import ServerTls

pytestmark = pytest.mark.timeout(120)

JOB_TOKEN = "jobs-token-for-the-programs"
OPERATOR_TOKEN = "operator-token-for-the-programs"
POLICY = AuthPolicy(
    principals=(
        Principal(
            name="programs",
            role=Role.JOB,
            token_sha256=token_sha256(JOB_TOKEN),
            jobs=("job-*",),
            groups=("*",),
        ),
        Principal(name="ops", role=Role.OPERATOR, token_sha256=token_sha256(OPERATOR_TOKEN)),
    )
)


def tls(certs: Certs) -> ServerTls:
    return ServerTls(cert=certs.server.cert, key=certs.server.key)


@pytest.fixture
def secured_orchestrator(certs: Certs, tmp_path: Path) -> Iterator[str]:
    db = f"sqlite:///{tmp_path / 'journal.db'}"
    with serving_in_thread(
        lambda: Orchestrator(db=db, port=0, tls=tls(certs), auth=POLICY), "orchestrator"
    ) as address:
        yield address


@pytest.fixture
def secured_agent(certs: Certs, tmp_path: Path) -> Iterator[str]:
    db = f"sqlite:///{tmp_path / 'agent.db'}"

    def agent() -> Agent:
        return Agent(
            node_name="n1", db=db, backends=("noop", "app_channel"), tls=tls(certs), auth=POLICY
        )

    with serving_in_thread(agent, "agent", lambda a: a.table.validate()) as address:
        yield address


def test_the_orchestrator_program_sees_the_same_with_tls_and_a_token_from_the_environment(
    secured_orchestrator: str, certs: Certs, tmp_path: Path
) -> None:
    env = {"TIMESLICE_TLS_CA": certs.ca, "TIMESLICE_TOKEN": JOB_TOKEN}
    seen = run_program(
        Path(sys.executable), "orchestrator_calls.py", secured_orchestrator, "g",
        cwd=tmp_path, env=env,
    )  # fmt: skip
    assert seen == ORCHESTRATOR_SEES


def test_the_agent_program_sees_the_same_with_tls_and_a_token_from_the_environment(
    secured_agent: str, certs: Certs, tmp_path: Path
) -> None:
    env = {"TIMESLICE_TLS_CA": certs.ca, "TIMESLICE_TOKEN": OPERATOR_TOKEN}
    seen = run_program(Path(sys.executable), "agent_calls.py", secured_agent, cwd=tmp_path, env=env)
    assert seen == AGENT_SEES
