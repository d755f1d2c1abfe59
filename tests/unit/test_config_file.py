"""The orchestrator's TOML configuration file."""

from __future__ import annotations

from pathlib import Path

import pytest

from timeslice.config_file import read_orchestrator_config
from timeslice.errors import InvalidArgumentError
from timeslice.orchestrator.server import OrchestratorConfig


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "orchestrator.toml"
    path.write_text(text)
    return path


def test_every_setting_and_the_group_tables_are_read(tmp_path: Path) -> None:
    path = write(tmp_path, """
db = "sqlite:///journal.db"
hold_limit = 900
policy = "priority"
switch_timeout = 30.5
[group_nodes]
rollout = ["gpu-1", "gpu-2"]
trainer = ["10.0.0.7:9001"]
[hold_limits]
rollout = 600
[policies]
trainer = "lrs"
""")  # fmt: skip
    values = read_orchestrator_config(path)
    assert values == {
        "db": "sqlite:///journal.db",
        "hold_limit": 900,
        "policy": "priority",
        "switch_timeout": 30.5,
        "group_nodes": {"rollout": ("gpu-1", "gpu-2"), "trainer": ("10.0.0.7:9001",)},
        "hold_limits": {"rollout": 600},
        "policies": {"trainer": "lrs"},
    }
    config = OrchestratorConfig(**values)
    assert config.group_nodes["rollout"] == ("gpu-1", "gpu-2")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("bogus = 1", "unknown key"),
        ("[group_nodes]\nrollout = 'gpu-1'", "list of nodes"),
        ("[group_nodes]\nrollout = [1, 2]", "list of nodes"),
        ("group_nodes = 3", "table of groups"),
        ("[hold_limits]\ng = 'long'", "number of seconds"),
        ("[policies]\ng = 3", "policy's name"),
        ("policy = ['fifo']", "single value"),
        ("port = ", "not valid TOML"),
    ],
)
def test_bad_files_are_refused_naming_the_key(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        read_orchestrator_config(write(tmp_path, text))


def test_a_missing_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="cannot read"):
        read_orchestrator_config(tmp_path / "nowhere.toml")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('hold_limit = "ten"', "hold_limit must be a number, not the string 'ten'"),
        ('port = "x"', "port must be an integer, not the string 'x'"),
        ("port = 1.5", "port must be an integer, not 1.5"),
        ("port = true", "port must be an integer, not true"),
        ("db = 3", "db must be a string, not 3"),
        ("policy = 1979-05-27", "policy must be a string, not datetime.date"),
        ("[hold_limits]\ng = true", "hold_limits.g must be a number of seconds"),
    ],
)
def test_a_value_of_the_wrong_type_names_the_file_the_key_and_the_type(
    tmp_path: Path, text: str, message: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(InvalidArgumentError) as caught:
        read_orchestrator_config(path)
    assert caught.value.message.startswith(f"{path}: ")
    assert message in caught.value.message


def test_integers_are_numbers_too(tmp_path: Path) -> None:
    values = read_orchestrator_config(write(tmp_path, "hold_limit = 10\nswitch_timeout = 2.5"))
    assert OrchestratorConfig(**values).hold_limit == 10
