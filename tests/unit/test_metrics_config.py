"""The metrics port in the configurations: the TOML file's keys, the checks, and
the serve commands' options."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from timeslice.agent.config import AgentConfig
from timeslice.cli import app
from timeslice.config_file import read_orchestrator_config
from timeslice.errors import InvalidArgumentError
from timeslice.orchestrator.config import OrchestratorConfig


def test_the_config_file_sets_the_metrics_port_and_host(tmp_path: Path) -> None:
    path = tmp_path / "orchestrator.toml"
    path.write_text('metrics_port = 9090\nmetrics_host = "0.0.0.0"\n')
    values = read_orchestrator_config(path)
    assert values == {"metrics_port": 9090, "metrics_host": "0.0.0.0"}
    config = OrchestratorConfig(**values)
    assert (config.metrics_port, config.metrics_host, config.host) == (9090, "0.0.0.0", "127.0.0.1")
    path.write_text('metrics_port = "9090"\n')
    with pytest.raises(InvalidArgumentError, match="metrics_port"):
        read_orchestrator_config(path)


@pytest.mark.parametrize("config", [OrchestratorConfig, AgentConfig])
def test_metrics_are_off_by_default_and_bad_ports_are_refused(config: type) -> None:
    assert config().metrics_port == 0 and config().metrics_host is None
    for port in (-1, 65536):
        with pytest.raises(InvalidArgumentError, match="metrics port"):
            config(metrics_port=port)
    with pytest.raises(InvalidArgumentError, match="metrics host"):
        config(metrics_port=9090, metrics_host="")


@pytest.mark.parametrize("server", ["orchestrator", "agent"])
def test_serve_refuses_a_bad_metrics_port(server: str) -> None:
    result = CliRunner().invoke(
        app, ["serve", server, "--port", "0", "--db", "memory", "--metrics-port", "70000"]
    )
    assert result.exit_code == 2, result.output
    assert "metrics port 70000 is out of range" in result.output
