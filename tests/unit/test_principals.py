"""The auth file's principals and the rule of each role: who may do which verb on
which job, group and node; and the file's checks, one line each."""

from __future__ import annotations

from pathlib import Path

import pytest

from timeslice.errors import InvalidArgumentError, PermissionDeniedError
from timeslice.security.principals import (
    AuthPolicy,
    Principal,
    Role,
    Verb,
    check,
    parse_auth,
    read_auth_file,
    subject_of,
    token_sha256,
)

TRAINER = token_sha256("trainer-secret")
FILE = f"""
[[principal]]
name = "trainer-a"
token_sha256 = "{TRAINER}"
role = "job"
jobs = ["trainer-a", "trainer-a-*"]
groups = ["rollout", "train-*"]

[[principal]]
name = "gpu-1"
cert_subject = "CN=gpu-1,O=lab"
role = "agent"
nodes = ["gpu-1"]

[[principal]]
name = "ops"
token_sha256 = "{token_sha256("ops-secret")}"
role = "operator"

[[principal]]
name = "dashboard"
token_sha256 = "{token_sha256("view-secret")}"
role = "viewer"
groups = ["*"]
"""


@pytest.fixture
def policy(tmp_path: Path) -> AuthPolicy:
    path = tmp_path / "auth.toml"
    path.write_text(FILE)
    return read_auth_file(path)


def test_a_principal_is_found_by_its_token_or_its_certificate_subject(policy: AuthPolicy) -> None:
    trainer = policy.by_token("trainer-secret")
    assert trainer is not None and trainer.name == "trainer-a" and trainer.role is Role.JOB
    assert policy.by_token("trainer-secret ") is None
    assert policy.by_token(TRAINER) is None  # the hash itself is no token
    agent = policy.by_subject("CN=gpu-1,O=lab")
    assert agent is not None and agent.role is Role.AGENT
    assert policy.by_subject("CN=gpu-1") is None


def test_a_job_acts_only_as_its_jobs_and_on_its_groups(policy: AuthPolicy) -> None:
    trainer = policy.by_token("trainer-secret")
    assert trainer is not None
    check(trainer, Verb.ACQUIRE, job="trainer-a", group="rollout")
    check(trainer, Verb.YIELD, job="trainer-a-2", group="train-x")
    with pytest.raises(PermissionDeniedError, match="trainer-a may not act as job alice"):
        check(trainer, Verb.ACQUIRE, job="alice", group="rollout")
    with pytest.raises(PermissionDeniedError, match="may not touch group other"):
        check(trainer, Verb.ACQUIRE, job="trainer-a", group="other")
    for verb in (Verb.FORCE_RELEASE, Verb.RESET_JOB, Verb.SET_GROUP_NODES, Verb.AGENT_SESSION):
        with pytest.raises(PermissionDeniedError, match=r"\(job\) may not"):
            check(trainer, verb, job="trainer-a", group="rollout")
    assert trainer.may_touch("rollout") and not trainer.may_touch("other")


def test_an_agent_registers_only_as_its_nodes(policy: AuthPolicy) -> None:
    agent = policy.by_subject("CN=gpu-1,O=lab")
    assert agent is not None
    check(agent, Verb.AGENT_SESSION, node="gpu-1")
    with pytest.raises(PermissionDeniedError, match="may not act as node gpu-2"):
        check(agent, Verb.AGENT_SESSION, node="gpu-2")
    with pytest.raises(PermissionDeniedError):
        check(agent, Verb.ACQUIRE, job="gpu-1", group="g")
    check(agent, Verb.STATUS, group="g")  # to check a fencing token it is sent
    for verb in (Verb.YIELD, Verb.FORCE_RELEASE, Verb.SET_GROUP_NODES, Verb.RESET_JOB):
        with pytest.raises(PermissionDeniedError, match=r"\(agent\) may not"):
            check(agent, verb, group="g")


def test_an_operator_may_do_everything_and_a_viewer_only_look(policy: AuthPolicy) -> None:
    ops, viewer = policy.by_token("ops-secret"), policy.by_token("view-secret")
    assert ops is not None and viewer is not None
    for verb in Verb:
        check(ops, verb, job="anyone", group="any", node="gpu-9")
    check(viewer, Verb.STATUS, group="rollout")
    check(viewer, Verb.WATCH, group="rollout")
    for verb in (Verb.ACQUIRE, Verb.YIELD, Verb.KEEP_ALIVE, Verb.FORCE_RELEASE, Verb.SWITCH):
        with pytest.raises(PermissionDeniedError, match=r"dashboard \(viewer\)"):
            check(viewer, verb, group="rollout")


def test_a_certificate_subject_reads_as_the_auth_file_names_it() -> None:
    cert = {"subject": ((("commonName", "gpu-1"),), (("organizationName", "lab"),))}
    assert subject_of(cert) == "CN=gpu-1,O=lab"
    assert subject_of(None) == subject_of({}) == ""


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('[[principal]]\nname = "a"\nrole = "job"\njobs = ["a"]\ngroups = ["*"]', "exactly one of"),
        (
            f'[[principal]]\nname = "a"\nrole = "boss"\ntoken_sha256 = "{TRAINER}"',
            "role must be one of",
        ),
        ('[[principal]]\nname = "a"\nrole = "job"\ntoken_sha256 = "abc"', "64 hex digits"),
        (
            f'[[principal]]\nname = "a"\nrole = "job"\ntoken_sha256 = "{TRAINER}"\ngroups = ["*"]',
            "needs jobs",
        ),
        (
            f'[[principal]]\nname = "a"\nrole = "agent"\ntoken_sha256 = "{TRAINER}"\n'
            'nodes = ["n"]\njobs = ["a"]',
            "jobs means nothing for a agent",
        ),
        (
            f'[[principal]]\nname = "a"\nrole = "operator"\ntoken = "{TRAINER}"',
            "unknown key 'token'",
        ),
        ("principals = []", "unknown key 'principals'"),
        (
            f'[[principal]]\nname = "a"\nrole = "operator"\ntoken_sha256 = "{TRAINER}"\n'
            f'[[principal]]\nname = "b"\nrole = "operator"\ntoken_sha256 = "{TRAINER}"',
            "same token",
        ),
        (
            f'[[principal]]\nname = "a"\nrole = "operator"\ntoken_sha256 = "{TRAINER}"\n'
            f'[[principal]]\nname = "a"\nrole = "operator"\ncert_subject = "CN=a"',
            "same name",
        ),
        ("[[principal]]\nname = 3", "name must be a string"),
        (
            f'[[principal]]\nname = "a"\nrole = "job"\ntoken_sha256 = "{TRAINER}"\n'
            'jobs = ["a"]\ngroups = ["*"]\nuids = [0]',
            "may not name root",
        ),
        (
            f'[[principal]]\nname = "a"\nrole = "job"\ntoken_sha256 = "{TRAINER}"\n'
            'jobs = ["a"]\ngroups = ["*"]\nuids = ["alice"]',
            "uids must be a list of user ids",
        ),
        (
            f'[[principal]]\nname = "a"\nrole = "job"\ntoken_sha256 = "{TRAINER}"\n'
            'jobs = ["a"]\ngroups = ["*"]\nuids = [-1]',
            "uid -1 is not a user id",
        ),
        (
            f'[[principal]]\nname = "a"\nrole = "operator"\ntoken_sha256 = "{TRAINER}"\n'
            "uids = [1001]",
            "uids means nothing for a operator",
        ),
    ],
)
def test_a_bad_auth_file_is_refused_with_the_file_and_the_problem(
    tmp_path: Path, text: str, problem: str
) -> None:
    path = tmp_path / "auth.toml"
    path.write_text(text)
    with pytest.raises(InvalidArgumentError, match=problem) as caught:
        read_auth_file(path)
    assert str(path) in str(caught.value) and "\n" not in str(caught.value)


def test_an_unreadable_or_garbled_file_says_so(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="cannot read the auth file"):
        read_auth_file(tmp_path / "missing.toml")
    (tmp_path / "bad.toml").write_text("[[principal]\n")
    with pytest.raises(InvalidArgumentError, match="not a valid TOML file"):
        read_auth_file(tmp_path / "bad.toml")


def test_a_job_principal_names_the_users_its_processes_run_as(tmp_path: Path) -> None:
    path = tmp_path / "auth.toml"
    path.write_text(
        f'[[principal]]\nname = "a"\nrole = "job"\ntoken_sha256 = "{TRAINER}"\n'
        'jobs = ["a"]\ngroups = ["*"]\nuids = [1001, 1002]'
    )
    policy = read_auth_file(path)
    found = policy.by_name("a")
    assert found is not None and found.uids == (1001, 1002)
    assert policy.by_name("b") is None


def test_a_policy_may_be_built_in_code() -> None:
    p = Principal(name="j", role=Role.JOB, token_sha256=TRAINER, jobs=("j",), groups=("g",))
    assert AuthPolicy((p,)).by_token("trainer-secret") is p
    assert parse_auth({}).principals == ()
