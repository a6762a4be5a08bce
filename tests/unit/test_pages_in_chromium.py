"""The account pages as a browser reads them: report.html with a run's account and `ddpctl runs
--html`'s page, opened in headless Chromium (`chromium-headless-shell`, installed by .ci/run). Its
DOM holds the breakdown (the goodput line, each loss kind, each host charged, the SVG charts) and
its screenshot is a real picture. Skipped only where no Chromium is installed and
DDPCTL_REQUIRE_CLUSTER is unset; under DDPCTL_REQUIRE_CLUSTER=1 (CI) a missing Chromium fails."""

from __future__ import annotations

import shutil
import struct
import subprocess
import time
from pathlib import Path

from account_fixtures import HOSTS, account

from orchestrator.account import text
from orchestrator.hostops.ledger import Ledger
from orchestrator.hostops.runs import runs_view
from orchestrator.watch.report_html import render_html
from orchestrator.watch.runs_html import render_runs_html
from tests.required import missing

BROWSERS = ("chromium-headless-shell", "chromium", "chromium-browser")
KINDS = ("start-up", "detection", "relaunch", "straggler", "shutdown")


def browser() -> str:
    found = next((path for name in BROWSERS if (path := shutil.which(name))), None)
    if found is not None:
        return found
    missing("no headless Chromium (apt-get install chromium-headless-shell)")


def chromium(page: Path, profile: Path, *args: str) -> str:
    out = subprocess.run([browser(), "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={profile}",
                          *args, page.as_uri()], capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def dom_and_picture(html: str, tmp_path: Path) -> tuple[str, tuple[int, int]]:
    """The page's DOM as Chromium built it, and the size of its screenshot (a PNG, read from its header)."""
    page = tmp_path / "page.html"
    page.write_text(html, encoding="utf-8")
    dom = chromium(page, tmp_path / "profile", "--dump-dom")
    shot = tmp_path / "page.png"
    chromium(page, tmp_path / "profile", f"--screenshot={shot}", "--window-size=1000,1200")
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000  # a page drawn, not a blank one
    width, height = struct.unpack(">II", data[16:24])
    return dom, (width, height)


def test_a_report_with_an_account_shows_its_breakdown_in_chromium(tmp_path: Path) -> None:
    run = account("train-7", time.time() - 3600, node1=120.0, node0=30.0)
    line = text.line(run)
    dom, size = dom_and_picture(render_html({"job_id": "train-7", "run_id": "train-7",
                                             "account": {**run.to_json(), "line": line}}), tmp_path)
    assert size == (1000, 1200)
    assert "Where the time went" in dom and line in dom
    assert line.startswith("goodput 71 % (425 s of 10.0 min): 120 s to node1")
    for kind in (*KINDS, "productive"):
        assert f'data-kind="{kind}"' in dom, kind
    for host in ("node0", "node1"):
        assert f"<td>{host}</td>" in dom, host
    assert dom.count("<svg") >= 1 and dom.count("<rect") >= 6


def test_the_runs_page_draws_goodput_and_the_losses_by_cause_and_host_in_chromium(tmp_path: Path) -> None:
    now = time.time()
    for i in range(4):
        Ledger().record_account(account(f"train-{i}", now - (4 - i) * 3600, node1=60.0 * (i % 2), node0=10.0 * i,
                                        outcome="failed" if i == 1 else "ok"), HOSTS)
    dom, _ = dom_and_picture(render_runs_html(runs_view(86400)), tmp_path)
    assert "4 run(s) since " in dom and "Goodput per run" in dom
    assert dom.count('class="run"') == 4 and dom.count("<svg") >= 4  # goodput, the window's bar, kinds, hosts
    for kind in KINDS:
        assert f'data-name="{kind}"' in dom, kind
    for host in ("node0", "node1"):
        assert f'data-name="{host}"' in dom, host
    for run_id in ("train-0", "train-3"):
        assert f'data-run="{run_id}"' in dom
