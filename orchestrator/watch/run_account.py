"""A run's end in its events (events.jsonl's `run start` and `run end`), and its time account
(orchestrator/account/) put where a user looks: summary.json, report.json and report.html."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from inventory import Job
from orchestrator.account import compute, events, text
from orchestrator.account.compute import Account
from orchestrator.account.events import EventLog
from orchestrator.watch.report_html import render_html


def open_run(run_dir: Path, run_id: str, job: Job, hosts: Sequence[str]) -> EventLog:
    """The run's events file, begun: what ran where, and whether re-done work can be known (ddpctl
    sees checkpoints only in [restart] checkpoint_dir)."""
    log = EventLog(run_dir)
    log.add(events.RUN_START, run_id=run_id, job=job.name, hosts=list(hosts),
            checkpoints=job.restart.checkpoint_dir is not None,
            backend="slurm" if job.slurm is not None else "ssh")
    return log


def close_run(log: EventLog, exit_code: int, outcome: str) -> Account | None:
    """The run's end, then its account from its events (None: its file could not be read)."""
    log.add(events.RUN_END, exit_code=exit_code, outcome=outcome)
    try:
        return compute.account(log.events())
    except (OSError, ValueError):
        return None


def account_json(account: Account) -> dict[str, Any]:
    return {**account.to_json(), "line": text.line(account)}


def add_to_files(account: Account, summary: Path | None, report_dir: Path | None) -> None:
    """The account into summary.json and into report.json (report.html drawn again): a file that is
    not there or not readable is left as it is."""
    shown = account_json(account)
    if summary is not None:
        _patch(summary, shown)
    if report_dir is not None and _patch(report_dir / "report.json", shown):
        report = json.loads((report_dir / "report.json").read_text())
        (report_dir / "report.html").write_text(render_html(report))


def _patch(path: Path, shown: dict[str, Any]) -> bool:
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict):
            return False
        data["account"] = shown
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=2, default=str))
        tmp.replace(path)
    except (OSError, ValueError):
        return False
    return True
