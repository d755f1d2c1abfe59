"""The `serve` commands' options from the environment: every option has its
`TIMESLICE_<OPTION>` variable (an option added later without one fails here),
the file < environment < command line precedence, `NODE_NAME`, and a bad value
refused in one line that names the variable."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.core import TyperOption
from typer.testing import CliRunner

from timeslice.cli import app
from timeslice.cli_env import env_name
from timeslice.cli_errors import CommandError

SERVE = typer.main.get_command(app).commands["serve"]  # type: ignore[attr-defined]
COMMANDS = dict(SERVE.commands)  # every serve command, those added later too
assert {"orchestrator", "agent"} <= set(COMMANDS)


def options(command: Any) -> list[TyperOption]:
    return [p for p in command.params if isinstance(p, TyperOption)]


def a_value(option: TyperOption) -> tuple[str, Any]:
    """A value for `option` in the environment, and what the command must read from it."""
    if option.is_flag:
        return "true", True
    kind = option.type_descriptor.annotation
    if option.multiple:
        return "g=n1,n2  h=n3", ("g=n1,n2", "h=n3")
    if kind is int:
        return "7", 7
    if kind is float:
        return "2.5", 2.5
    return "some-value", "some-value"


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No TIMESLICE_* or NODE_NAME variable of the machine running the tests."""
    for name in list(os.environ):
        if name.startswith("TIMESLICE_") or name == "NODE_NAME":
            monkeypatch.delenv(name)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_serve_option_is_read_from_its_variable(
    command: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    cmd = COMMANDS[command]
    found = options(cmd)
    assert len(found) > 20  # the walk sees the options, not an empty list
    for option in found:
        variable = env_name(option)
        long = max((o for o in option.opts if o.startswith("--")), key=len)
        assert variable == "TIMESLICE_" + long[2:].upper().replace("-", "_")
        assert option.envvar and variable == option.envvar[0], option.name
        text, expected = a_value(option)
        with monkeypatch.context() as env:
            env.setenv(variable, text)
            ctx = cmd.make_context(command, [])
        assert getattr(ctx.get_parameter_source(option.name), "name", "") == "ENVIRONMENT"
        value = ctx.params[option.name]
        assert (tuple(value) if option.multiple else value) == expected, option.name


class Built(CommandError):
    """Raised where the server would start, once its config is built."""


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The configs `timeslice serve ...` builds; the servers themselves never start."""
    configs: list[Any] = []

    class Fake:
        def __init__(self, config: Any) -> None:
            configs.append(config)

        async def __aenter__(self) -> Fake:
            raise Built("built")

        async def __aexit__(self, *exc: object) -> None:
            pass

    monkeypatch.setattr("timeslice.orchestrator.server.Orchestrator", Fake)
    monkeypatch.setattr("timeslice.agent.server.Agent", Fake)
    monkeypatch.setattr("timeslice.api.serving.tune_gc_for_serving", lambda: None)
    return configs


def serve(*args: str, **env: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["serve", *args], env=env)
    return result.exit_code, result.stderr


def test_environment_beats_the_file_and_the_command_line_beats_both(
    built: list[Any], tmp_path: Path
) -> None:
    config = tmp_path / "orchestrator.toml"
    config.write_text('db = "memory"\nswitch_timeout = 10\nmax_watchers = 5\npolicy = "lrs"\n')
    code, _ = serve(
        "orchestrator",
        TIMESLICE_CONFIG=str(config),
        TIMESLICE_SWITCH_TIMEOUT="20",
        TIMESLICE_MAX_WATCHERS="6",
        TIMESLICE_GROUP_NODES="g=n1,n2 h=n3",
    )
    assert code == 1 and len(built) == 1
    assert built[0].switch_timeout == 20 and built[0].max_watchers == 6
    assert built[0].policy == "lrs"  # from the file: nothing else set it
    assert built[0].group_nodes == {"g": ("n1", "n2"), "h": ("n3",)}

    code, _ = serve(
        "orchestrator",
        "--switch-timeout",
        "30",
        "--max-watchers",
        "8",
        TIMESLICE_CONFIG=str(config),
        TIMESLICE_SWITCH_TIMEOUT="20",
        TIMESLICE_MAX_WATCHERS="6",
    )
    assert built[1].switch_timeout == 30 and built[1].max_watchers == 8


def test_the_agent_takes_its_node_name_from_node_name(built: list[Any]) -> None:
    serve("agent", "--db", "memory", NODE_NAME="k8s-node-7")
    serve("agent", "--db", "memory", NODE_NAME="k8s-node-7", TIMESLICE_NODE_NAME="mine")
    serve("agent", "--db", "memory", "--node-name", "cli", TIMESLICE_NODE_NAME="mine")
    assert [c.node_name for c in built] == ["k8s-node-7", "mine", "cli"]


def test_the_agent_takes_repeatable_options_as_a_list(built: list[Any]) -> None:
    serve("agent", "--db", "memory", TIMESLICE_BACKEND="noop app_channel", TIMESLICE_GROUP="a b")
    assert built[0].backends == ("noop", "app_channel") and built[0].groups == ("a", "b")


@pytest.mark.parametrize(
    ("command", "variable", "value", "says"),
    [
        ("orchestrator", "TIMESLICE_PORT", "fifty", "(for --port)"),
        ("agent", "TIMESLICE_OPERATION_TIMEOUT", "soon", "(for --operation-timeout)"),
        ("agent", "TIMESLICE_INSECURE", "maybe", "(for --insecure)"),
        ("orchestrator", "TIMESLICE_LOG_LEVEL", "LOUD", "unknown level 'LOUD'"),
        ("agent", "TIMESLICE_LOG_FORMAT", "xml", "unknown format 'xml'"),
        ("orchestrator", "TIMESLICE_PORT", "tcp://10.0.0.1:50051", "enableServiceLinks"),
    ],
)
def test_a_bad_value_in_the_environment_is_one_line_naming_the_variable(
    built: list[Any], command: str, variable: str, value: str, says: str
) -> None:
    code, stderr = serve(command, "--db", "memory", **{variable: value})
    assert code == 2 and not built
    [line] = stderr.splitlines()
    assert line.startswith(f"error: {variable}: ") and says in line


def test_a_config_error_names_the_variables_that_were_set(built: list[Any]) -> None:
    code, stderr = serve("orchestrator", "--db", "memory", TIMESLICE_POLICY="bogus")
    [line] = stderr.splitlines()
    assert code == 2 and "unknown policy 'bogus'" in line and "TIMESLICE_POLICY" in line


def test_a_bad_log_level_on_the_command_line_is_still_one_line(built: list[Any]) -> None:
    code, stderr = serve("agent", "--db", "memory", "--log-level", "LOUD")
    [line] = stderr.splitlines()
    assert code == 2 and line.startswith("error: --log-level: unknown level 'LOUD'")
