"""`ddpctl up`: the flags, one call to run_up (orchestrator/run_up.py), and the rendering of its outcome."""

from __future__ import annotations

import contextlib
import enum
import shlex
import signal
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.live import Live
from rich.markup import escape
from rich.text import Text

from inventory import ConfigError, Job, JobOverrides, NprocSpec, load_job, parse_env_assignment
from inventory.gpus import show
from inventory.jobfile import MAX_JOIN_TIMEOUT_S
from inventory.restart import MAX_RESTARTS
from inventory.slurm_table import node_hosts
from orchestrator.account.compute import Account
from orchestrator.account.text import line as account_line
from orchestrator.checks import catalog
from orchestrator.checks.model import CheckStatus
from orchestrator.checks.render import finding_text, grouped
from orchestrator.checks.spec import Runs
from orchestrator.commands.common import (
    BackendChoice,
    GraceOpt,
    console,
    err_console,
    handle_errors,
    ssh_flags,
)
from orchestrator.commands.sync_view import SyncView
from orchestrator.hostops.runrecord import follow_up
from orchestrator.launch.faults import DEFAULT_LOST_AFTER, MIN_LOST_AFTER
from orchestrator.launch.labels import RankLines
from orchestrator.launch.observer import Pulse, plan_summary
from orchestrator.launch.options import LaunchOptions, OnHang
from orchestrator.launch.outcome import EXIT_STOPPED
from orchestrator.launch.plan import LaunchPlan, mask_env
from orchestrator.launch.preflight import ChecksFailed
from orchestrator.launch.progress import Status
from orchestrator.launch.result import HostRun, RunResult, RunState
from orchestrator.remote.ssh_options import Connection
from orchestrator.restarts.loop import RestartedRun
from orchestrator.run_up import (
    BatchScript,
    Detached,
    DryRun,
    Finished,
    LoopStarted,
    Restarted,
    UpOutcome,
    UpRequest,
    run_up,
)
from orchestrator.sync.core import SyncEvent

HOST_COLOURS = ["cyan", "magenta", "green", "yellow", "blue", "bright_red", "bright_cyan",
                "bright_magenta", "bright_green", "bright_yellow"]
STATE_STYLE = {RunState.CONNECTING: "dim", RunState.RUNNING: "green", RunState.STOPPING: "yellow",
               RunState.EXITED: "green", RunState.FAILED: "bold red", RunState.STOPPED: "yellow",
               RunState.LOST: "bold red"}


def parse_nproc(value: str | None) -> NprocSpec | None:
    if value is None:
        return None
    if value in ("gpu", "cpu", "auto"):
        return value  # type: ignore[return-value]
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"--nproc-per-node must be an integer, gpu, cpu or auto, got {value!r}",
                          key="--nproc-per-node", hint="e.g. --nproc-per-node 2") from None


def parse_port(value: str | None) -> int | str | None:
    if value is None or value == "auto":
        return value
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"--master-port must be a port number or auto, got {value!r}",
                          key="--master-port", hint="e.g. --master-port 29521") from None


class OnHangChoice(str, enum.Enum):
    report = "report"
    stop = "stop"

    def as_literal(self) -> OnHang:
        return "stop" if self is OnHangChoice.stop else "report"


class Printer:
    """Renders launch progress: host-prefixed lines, colour per host on a terminal, and there a
    live status line per host (connecting -> running -> exited code); plain lines otherwise."""

    def __init__(self, hosts: list[str], pulse: float = 30.0) -> None:
        self.colour = {h: HOST_COLOURS[i % len(HOST_COLOURS)] for i, h in enumerate(hosts)}
        self.progress: Status | None = None
        self.pulse = Pulse(pulse)
        self.width = max(len(h) for h in hosts)
        self.states: dict[str, HostRun] = {}
        self.live: Live | None = None
        self.sync = SyncView(live=console.is_terminal)
        self.gone = False  # stdout can no longer be written (a closed terminal)

    def __enter__(self) -> Printer:
        if console.is_terminal:
            self.live = Live(get_renderable=self.status, console=console, refresh_per_second=4,
                             transient=True)
            self.live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None
            for run in self.states.values():
                self._print_state(run)

    def status(self) -> Text:
        text = self.sync.status()
        for name, run in self.states.items():
            code = f" {run.exit_code}" if run.exit_code is not None else ""
            text.append(f" {name} ", style=self.colour[name])
            text.append(f"● {run.state.value}{code} ", style=STATE_STYLE[run.state])
        if self.progress is not None:
            text.append(f"\n {self.progress.text()}", style="bold")
        return text

    def on_lines(self, host: str, lines: RankLines) -> None:
        """On a terminal, rich (a colour per host, under the live status line); elsewhere one
        plain write per batch: rich's per-line rendering would cost more than the ranks' printing."""
        if self.gone:
            return
        prefixes: dict[str | None, str] = {}

        def prefix(rank: str | None) -> str:
            if rank not in prefixes:
                prefixes[rank] = (f"[{host}:{rank}]" if rank is not None else f"[{host}]").ljust(self.width + 6)
            return prefixes[rank]

        try:
            if self.live is None and not console.is_terminal:
                sys.stdout.write(lines.render(prefix))
                sys.stdout.flush()
                return
            batch = Text()
            style = self.colour[host]
            for rank, text in lines:
                batch.append(prefix(rank), style=style)
                batch.append(text + "\n")
            batch.rstrip()
            console.print(batch, markup=False, highlight=False, soft_wrap=True)
        except OSError:  # the terminal is gone (SIGHUP): the job's own log keeps every line
            self.gone = True

    def on_state(self, run: HostRun) -> None:
        self.states[run.host] = run
        if self.live is None or run.state in (RunState.FAILED, RunState.LOST):
            self._print_state(run)

    def _print_state(self, run: HostRun) -> None:
        shown = run.exit_code is not None and run.state is not RunState.STOPPED  # ours: no news
        detail = f" (exit {run.exit_code})" if shown else ""
        detail += f": {run.error}" if run.error else ""
        with contextlib.suppress(OSError):
            err_console.print(Text(f"ddpctl: {run.host} {run.state.value}{detail}",
                                   style=STATE_STYLE[run.state]))

    def on_notice(self, text: str) -> None:
        notice(text)

    def on_sync(self, event: SyncEvent) -> None:
        line = self.sync.update(event)
        if line is not None:
            notice(line)

    def on_progress(self, status: Status) -> None:
        """On a terminal, the status line's second line; elsewhere a pulse line now and then."""
        self.progress = status
        if self.live is None:
            line = self.pulse.due(status)
            if line is not None:
                notice(line)

    def on_plan(self, plan: LaunchPlan, run_dir: Path) -> None:
        self.progress = None
        self.states = {}  # a restart's attempt: only its own hosts in the status line
        notice(plan_summary(plan, run_dir))


def notice(text: str) -> None:
    with contextlib.suppress(OSError):  # a closed terminal (SIGHUP) must not stop the supervision
        err_console.print(Text(f"ddpctl: {text}", style="bold"))


def print_dry_run(dry: DryRun) -> None:
    """The batch script (Slurm), or each host's command and env and what the dry run left unchecked."""
    if dry.batch is not None:
        print_slurm_dry_run(dry.plan, dry.batch)
        return
    print_host_commands(dry.plan)
    print_dry_run_limits(dry.plan, dry.checks)


def print_host_commands(plan: LaunchPlan) -> None:
    console.print(f"job {plan.job.name} ({plan.job_id}): {len(plan.hosts)} host(s), world size "
                  f"{plan.world_size}, master {plan.master_addr}:{plan.master_port}", markup=False)
    job = plan.job
    if job.sync is not None:
        roots = sorted({job.sync_root(hl.host) for hl in plan.hosts})
        console.print(f"sync first: {job.sync.src} -> {', '.join(roots)} on every host (not run by a dry run; "
                      f"`ddpctl sync {job.source or 'job.toml'} --dry-run` lists what would change)", markup=False)
    for hl in plan.hosts:
        where = "local" if hl.host.is_local else f"ssh {hl.host.address}"
        gpus = f", gpus = {escape(show(hl.host.gpus))}" if isinstance(hl.host.gpus, tuple) else ""
        source = f" ({escape(hl.nproc_source)})" if hl.nproc_source else ""
        console.print(f"\n[bold]{escape(hl.host.name)}[/] (node_rank {hl.node_rank}, nproc {hl.nproc}{source}, "
                      f"{escape(where)}, cwd {escape(hl.cwd)}{gpus})")
        state = f"~/.ddpctl/runs/{plan.job_id}/node{hl.node_rank}"
        console.print("  command: " + hl.display(f"{state}/torchrun", f"{state}/rankwrap.py"), markup=False)
        for key, value in sorted(mask_env(hl.env).items()):
            console.print(f"  env: {key}={value}", markup=False)


def print_slurm_dry_run(plan: LaunchPlan, batch: BatchScript) -> None:
    """The batch script as sbatch gets it, and the env each node's supervisor reads from its
    0600 request file (secrets masked)."""
    argv, script, env = batch.argv, batch.script, batch.env
    console.print(f"job {plan.job.name} ({plan.job_id}) on Slurm ({batch.where}): "
                  f"{len(plan.hosts)} node(s) x {plan.hosts[0].nproc}, world size {plan.world_size}", markup=False)
    console.print(f"each node: {plan.hosts[0].display('<state>/torchrun', '<state>/rankwrap.py')}", markup=False)
    console.print(f"submit: {shlex.join(argv)}\n\n{script}", markup=False)
    for key, value in sorted(env.items()):
        console.print(f"env (in the 0600 request, not the script): {key}={value}", markup=False)


def print_dry_run_limits(plan: LaunchPlan, checks: bool) -> None:
    """What a dry run cannot know without contacting the hosts."""
    if not checks:
        return
    err_console.print(f"\nnot checked (a dry run does not contact the hosts for it): the pre-launch checks "
                      f"({', '.join(catalog.names(Runs.LAUNCH))}): master port reachable from every host, master_addr "
                      "and hostnames resolving, NCCL/GLOO_SOCKET_IFNAME, the script present, nproc against "
                      "CPUs/GPUs, selected GPUs present and free, torch present in each host's interpreter. "
                      f"`ddpctl doctor {plan.job.source or ''}` runs them.".replace(" .", "."),
                      markup=False)
    job = plan.job
    if len(plan.hosts) > 1 and job.slurm is None and not all(h.is_local for h in job.hosts):
        unset = [] if job.rendezvous.master_addr else ["master_addr"]
        unset += [v for v in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME") if job.rendezvous.pick_interfaces
                  and not any(v in hl.env for hl in plan.hosts)]
        if unset:
            err_console.print(f"settled at launch from each host's own addresses and routes (the job leaves "
                              f"them unset): {', '.join(unset)}; a launch prints what it picked", markup=False)


def print_checks_failed(exc: ChecksFailed) -> None:
    """The pre-launch findings, as doctor prints them: errors, then warnings."""
    shown = sorted((f for f in exc.findings if f.status in (CheckStatus.FAIL, CheckStatus.WARN)),
                   key=lambda f: -f.status.rank)
    err_console.print(Text("ddpctl: the pre-launch checks found errors; no rank was started", style="bold red"))
    for finding, hosts in grouped(shown):
        err_console.print(finding_text(finding, hosts))
    err_console.print("(--no-checks launches anyway)", markup=False)


def print_failure(result: RunResult) -> None:
    """The watchdog's diagnosis; then the cause: a host lost (or whose supervisor stopped for lack
    of us) outranks every error that follows from it; else the first rank to fail, in time, with
    its own exception and traceback; or, where no rank recorded one, the first host to fail."""
    if result.cause:
        err_console.print(Text("\nrendezvous failed:", style="bold red"))
        err_console.print(result.cause, markup=False)
    if result.ended_by is not None and result.loss is None:
        stopped = result.exit_code == EXIT_STOPPED
        err_console.print(Text(f"\n{'stopped' if stopped else 'first failure'}: {result.ended_by}",
                               style="bold yellow" if stopped else "bold red"))
        err_console.print("  no rank failed: Slurm ended them (their lines are in the logs)", markup=False)
        return
    if result.stopped_by is not None and result.root_cause is None and result.loss is None:
        err_console.print(Text(f"\n{result.stopped_by}", style="bold yellow"))
        err_console.print("  no rank failed before it: what the ranks raised after it are its consequences "
                          "(their lines are in the logs)", markup=False)
        return
    if result.loss is not None:
        loss = result.loss
        err_console.print(Text(f"\nfirst failure: {loss.host} lost at {loss.when()}: {loss.reason}",
                               style="bold red"))
        root = result.root_cause
        if root is not None:
            rank = result.rank_of(root)
            err_console.print(f"  then, as a consequence: rank {rank if rank is not None else '?'} on {root.host}: "
                              f"{root.error.summary}", markup=False)
        return
    hang = next((f for f in result.findings if f.kind in ("hang", "no progress")), None)
    if result.hung and hang is not None:  # stopped by us for it (--on-hang stop): the ranks are victims
        err_console.print(Text(f"\nfirst failure: {hang.text}", style="bold red"))
        return
    root = result.root_cause
    if root is not None:
        err, rank = root.error, result.rank_of(root)
        who = f"rank {rank}" if rank is not None else "a rank"
        named = next((r.hostname for r in result.hosts if r.host == root.host), None)
        where = f"{root.host} = {named}" if named and named != root.host else root.host
        err_console.print(Text(f"\nfirst failure: {who} on {where} (node_rank {root.node_rank}, "
                               f"local rank {err.local_rank}): {err.summary}", style="bold red"))
        for line in err.traceback.rstrip().splitlines()[-15:]:
            err_console.print(Text(f"    {line}"), highlight=False)
        return
    run = result.first_failure
    if run is None or result.cause:
        return
    err_console.print(Text(f"\nfirst failure: {run.host} (node_rank {run.node_rank})", style="bold red"))
    if run.error:
        err_console.print(f"  {run.error}", markup=False)
    if run.tail:
        err_console.print("  last lines:", markup=False)
        for line in run.tail[-12:]:
            err_console.print(f"    {line}", markup=False)


def print_nccl(result: RunResult) -> None:
    for run in result.hosts:
        n = run.nccl
        if n is None or not n.files:
            err_console.print(f"{run.host}: NCCL wrote no debug log (gloo backend, or NCCL never started)",
                              markup=False)
            continue
        err_console.print(f"{run.host}: NCCL network {', '.join(n.networks) or '?'}; interfaces "
                          f"{', '.join(n.interfaces or n.bootstrap) or '?'}; transports "
                          f"{', '.join(n.transports) or '?'}", markup=False)


NprocOpt = Annotated[str | None, typer.Option("--nproc-per-node", help="int, gpu, cpu or auto.")]
MasterPortOpt = Annotated[str | None, typer.Option("--master-port", help="Port number or auto.")]
EnvOpt = Annotated[list[str] | None, typer.Option("--env", "-e", help="KEY=VALUE, repeatable.")]
HostsOpt = Annotated[str | None, typer.Option("--hosts", help="Comma-separated subset, in node-rank order.")]
BackendOpt = Annotated[BackendChoice | None, typer.Option(
    "--backend", help="ssh (the inventory's hosts) or slurm (sbatch); default: slurm when the job "
    "file has a \\[slurm] table.")]
DryRunOpt = Annotated[bool, typer.Option("--dry-run", help="Print each host's command and env; run nothing.")]
DetachOpt = Annotated[bool, typer.Option("--detach", help="Start and return; see ddpctl ps/logs/down.")]
FreePortOpt = Annotated[bool, typer.Option("--free-port", help="Kill a non-ddpctl holder of the master port.")]
RunsDirOpt = Annotated[Path, typer.Option("--runs-dir", help="Where run logs and summary.json go.")]
HangTimeoutOpt = Annotated[float | None, typer.Option(
    "--hang-timeout", min=1, help="No output from any rank for this many seconds: dump all stacks.",
    rich_help_panel="Hangs")]
OnHangOpt = Annotated[OnHangChoice, typer.Option("--on-hang", help="After the hang dump: report, or stop the job.",
                                                 rich_help_panel="Hangs")]
DumpOnInterruptOpt = Annotated[bool, typer.Option(
    "--dump-on-interrupt", help="On Ctrl-C, dump every rank's stack before stopping.", rich_help_panel="Hangs")]
NcclDebugOpt = Annotated[bool, typer.Option(
    "--nccl-debug", help="NCCL_DEBUG=INFO to a per-host file; print the interface and transport "
    "NCCL chose.", rich_help_panel="Hangs")]
NoSyncOpt = Annotated[bool, typer.Option(
    "--no-sync", help="Do not copy the source to the hosts first, though the job file has \\[sync].")]
NoChecksOpt = Annotated[bool, typer.Option(
    "--no-checks", help="Skip the pre-launch checks (master port probe, names, interfaces, script).")]
JoinTimeoutOpt = Annotated[float | None, typer.Option(
    "--join-timeout", min=0, max=MAX_JOIN_TIMEOUT_S,
    help="Ranks not all joined this many seconds after torchrun started: "
    "diagnose, stop, exit 1 (0: off; default: [rendezvous] join_timeout, 120).", rich_help_panel="Hangs")]
LostAfterOpt = Annotated[float | None, typer.Option(
    "--lost-after", min=MIN_LOST_AFTER, max=MAX_JOIN_TIMEOUT_S,
    help="A host out of reach this many seconds is lost and the job "
    "stops; shorter silences are ridden out and the host re-attached (default: \\[supervise] lost_after, "
    f"{DEFAULT_LOST_AFTER:.0f}).", rich_help_panel="Hangs")]
MaxRestartsOpt = Annotated[int | None, typer.Option(
    "--max-restarts", min=0, max=MAX_RESTARTS,
    help="Restart the job this many times in all after a failure: a faulty host "
    "is left out (spares take its place), a deterministic bug is not retried (default: \\[restart] "
    "max_restarts, 0).", rich_help_panel="Restarts")]
MetricsPortOpt = Annotated[int | None, typer.Option(
    "--metrics-port", show_default=False,
    help="Serve the run's Prometheus series on this port, 1-65535 (default: \\[metrics] port; none: not served).")]
RunIdOpt = Annotated[str | None, typer.Option(
    "--run-id", hidden=True, help="The run's id (a detached job's restart loop is given it).")]


@handle_errors
@ssh_flags()
def up_command(
    job_file: Annotated[Path, typer.Argument(help="The job file (job.toml).", show_default=False)],
    nproc_per_node: NprocOpt = None,
    master_port: MasterPortOpt = None,
    env: EnvOpt = None,
    hosts: HostsOpt = None,
    backend: BackendOpt = None,
    dry_run: DryRunOpt = False,
    detach: DetachOpt = False,
    free_port: FreePortOpt = False,
    grace: GraceOpt = 10.0,
    runs_dir: RunsDirOpt = Path("runs"),
    hang_timeout: HangTimeoutOpt = None,
    on_hang: OnHangOpt = OnHangChoice.report,
    dump_on_interrupt: DumpOnInterruptOpt = False,
    nccl_debug: NcclDebugOpt = False,
    no_sync: NoSyncOpt = False,
    no_checks: NoChecksOpt = False,
    join_timeout: JoinTimeoutOpt = None,
    lost_after: LostAfterOpt = None,
    max_restarts: MaxRestartsOpt = None,
    metrics_port: MetricsPortOpt = None,
    run_id: RunIdOpt = None,
    *,
    connection: Connection,
) -> None:
    """Launch torchrun on every host and stream its output.

    Each host gets the right node rank.

    \b
    Examples:
      ddpctl up job.toml           # check the hosts, launch, stream the output
      ddpctl up job.toml --detach  # start and return; then ddpctl logs <job> -f
    """
    job = load_job(job_file, JobOverrides(
        nproc_per_node=parse_nproc(nproc_per_node), master_port=parse_port(master_port),  # type: ignore[arg-type]
        env=tuple(parse_env_assignment(e) for e in env or ()),
        hosts=(hosts,) if hosts else None, backend=backend.value if backend else None, metrics_port=metrics_port))
    options = LaunchOptions(grace=grace, hang_timeout=hang_timeout, on_hang=on_hang.as_literal(),
                            dump_on_interrupt=dump_on_interrupt, nccl_debug=nccl_debug, free_port=free_port,
                            runs_dir=runs_dir, checks=not no_checks, join_timeout=join_timeout,
                            sync=not no_sync, lost_after=lost_after)
    request = UpRequest(options, connection, dry_run=dry_run, detach=detach, max_restarts=max_restarts,
                        run_id=run_id, argv=tuple(sys.argv[1:]))
    printer = printer_for(job)
    try:
        with printer if request.attached else contextlib.nullcontext():
            outcome = run_up(job, request, printer)
    except ChecksFailed as exc:
        print_checks_failed(exc)
        raise typer.Exit(1) from None
    raise typer.Exit(show_outcome(outcome, job, nccl_debug))


def printer_for(job: Job) -> Printer:
    """The Printer for the job's hosts (a Slurm job's nodes; the spares too, for a restart's)."""
    shown = node_hosts(job, job.slurm) if job.slurm else (*job.hosts, *job.spares)
    return Printer([h.name for h in shown], job.watch.pulse)


def show_outcome(outcome: UpOutcome, job: Job, nccl_debug: bool) -> int:
    """Print what `up` did; its exit code."""
    match outcome:
        case DryRun():
            print_dry_run(outcome)
            return 0
        case LoopStarted():
            print_loop(outcome, job.inventory.source)
            return 0
        case Detached():
            return print_detached(outcome)
        case Restarted():
            ignore_late_signals()
            return print_restarted(outcome.run, nccl_debug)
        case Finished():
            ignore_late_signals()
            return print_finished(outcome.result, nccl_debug)


def ignore_late_signals() -> None:
    """The job is over: a late signal keeps its exit code and summary."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)


def print_finished(result: RunResult, nccl_debug: bool) -> int:
    """The first failure, NCCL's choices (--nccl-debug), and the verdict line; the exit code."""
    print_failure(result)
    if nccl_debug:
        print_nccl(result)
    verdict = "succeeded" if result.exit_code == 0 else f"failed (exit {result.exit_code})"
    if result.signal is not None and result.signal != signal.SIGINT:
        verdict = f"stopped on every host by {signal.Signals(result.signal).name} (exit {result.exit_code})"
    elif result.exit_code == EXIT_STOPPED or (result.stopped_by and result.root_cause is None and not result.loss):
        by = result.stopped_by or f"stopped: {result.ended_by}"
        verdict = f"{by} (exit {result.exit_code})"
    report = result.run_dir / "report.html"
    page = f"; report: {report}" if report.exists() else ""
    err_console.print(f"ddpctl: job {result.job_id} {verdict}; logs: {result.run_dir}{page}", highlight=False)
    print_account(result.account)
    return result.exit_code


def print_account(account: Account | None) -> None:
    """The last line: how much of the run was training, and who or what took the rest."""
    if account is not None:
        err_console.print(f"ddpctl: {account_line(account)}", markup=False, highlight=False)


def print_loop(loop: LoopStarted, inventory: Path | None) -> None:
    notice(f"detached: the restart loop of run {loop.run_id} runs on {loop.host} (pid {loop.pid}; its output: "
           f"{loop.host}:{loop.log}). Follow: {follow_up(loop.run_id, inventory)} (down ends the loop first, so "
           "nothing is restarted)")


def print_restarted(run: RestartedRun, nccl_debug: bool) -> int:
    """The last attempt's failure as a plain `up` tells it, then the run: attempts, hosts left
    out, and why it stopped restarting; the exit code."""
    result = run.result
    if result is not None and not result.ok:
        print_failure(result)
        if nccl_debug:
            print_nccl(result)
    for exclusion in run.excluded:
        err_console.print(f"ddpctl: {exclusion.host} left out from attempt {exclusion.from_attempt} on: "
                          f"{exclusion.reason}", markup=False, highlight=False)
    attempts = f"{len(run.attempts)} attempt(s), {run.restarts} restart(s) of at most {run.max_restarts}"
    if run.exit_code == 0:
        verdict = f"succeeded after {attempts}" + (f", shrunk: it ended {run.shrunk}" if run.shrunk else "")
    else:
        if run.reason:
            err_console.print(Text(f"ddpctl: {run.reason}", style="bold red"))
        verdict = f"{'stopped' if run.exit_code == EXIT_STOPPED else 'failed'} (exit {run.exit_code}) after {attempts}"
    err_console.print(f"ddpctl: run {run.run_id} {verdict}; logs: {run.run_dir}", highlight=False)
    print_account(run.account)
    return run.exit_code


def print_detached(out: Detached) -> int:
    """Report a detached start; the exit code: 0 when every host started."""
    for err in out.report.failed.values():
        notice(f"{err.host}: {err.message}")
    job_id = out.plan.job_id
    if out.report.slurm_job_id is not None:
        where = f" {out.plan.job.source}" if out.plan.job.source else ""
        notice(f"detached: submitted Slurm job {out.report.slurm_job_id} ({job_id}). "
               f"Follow: ddpctl logs{where or ' ' + job_id} -f; stop: ddpctl down{where or ' ' + job_id}")
        return 0
    notice(f"detached: started on {len(out.report.started)} host(s). "
           f"Follow: {follow_up(job_id, out.plan.job.inventory.source)}")
    return 0 if not out.report.failed else 1
