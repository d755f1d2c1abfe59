"""The `timeslice` command line. It parses options, builds the same classes a
program embeds, and runs them; nothing here decides anything on its own. The
servers' commands are in `cli_serve`, the operator's in `cli_ops`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import anyio
import typer

from timeslice.cli_client import DEFAULT_TARGET, Target
from timeslice.cli_client import credentials_of as _credentials
from timeslice.cli_client import with_client as _with_client
from timeslice.cli_ops import JsonOutput, VersionOption, agent_app, inspect, watch
from timeslice.cli_credentials import ClientTlsCert, ClientTlsKey, TlsCa, Token
from timeslice.cli_errors import CommandError, Scope, debugging, user_errors
from timeslice.cli_serve import serve_app
from timeslice.errors import TimeSliceError

if TYPE_CHECKING:
    from pathlib import Path

    from timeslice.client import AsyncTimeSliceOrchestratorClient

app = typer.Typer(
    help="Share accelerators between RL jobs, one holder at a time.",
    no_args_is_help=True,
    # a traceback's locals would show a journal URL's password
    pretty_exceptions_show_locals=False,
)
app.add_typer(serve_app, name="serve")


@app.callback()
def app_options(
    debug: Annotated[
        bool,
        typer.Option(
            "--debug",
            envvar="TIMESLICE_DEBUG",
            help="On an error, print the traceback above its one-line message.",
        ),
    ] = False,
    version: VersionOption = False,
) -> None:
    """Share accelerators between RL jobs, one holder at a time."""
    debugging.set(debug)


@app.command()
def status(
    group: Annotated[str | None, typer.Argument(help="One group; all groups when omitted.")] = None,
    json_output: JsonOutput = False,
    target: Target = DEFAULT_TARGET,
    tls_ca: TlsCa = None,
    tls_cert: ClientTlsCert = None,
    tls_key: ClientTlsKey = None,
    token: Token = None,
) -> None:
    """Print each group's holder, queue and fencing token."""

    async def show(client: AsyncTimeSliceOrchestratorClient) -> None:
        from timeslice.cli_views import dumps, leadership_line, status_json

        standings = await client.each_leadership()
        groups = [group] if group else await client.list_groups()
        if json_output:
            answers = [await client.get_status(name) for name in groups]
            typer.echo(dumps(status_json(answers, standings)))
            return
        for address, standing in standings:
            typer.echo(leadership_line(address, standing))
        if not groups:
            typer.echo("no groups yet")
        for name in groups:
            answer = await client.get_status(name)
            g = answer.group
            queue = ", ".join(g.waiting_jobs) or "-"
            typer.echo(
                f"{g.group_id}: {g.group_state.value}  holder={g.locking_job or '-'}  "
                f"active={g.active_job or '-'}  loaded={g.loaded_job or '-'}  "
                f"queue[{g.waiter_queue_depth}]={queue}  token={g.fencing_token}"
            )
            if g.nodes:
                seen = ", ".join(
                    f"{s.agent}/{s.job_id}={s.job_state.value}" for s in answer.agent_job_states
                )
                typer.echo(f"  nodes: {', '.join(g.nodes)}  contexts: {seen or '-'}")
            for job, why in g.quarantined_jobs.items():
                typer.echo(f"  quarantined: {job} ({why}); `timeslice reset-job {name} {job}`")

    _with_client(target, show, _credentials(tls_ca, tls_cert, tls_key, token))


@app.command()
def acquire(
    group: str,
    job: str,
    target: Target = DEFAULT_TARGET,
    timeout: Annotated[float | None, typer.Option(help="Give up after this many seconds.")] = None,
    tls_ca: TlsCa = None,
    tls_cert: ClientTlsCert = None,
    tls_key: ClientTlsKey = None,
    token: Token = None,
) -> None:
    """Wait until JOB holds GROUP, then exit holding it (no lease: it holds until
    `timeslice yield`)."""

    async def take(client: AsyncTimeSliceOrchestratorClient) -> None:
        result = await client.acquire(job_id=job, group_id=group, timeout_sec=timeout)
        typer.echo(
            f"{job} holds {group} (token {result.fencing_token}, waited {result.waited_ms} ms)"
        )

    _with_client(target, take, _credentials(tls_ca, tls_cert, tls_key, token))


@app.command("yield")
def yield_(
    group: str,
    job: str,
    target: Target = DEFAULT_TARGET,
    tls_ca: TlsCa = None,
    tls_cert: ClientTlsCert = None,
    tls_key: ClientTlsKey = None,
    token: Token = None,
) -> None:
    """Release GROUP, held by JOB."""

    async def give_back(client: AsyncTimeSliceOrchestratorClient) -> None:
        result = await client.release(job_id=job, group_id=group)
        typer.echo(f"{job} released {group} ({result.pending_waiters} waiting)")

    _with_client(target, give_back, _credentials(tls_ca, tls_cert, tls_key, token))


@app.command("force-release")
def force_release(
    group: str,
    job: Annotated[str, typer.Option(help="Only if this job holds the group.")] = "",
    reason: Annotated[str, typer.Option(help="Recorded in the journal.")] = "",
    target: Target = DEFAULT_TARGET,
    tls_ca: TlsCa = None,
    tls_cert: ClientTlsCert = None,
    tls_key: ClientTlsKey = None,
    token: Token = None,
) -> None:
    """Operator action: take GROUP away from its holder; the next waiter is granted."""

    async def take_away(client: AsyncTimeSliceOrchestratorClient) -> None:
        result = await client.force_release(group_id=group, job_id=job, reason=reason)
        after = f"; {result.next_job_id} holds it now" if result.next_job_id else ""
        typer.echo(f"took {group} from {result.released_job_id}{after}")

    _with_client(target, take_away, _credentials(tls_ca, tls_cert, tls_key, token))


@app.command("reset-job")
def reset_job(
    group: str,
    job: str,
    target: Target = DEFAULT_TARGET,
    tls_ca: TlsCa = None,
    tls_cert: ClientTlsCert = None,
    tls_key: ClientTlsKey = None,
    token: Token = None,
) -> None:
    """Operator action: lift JOB's quarantine on GROUP (after a snapshot or restore of
    its context failed), on the orchestrator and on the group's agents."""

    async def reset(client: AsyncTimeSliceOrchestratorClient) -> None:
        was = await client.reset_job(job_id=job, group_id=group)
        typer.echo(
            f"{job} may hold {group} again" if was else f"{job} was not quarantined on {group}"
        )

    _with_client(target, reset, _credentials(tls_ca, tls_cert, tls_key, token))


@app.command("group-nodes")
def group_nodes(
    group: str,
    nodes: Annotated[list[str], typer.Argument(help="Node names or agent addresses HOST:PORT.")],
    target: Target = DEFAULT_TARGET,
    tls_ca: TlsCa = None,
    tls_cert: ClientTlsCert = None,
    tls_key: ClientTlsKey = None,
    token: Token = None,
) -> None:
    """Name the nodes GROUP spans (its grants switch the contexts on all of them)."""

    async def set_nodes(client: AsyncTimeSliceOrchestratorClient) -> None:
        await client.set_group_nodes(nodes, group_id=group)
        typer.echo(f"{group} spans {', '.join(nodes)}")

    _with_client(target, set_nodes, _credentials(tls_ca, tls_cert, tls_key, token))


@app.command()
def bench(
    quick: Annotated[bool, typer.Option(help="A short smoke run (about a minute).")] = False,
    only: Annotated[
        list[str] | None,
        typer.Option(help="Run only this benchmark (repeatable): handoff, switch, cycles, ..."),
    ] = None,
    out: Annotated[
        str | None,
        typer.Option(help="Where latest.json/.md/.log go (default: benchmarks/results)."),
    ] = None,
) -> None:
    """Run the benchmark suite of a source checkout (`python -m benchmarks`): every
    figure beside a baseline measured in the same run; prints the table."""
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    if not (root / "benchmarks" / "suite.py").is_file():
        typer.echo(
            f"error: no benchmarks/ next to the timeslice package ({root}): the suite runs"
            " from a source checkout",
            err=True,
        )
        raise typer.Exit(2)
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    from benchmarks.suite import main as run_suite

    argv = [*(["--quick"] if quick else []), *(f"--only={name}" for name in only or [])]
    argv += [f"--out={out}"] if out else []
    with user_errors():
        code = run_suite(argv)
    raise typer.Exit(code)


# The demo's options that apply to one workload only.
DEMO_OPTIONS = {"hostmem": ("step_seconds", "mib", "profile"), "torch": ("reward_seconds",)}


@app.command()
def demo(
    ctx: typer.Context,
    workload: Annotated[
        str,
        typer.Option(
            help="What the jobs are: hostmem (simulated RL jobs, contexts of host-memory"
            " arrays) or torch (real PyTorch training jobs, each checked bit for bit against"
            " its solo run; needs the torch extra)."
        ),
    ] = "hostmem",
    jobs: Annotated[
        int, typer.Option(min=1, max=16, help="How many RL jobs share the accelerator.")
    ] = 2,
    steps: Annotated[int, typer.Option(min=1, help="Steps per job.")] = 8,
    step_seconds: Annotated[
        float, typer.Option(min=0.05, help="hostmem: length of one step (all its phases), s.")
    ] = 1.5,
    mib: Annotated[int, typer.Option(min=1, help="hostmem: each job's context, MiB.")] = 16,
    profile: Annotated[
        str,
        typer.Option(help="hostmem: phases of a step, from a recorded run: verl-sync, verl-async."),
    ] = "verl-async",
    reward_seconds: Annotated[
        float,
        typer.Option(min=0.0, max=600.0, help="torch: the reward service's latency per step, s."),
    ] = 0.8,
    directory: Annotated[
        str | None, typer.Option(help="Keep the journals here (default: a new temporary folder).")
    ] = None,
) -> None:
    """Run RL jobs back to back, then time-sliced on one accelerator, through an embedded
    orchestrator and agent; print what sharing bought. With `--workload torch`, exit 1
    unless every job ends time-sliced with the bits it ended with alone."""
    from pathlib import Path

    with user_errors():
        if workload not in DEMO_OPTIONS:
            raise typer.BadParameter(f"unknown workload {workload!r}; known: hostmem, torch")
        foreign = [
            name
            for other, names in DEMO_OPTIONS.items()
            if other != workload
            for name in names
            if getattr(ctx.get_parameter_source(name), "name", "") == "COMMANDLINE"
        ]
        if foreign:
            option = "--" + foreign[0].replace("_", "-")
            raise typer.BadParameter(f"{option} does not apply to --workload {workload}")
        where = Path(directory) if directory else None
        if workload == "torch":
            _demo_torch(jobs, steps, reward_seconds, where)
            return
        from timeslice.demo import DemoConfig, run_demo

        try:
            config = DemoConfig(jobs, steps, step_seconds, mib, profile)
        except TimeSliceError as exc:
            raise typer.BadParameter(str(exc)) from None
        if where is not None:
            where.mkdir(parents=True, exist_ok=True)
        anyio.run(run_demo, config, where)


def _demo_torch(jobs: int, steps: int, reward_seconds: float, where: Path | None) -> None:
    try:
        from timeslice.demo_torch import TorchDemoConfig, run_demo
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] != "torch":
            raise
        raise CommandError("the torch demo needs PyTorch: pip install 'timeslice[torch]'") from None
    try:
        config = TorchDemoConfig(jobs=jobs, steps=steps, reward_s=reward_seconds)
    except TimeSliceError as exc:
        raise typer.BadParameter(str(exc)) from None
    if where is not None:
        where.mkdir(parents=True, exist_ok=True)
    result = anyio.run(run_demo, config, where)
    if not result.identical:
        raise CommandError(
            "a job's parameters or loss curve differ time-sliced from its solo run (see the table)"
        )


@app.command()
def replay(
    journals: Annotated[
        list[str] | None,
        typer.Argument(
            help="Journals to replay, one run each: a file path, sqlite:///REL/PATH (relative),"
            " sqlite:////ABS/PATH or postgresql://... (default: timeslice-journal.db in the"
            " working directory, unless --runs is given).",
            metavar="JOURNAL",
            show_default=False,
        ),
    ] = None,
    output: Annotated[
        str | None,
        typer.Option("--output", "-o", help="Write the replay page (one HTML file) here."),
    ] = None,
    runs: Annotated[
        str | None,
        typer.Option(
            help="Also replay the recorded runs of this JSON file (verl-replay-runs schema)."
        ),
    ] = None,
    export: Annotated[
        str | None,
        typer.Option(help="Write every run as lock events of that schema to this JSON file."),
    ] = None,
    trace: Annotated[
        str | None,
        typer.Option(
            help="Write every run as a Chrome/Perfetto trace (Trace Event Format JSON) to this"
            " file: open it in ui.perfetto.dev (Open trace file) or chrome://tracing."
        ),
    ] = None,
    title: Annotated[str, typer.Option(help="The page's title.")] = "timeslice replay",
) -> None:
    """Replay recorded runs switch by switch: a self-contained HTML page with a timeline
    per group and job, play/pause/speed/scrub, and the parts of each switch."""
    import json
    from pathlib import Path

    from timeslice.replay import ReplayError, ScheduleError, load_runs, read_journal, render_page
    from timeslice.replay.verl import export_document

    urls = list(journals or ([] if runs else ["sqlite:///timeslice-journal.db"]))
    with user_errors(Scope(urls=urls)):
        if output is None and export is None and trace is None:
            raise typer.BadParameter(
                "give --output FILE.html, --export FILE.json or --trace FILE.json (or several)"
            )
        try:
            timelines = [anyio.run(read_journal, url).timeline() for url in urls]
            if runs:
                timelines += load_runs(Path(runs))
        except (ReplayError, ScheduleError) as exc:
            raise CommandError(str(exc)) from exc
        except OSError as exc:
            raise CommandError(f"cannot read {runs}: {exc.strerror or exc}") from exc
        for tl in timelines:
            for note in tl.notes:
                typer.echo(f"note: {tl.label}: {note}", err=True)
        written = []
        try:
            if output is not None:
                Path(output).write_text(render_page(timelines, title), encoding="utf-8")
                written.append(output)
            if export is not None:
                text = json.dumps(export_document(timelines), indent=1, allow_nan=False)
                Path(export).write_text(text + "\n", encoding="utf-8")
                written.append(export)
            if trace is not None:
                from timeslice.replay.trace import trace_document

                text = json.dumps(trace_document(timelines), allow_nan=False)
                Path(trace).write_text(text + "\n", encoding="utf-8")
                written.append(trace)
        except OSError as exc:
            raise CommandError(f"cannot write {exc.filename}: {exc.strerror or exc}") from exc
    switches = sum(len(tl.switches) for tl in timelines)
    typer.echo(f"wrote {' and '.join(written)}: {len(timelines)} run(s), {switches} switch(es)")


auth_app = typer.Typer(
    help="Credentials for a server's auth file (--auth FILE).", no_args_is_help=True
)
app.add_typer(auth_app, name="auth")


@auth_app.command("add-token")
def auth_add_token(
    name: Annotated[str, typer.Argument(help="The principal's name, as logs will show it.")],
    role: Annotated[str, typer.Option(help="job, agent, operator or viewer.")],
    job: Annotated[
        list[str] | None,
        typer.Option(help="A job id (pattern: trainer-a-*) it may act as; repeatable. job role."),
    ] = None,
    group: Annotated[
        list[str] | None,
        typer.Option(help="A group (pattern) it may touch or see; repeatable. job, viewer roles."),
    ] = None,
    node: Annotated[
        list[str] | None,
        typer.Option(help="A node name (pattern) it may register as; repeatable. agent role."),
    ] = None,
    uid: Annotated[
        list[int] | None,
        typer.Option(help="A user its processes run as on the nodes; repeatable. job role."),
    ] = None,
) -> None:
    """Make a new bearer token for NAME: its [[principal]] entry goes to stdout (append
    it to the auth file, which keeps only the token's SHA-256), the token to stderr,
    shown this once (the principal's TIMESLICE_TOKEN, or a client's --token)."""
    from timeslice.errors import InvalidArgumentError
    from timeslice.security.tokens import new_token, principal_entry

    with user_errors():
        token = new_token()
        try:
            entry, _ = principal_entry(
                name,
                role,
                token,
                jobs=job or (),
                groups=group or (),
                nodes=node or (),
                uids=uid or (),
            )
        except InvalidArgumentError as exc:
            raise typer.BadParameter(str(exc)) from None
        typer.echo(entry, nl=False)
        typer.echo(f"token for {name} (shown only now): {token}", err=True)


# the operator's commands (cli_ops.py)
app.command()(watch)
app.command()(inspect)
app.add_typer(agent_app, name="agent")


def main() -> None:
    app(prog_name="timeslice")
