"""`ddpctl runs`: the runs' time accounts in the host ledger (orchestrator/hostops/runs.py), one row
per run; `--json`, or `--html FILE` for one self-contained page (orchestrator/watch/runs_html.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from orchestrator.account import text
from orchestrator.commands.common import JsonOpt, console, err_console, handle_errors, writing
from orchestrator.hostops.runs import DEFAULT_SINCE, RunsView, parse_since, runs_view
from orchestrator.watch.runs_html import render_runs_html, when

SinceOpt = Annotated[str, typer.Option("--since", metavar="AGE",
                                       help="The runs that started this long ago or later: 90m, 24h, 7d, 2w.")]
HtmlOpt = Annotated[Path | None, typer.Option(
    "--html", metavar="FILE", dir_okay=False,
    help="Also write one self-contained page: goodput per run, the losses by cause and by host, the runs.")]
OUTCOME_STYLE = {"ok": "green", "failed": "bold red", "stopped": "yellow"}


@handle_errors
def runs_command(since: SinceOpt = DEFAULT_SINCE, as_json: JsonOpt = False, html: HtmlOpt = None) -> None:
    """Each run's goodput and where its time went, newest first.

    Every `ddpctl up` keeps its run's time account in the host ledger on this machine: its wall
    time, the productive part, each loss by kind and the host it is charged to. One row per run
    that started in the window: its wall time, outcome, attempts, goodput and its biggest loss.

    \b
    Examples:
      ddpctl runs --since 24h               # the last day's runs
      ddpctl runs --since 2w --html runs.html   # a page to share
    """
    view = runs_view(parse_since(since))
    for warning in view.warnings:
        err_console.print(f"[yellow]warning:[/] {escape(warning)}")
    if html is not None:
        write_page(html, render_runs_html(view))
    if as_json:
        # plain: rich's JSON highlighting takes seconds over a few thousand runs
        sys.stdout.write(json.dumps([a.to_json() for a in view.accounts], indent=2) + "\n")
        return
    print_view(view, since)
    if html is not None:
        console.print(escape(f"page: {html}"), style="dim")


def write_page(path: Path, page: str) -> None:
    with writing(path, "--html", "--html runs.html"):
        path.write_text(page, encoding="utf-8")


def print_view(view: RunsView, since: str) -> None:
    if not view.accounts:
        console.print(escape(f"no run in the last {since} in the ledger ({view.path}): each `ddpctl up` adds its own"))
        return
    table = Table("run", "job", "start", "wall", "outcome", "attempts", "goodput", "biggest loss", box=None,
                  pad_edge=False)
    for row in view.rows:
        style = OUTCOME_STYLE.get(row.outcome, "")
        table.add_row(escape(row.run_id), escape(row.job), when(row.started), text.seconds(row.wall_s),
                      f"[{style}]{escape(row.outcome)}[/]" if style else escape(row.outcome), str(row.attempts),
                      text.percent(row.goodput), escape(row.biggest) or "-")
    console.print(table)
    goodput = view.productive_s / view.wall_s if view.wall_s > 0 else None
    console.print(escape(f"{len(view.accounts)} run(s) since {when(view.since)}: goodput {text.percent(goodput)} "
                         f"({text.seconds(view.productive_s)} of {text.seconds(view.wall_s)})"))
