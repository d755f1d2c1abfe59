"""`timeslice auth add-token`: a new token, shown once, and the auth file entry the
server accepts for it; an entry the server would refuse is refused here."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from timeslice.cli import app
from timeslice.errors import InvalidArgumentError
from timeslice.security.principals import Role, read_auth_file, token_sha256
from timeslice.security.tokens import new_token, principal_entry


def add_token(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, ["auth", "add-token", *args])
    return result.exit_code, result.stdout, result.stderr


def token_of(stderr: str) -> str:
    [line] = [line for line in stderr.splitlines() if "shown only now" in line]
    return line.rsplit(" ", 1)[1]


def test_the_entry_goes_to_the_auth_file_and_the_token_names_its_principal(
    tmp_path: Path,
) -> None:
    code, entry, stderr = add_token(
        "trainer-a", "--role", "job", "--job", "trainer-a", "--job", "trainer-a-*", "--group", "*"
    )
    assert code == 0, stderr
    token = token_of(stderr)
    assert len(token) >= 43 and token not in entry  # the file keeps only its SHA-256
    assert f'token_sha256 = "{token_sha256(token)}"' in entry
    auth = tmp_path / "auth.toml"
    _, other, _ = add_token("ops", "--role", "operator")
    auth.write_text(entry + "\n" + other)
    policy = read_auth_file(auth)
    principal = policy.by_token(token)
    assert principal is not None and principal.name == "trainer-a"
    assert principal.role is Role.JOB
    assert principal.jobs == ("trainer-a", "trainer-a-*") and principal.groups == ("*",)
    assert principal.may_act_as("trainer-a-7") and not principal.may_act_as("trainer-b")
    assert principal.uids == ()
    code, entry, _ = add_token(
        "b", "--role", "job", "--job", "b", "--group", "g", "--uid", "1001", "--uid", "1002"
    )
    assert code == 0 and "uids = [1001, 1002]" in entry


def test_every_token_is_new() -> None:
    tokens = {token_of(add_token("v", "--role", "viewer", "--group", "g")[2]) for _ in range(3)}
    assert len(tokens) == 3 and len({new_token() for _ in range(100)}) == 100


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["a", "--role", "boss"], "role must be one of job, agent, operator, viewer"),
        (["a", "--role", "job", "--group", "*"], "job principal needs jobs"),
        (["a", "--role", "agent"], "agent principal needs nodes"),
        (["a", "--role", "agent", "--node", "n", "--job", "j"], "jobs means nothing"),
        (["a", "--role", "viewer", "--group", "x" * 300], "longer than 256 bytes"),
        (["a", "--role", "job", "--job", "a", "--group", "g", "--uid", "0"], "may not name root"),
        (["a", "--role", "operator", "--uid", "1001"], "uids means nothing"),
    ],
)
def test_an_entry_the_server_would_refuse_is_refused(args: list[str], why: str) -> None:
    code, entry, stderr = add_token(*args)
    assert code == 2 and entry == ""
    assert why in stderr and "shown only now" not in stderr
    assert len(stderr.strip().splitlines()) == 1


def test_names_and_patterns_are_quoted_as_toml() -> None:
    text, principal = principal_entry('we"ird\\name', "viewer", "t", groups=['g"1', "ü-*"])
    assert principal.name == 'we"ird\\name' and principal.groups == ('g"1', "ü-*")
    with pytest.raises(InvalidArgumentError, match="control characters"):
        principal_entry("a\x7f", "viewer", "t", groups=["g"])
