"""`ddpctl runs` (orchestrator/commands/runs.py): one row per run in the window from the host ledger's
accounts, newest first; --since's units and its error; --json (the accounts as recorded); --html
(one page, nothing fetched); the parsing of --since and the window's sums (hostops/runs.py)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from account_fixtures import HOSTS, account
from typer.testing import CliRunner

from inventory import ConfigError
from orchestrator.cli import build
from orchestrator.hostops.ledger import Ledger
from orchestrator.hostops.runs import parse_since, runs_view

ENV = {"COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"}
H = 3600.0


def runs(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(build(), ["runs", *args], env=ENV)
    return result.exit_code, result.output


def seed(now: float) -> None:
    book = Ledger()
    book.record_account(account("train-old", now - 10 * 86400, node1=50.0), HOSTS)
    book.record_account(account("train-a", now - 30 * H, node1=120.0, outcome="failed"), HOSTS)
    book.record_account(account("train-b", now - 2 * H, node0=30.0, startup=40.0, job="bert"), HOSTS)


@pytest.mark.parametrize(("text", "seconds"), [("7d", 7 * 86400), ("24h", 86400), ("90m", 5400), ("2w", 14 * 86400),
                                               ("45s", 45), ("1.5h", 5400)])
def test_since_takes_a_number_and_its_unit(text: str, seconds: float) -> None:
    assert parse_since(text) == seconds


@pytest.mark.parametrize("text", ["7", "3x", "", "-1d", "0h", "d7"])
def test_a_bad_since_is_an_error_naming_the_flag(text: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_since(text)
    assert caught.value.key == "--since" and "7d, 24h, 90m, 2w" in (caught.value.hint or "")


def test_one_row_per_run_in_the_window_newest_first() -> None:
    seed(time.time())
    code, out = runs()
    assert code == 0, out
    lines = out.splitlines()
    header = next(line for line in lines if line.startswith("run "))
    assert header.split() == ["run", "job", "start", "wall", "outcome", "attempts", "goodput", "biggest", "loss"]
    named = [line.split()[0] for line in lines if line.startswith("train-")]
    assert named == ["train-b", "train-a"]  # train-old is 10 days old
    row_b = next(line for line in lines if line.startswith("train-b"))
    assert "bert" in row_b and "10.0 min" in row_b and " ok " in row_b and "88 %" in row_b and "40 s start-up" in row_b
    row_a = next(line for line in lines if line.startswith("train-a"))
    assert "failed" in row_a and " 2 " in row_a and "120 s to node1" in row_a
    assert "2 run(s) since " in out and "goodput " in out


def test_since_narrows_the_window_and_widens_it() -> None:
    seed(time.time())
    assert [line.split()[0] for line in runs("--since", "24h")[1].splitlines() if line.startswith("train-")] == [
        "train-b"]
    assert len([line for line in runs("--since", "2w")[1].splitlines() if line.startswith("train-")]) == 3


def test_json_is_each_accounts_json_newest_first() -> None:
    seed(time.time())
    code, out = runs("--json", "--since", "2w")
    assert code == 0, out
    data = json.loads(out)
    assert [a["run_id"] for a in data] == ["train-b", "train-a", "train-old"]
    assert data[1]["hosts"] == {"node1": 120.0} and data[1]["outcome"] == "failed"
    assert {p["kind"] for p in data[1]["parts"]} == {"start-up", "shutdown", "detection", "relaunch"}


def test_a_bad_since_exits_2_without_a_traceback() -> None:
    code, out = runs("--since", "fortnight")
    assert code == 2 and "option --since: expected a duration with its unit, got 'fortnight'" in out
    assert "Traceback" not in out


def test_an_empty_ledger_says_what_fills_it() -> None:
    code, out = runs()
    assert code == 0 and "no run in the last 7d" in out and "ddpctl up" in out


def test_html_writes_one_page_that_fetches_nothing(tmp_path: Path) -> None:
    seed(time.time())
    page = tmp_path / "runs.html"
    code, out = runs("--html", str(page), "--since", "2w")
    assert code == 0, out
    assert f"page: {page}" in out.replace("\n", "")
    text = page.read_text()
    assert text.startswith("<!DOCTYPE html>") and text.count('class="run"') == 3
    for name in ("detection", "relaunch", "straggler", "start-up", "node0", "node1", "train-old"):
        assert name in text, name
    lowered = text.lower()
    for banned in ("http", "src=", "<script", "url(", "@import", "<link", "<img"):
        assert banned not in lowered, banned


def test_a_page_that_cannot_be_written_is_an_error_naming_the_flag(tmp_path: Path) -> None:
    code, out = runs("--html", str(tmp_path / "no" / "such" / "runs.html"))
    assert code == 2 and "option --html: cannot write" in out and "Traceback" not in out


def test_the_window_sums_each_runs_losses_by_kind_and_by_host() -> None:
    now = time.time()
    seed(now)
    view = runs_view(2 * 86400, now=now)
    assert [a.run_id for a in view.accounts] == ["train-b", "train-a"]
    assert view.by_host == {"node1": 120.0, "node0": 30.0}
    assert view.by_kind["start-up"] == 60.0 and view.by_kind["detection"] == 90.0
    assert view.wall_s == 1200.0 and view.productive_s == pytest.approx(1200.0 - 60 - 10 - 120 - 30)


def test_escaped_names_stay_text_in_the_page(tmp_path: Path) -> None:
    from dataclasses import replace

    from orchestrator.watch.runs_html import render_runs_html

    evil = '<script>alert(1)</script>"'
    Ledger().record_account(replace(account("r<1>", time.time() - H), job=evil), HOSTS)
    page = render_runs_html(runs_view(86400))
    assert "<script" not in page and "&lt;script&gt;" in page and "r&lt;1&gt;" in page
