"""`ddpctl doctor` in-process (CliRunner): exit codes, JSON shape, table rendering, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from orchestrator.checks.model import CheckStatus, Finding, Report
from orchestrator.checks.render import render
from orchestrator.cli import app

runner = CliRunner()


def report(*statuses: CheckStatus) -> Report:
    findings = [Finding("ssh", s, "node1", f"msg {s.value}", "ev", "fix it") for s in statuses]
    return Report(hosts=["node0", "node1"], checks=["ssh", "python"], findings=findings,
                  unreachable={"node1"})


@pytest.mark.parametrize(("statuses", "strict", "code"), [
    ((CheckStatus.OK,), False, 0), ((CheckStatus.WARN,), False, 0),
    ((CheckStatus.WARN,), True, 1), ((CheckStatus.FAIL,), False, 1),
    ((CheckStatus.INFO, CheckStatus.SKIP), True, 0),
])
def test_exit_code(statuses: tuple[CheckStatus, ...], strict: bool, code: int) -> None:
    assert report(*statuses).exit_code(strict) == code


def test_cells_take_the_worst_status_and_skip_unreachable_hosts_for_cluster_findings() -> None:
    r = report(CheckStatus.OK, CheckStatus.FAIL)
    r.findings.append(Finding("python", CheckStatus.OK, None, "all agree"))
    assert r.cell("node1", "ssh") == CheckStatus.FAIL
    assert r.cell("node0", "ssh") == CheckStatus.SKIP
    assert r.cell("node0", "python") == CheckStatus.OK
    assert r.cell("node1", "python") == CheckStatus.SKIP  # node1 never answered


def test_render_shows_the_table_and_each_finding_with_its_fix() -> None:
    console = Console(width=120, record=True)
    render(report(CheckStatus.FAIL), console)
    text = console.export_text()
    assert "node0" in text and "✗" in text
    assert "[ssh] node1: msg fail" in text and "fix: fix it" in text
    assert "more: ddpctl doctor --explain ssh" in text  # every finding points to its entry
    assert "FAILED: 1 error(s)" in text


def test_findings_that_differ_only_by_host_are_printed_once() -> None:
    same = [Finding("nccl", CheckStatus.INFO, h, f"no IB on {h}", "", f"fix {h}")
            for h in ("node0", "node1")]
    r = Report(hosts=["node0", "node1"], checks=["nccl"], findings=same)
    console = Console(width=120, record=True)
    render(r, console)
    text = console.export_text()
    assert "[nccl] node0, node1: no IB on node0 (as seen on node0; the same on the others)" in text
    assert "fix: fix node0" in text and "<" not in text
    assert text.count("no IB on") == 1


def test_doctor_on_this_machine_prints_json_and_exits_0() -> None:
    result = runner.invoke(app, ["doctor", "--json", "--master-port", "29561"])
    data = json.loads(result.stdout)
    assert result.exit_code == data["exit_code"] == 0, result.stdout
    assert data["hosts"] == ["localhost"]
    assert data["table"]["localhost"]["ssh"] == "ok"
    assert data["table"]["localhost"]["python"] == "ok"
    assert {f["check"] for f in data["findings"]} >= {"ssh", "python", "port", "dns", "clock"}
    assert all(f["explain"] == f"docs/troubleshooting.md#doctor-{f['check']}" for f in data["findings"])


@pytest.mark.parametrize("name", ["firewall", "fw", "FW", "ifname", "if", "alloc", "links", "cmp"])
def test_explain_prints_the_checks_entry_without_contacting_a_host(name: str) -> None:
    from orchestrator.checks import explain

    # an inventory that does not exist: --explain reads none
    result = runner.invoke(app, ["doctor", "--explain", name, "-i", "/nonexistent/hosts.toml"])
    check = explain.resolve(name)
    assert result.exit_code == 0, result.output
    assert check is not None and explain.entry(check).splitlines()[0] in result.output
    assert f"docs/troubleshooting.md#doctor-{check}" in result.output


def test_explain_of_an_unknown_check_lists_the_checks() -> None:
    result = runner.invoke(app, ["doctor", "--explain", "firewal"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "doctor has no check 'firewal'" in result.output and "firewall (fw)" in result.output


@pytest.mark.parametrize(("args", "text"), [
    (["doctor", "/nonexistent/job.toml"], "/nonexistent/job.toml: job file not found"),
    (["doctor", "--inventory", "/nonexistent/hosts.toml"], "hosts.toml"),
    (["doctor", "--bandwidth", "--pairs"], "--pairs was replaced by --deep"),
])
def test_bad_input_exits_2_without_traceback(args: list[str], text: str) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert text in result.output and "Traceback" not in result.output


def test_job_file_and_inventory_together_is_bad_input(tmp_path: Path) -> None:
    job = tmp_path / "job.toml"
    job.write_text('[job]\nname = "t"\nscript = "t.py"\n')
    (tmp_path / "t.py").write_text("")
    result = runner.invoke(app, ["doctor", str(job), "-i", str(job)])
    assert result.exit_code == 2 and "not both" in result.output
