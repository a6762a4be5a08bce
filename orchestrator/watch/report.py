"""The report at the end of a run: runs/<job>/report.json (progress, step times per rank, the
findings) and runs/<job>/report.html, the same drawn as one self-contained page (report_html.py)."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from orchestrator.launch.monitor_api import Action, Quiet, Say
from orchestrator.launch.plan import LaunchPlan
from orchestrator.launch.result import RunResult
from orchestrator.watch.job_state import Watch
from orchestrator.watch.report_html import render_html


def build_report(plan: LaunchPlan, result: RunResult, watch: Watch) -> dict[str, Any]:
    return {
        "job_id": plan.job_id, "run_id": plan.run_id, "job": plan.job.name,
        "started": watch.started, "ended": time.time(), "exit_code": result.exit_code,
        "hosts": [{"name": r.host, "node_rank": r.node_rank, "nproc": result.nprocs.get(r.host),
                   "state": r.state.value, "exit_code": r.exit_code} for r in result.hosts],
        **watch.report(),
    }


def write_report(run_dir: Path, report: dict[str, Any]) -> Path:
    """report.json and report.html in the run directory; the page's path."""
    (run_dir / "report.json").write_text(json.dumps(report, indent=1, default=str))
    page = run_dir / "report.html"
    page.write_text(render_html(report))
    return page


class ReportWriter(Quiet):
    """The report as a supervision monitor: written when the job is over, from its Watch."""

    def __init__(self, plan: LaunchPlan, watch: Watch) -> None:
        self.plan = plan
        self.watch = watch

    def finish(self, result: RunResult) -> Sequence[Action]:
        try:
            write_report(result.run_dir, build_report(self.plan, result, self.watch))
        except (OSError, ValueError, TypeError) as exc:  # the run's outcome stands without its page
            return [Say(f"the run's report was not written: {exc}")]
        return ()
