"""The `serve` commands' options from the environment: every option `--some-name`
is also read from `TIMESLICE_SOME_NAME` (a container's usual way of being
configured), with the precedence file < environment < command line.

One mechanism covers every option, those added later included: `EnvCommand`, the
commands' click class, names each option's variable from its long name when
the command is built, and click reads it (`ParameterSource.ENVIRONMENT`) when
the command line does not give the option. A repeatable option takes a list
separated by spaces (its values, `GROUP=NODE,NODE`, hold commas of their own).
An option that declares variables of its own (`--node-name`: `NODE_NAME`, as a
Kubernetes downward API sets it) keeps them, after the `TIMESLICE_` one, which wins.

A value from the environment that click cannot read is refused with one line
that names the variable, exit status 2, as for a bad option.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, Final

import typer
from typer.core import TyperCommand, TyperOption

ENV_PREFIX: Final = "TIMESLICE_"
# Where a parameter's value came from, as click names its `ParameterSource`s.
_COMMAND_LINE: Final = "COMMANDLINE"
_ENVIRONMENT: Final = "ENVIRONMENT"


def _source(ctx: typer.Context, name: str) -> str:
    return getattr(ctx.get_parameter_source(name), "name", "")


def env_name(option: TyperOption) -> str:
    """`TIMESLICE_SOME_NAME` of `--some-name` (its longest long name)."""
    longs = [o for o in option.opts if o.startswith("--")] or list(option.opts)
    name = max(longs, key=len).lstrip("-")
    return ENV_PREFIX + name.upper().replace("-", "_")


def env_names(option: TyperOption) -> list[str]:
    """The variables `option` is read from, first found wins."""
    own = option.envvar
    declared = [own] if isinstance(own, str) else list(own or ())
    name = env_name(option)
    return [name, *(v for v in declared if v != name)]


class EnvCommand(TyperCommand):
    """A typer command whose every option can come from `TIMESLICE_<OPTION>`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for param in self.params:
            if isinstance(param, TyperOption):
                param.envvar = env_names(param)
                param.show_envvar = True

    # `ctx` is typer's (vendored) click Context, which typer does not name publicly.
    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except typer.BadParameter as exc:
            param = exc.param
            if param is None or param.name is None or _source(ctx, param.name) != _ENVIRONMENT:
                raise
            variable = _variable_used(param)
            hint = param.opts[0] if param.opts else param.name
            advice = _advice(os.environ.get(variable, ""))
            typer.echo(f"error: {variable}: {exc.message} (for {hint}){advice}", err=True)
            raise typer.Exit(2) from None


def _variable_used(param: Any) -> str:
    envvar = param.envvar
    names: list[str] = list(envvar) if isinstance(envvar, list | tuple) else [envvar or ""]
    return next((n for n in names if os.environ.get(n)), names[0])


def _advice(value: str) -> str:
    # Kubernetes sets <SERVICE>_PORT=tcp://IP:PORT in every pod of a namespace for
    # each Service: one named "timeslice" would set TIMESLICE_PORT.
    if value.startswith(("tcp://", "udp://")):
        return (
            "; a Kubernetes Service link? name the Service otherwise or set"
            " enableServiceLinks: false"
        )
    return ""


def given(ctx: typer.Context, name: str) -> bool:
    """Whether option `name` was set, on the command line or in the environment (not
    left at its default)."""
    return _source(ctx, name) in (_COMMAND_LINE, _ENVIRONMENT)


def from_environment(ctx: typer.Context) -> list[str]:
    """The variables the options of this run were read from."""
    return [
        _variable_used(param)
        for param in ctx.command.params
        if param.name and _source(ctx, param.name) == _ENVIRONMENT
    ]


def source_name(ctx: typer.Context, name: str, option: str) -> str:
    """How an error names option `name`: its variable if the environment set it,
    else `option` (`--log-level`)."""
    if _source(ctx, name) == _ENVIRONMENT:
        param = next((p for p in ctx.command.params if p.name == name), None)
        if param is not None:
            return _variable_used(param)
    return option


def environment_note(ctx: typer.Context, names: Sequence[str] | None = None) -> str:
    """ " (options from the environment: TIMESLICE_X, ...)", or "" when none: what a
    configuration error adds, so that a bad variable is found."""
    used = list(names) if names is not None else from_environment(ctx)
    return f" (options from the environment: {', '.join(used)})" if used else ""
