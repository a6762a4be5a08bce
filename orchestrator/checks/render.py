"""Render a doctor report: a hosts × checks table of ✓/⚠/✗, then the findings; or JSON."""

from __future__ import annotations

import json

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from orchestrator.checks import catalog, explain
from orchestrator.checks.model import CheckStatus, Finding, Report

SYMBOL = {
    CheckStatus.OK: ("✓", "green"),
    CheckStatus.INFO: ("i", "cyan"),
    CheckStatus.WARN: ("⚠", "yellow"),
    CheckStatus.FAIL: ("✗", "bold red"),
    CheckStatus.SKIP: ("-", "dim"),
}
SHOWN = (CheckStatus.FAIL, CheckStatus.WARN, CheckStatus.INFO)


def table(report: Report) -> Table:
    t = Table(title="ddpctl doctor", box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False)
    t.add_column("host", style="bold", no_wrap=True,
                 min_width=min(30, max((len(h) for h in report.hosts), default=4)))
    for check in report.checks:
        t.add_column(catalog.header(check), justify="center", no_wrap=True)
    for host in report.hosts:
        cells = []
        for check in report.checks:
            symbol, style = SYMBOL[report.cell(host, check)]
            cells.append(Text(symbol, style=style))
        t.add_row(host, *cells)
    return t


def _generic(f: Finding) -> tuple[str, ...]:
    """The finding with its own host name blanked, so identical ones on many hosts group."""
    name = f.host or ""

    def blank(text: str) -> str:
        return text.replace(name, "\0") if name else text

    return (f.status.value, f.check, blank(f.message), blank(f.evidence), blank(f.fix))


def grouped(findings: list[Finding]) -> list[tuple[Finding, list[str]]]:
    """Findings that differ only by host, once each, with every host they concern."""
    groups: dict[tuple[str, ...], tuple[Finding, list[str]]] = {}
    for f in findings:
        _, hosts = groups.setdefault(_generic(f), (f, []))
        hosts.append(f.host or "all hosts")
    return list(groups.values())


def finding_text(f: Finding, hosts: list[str] | None = None) -> Text:
    symbol, style = SYMBOL[f.status]
    text = Text()
    text.append(f"{symbol} ", style=style)
    text.append(f"[{f.check}] ", style="bold")
    names = hosts or [f.host or "all hosts"]
    shown = ", ".join(names[:6]) + (f" (+{len(names) - 6} more)" if len(names) > 6 else "")
    text.append(f"{shown}: ", style="bold")
    text.append(f.message)
    if len(names) > 1:  # one entry for many hosts: the first one's words, real names throughout
        text.append(f" (as seen on {names[0]}; the same on the others)", style="dim")
    if f.evidence:
        text.append("\n    evidence: ", style="dim")
        text.append(f.evidence)
    if f.fix:
        text.append("\n    fix: ", style="bold green")
        text.append(f.fix)
    if catalog.named(f.check) is not None:
        text.append(f"\n    more: {explain.pointer(f.check)}", style="dim")
    return text


def render(report: Report, console: Console, strict: bool = False) -> None:
    console.print(table(report))
    order = {s: i for i, s in enumerate(SHOWN)}
    shown = sorted((f for f in report.findings if f.status in SHOWN),
                   key=lambda f: (order[f.status], report.checks.index(f.check)
                                  if f.check in report.checks else 99))
    for f, hosts in grouped(shown):
        console.print(finding_text(f, hosts))
    fails, warns = report.count(CheckStatus.FAIL), report.count(CheckStatus.WARN)
    verdict = "FAILED" if report.exit_code(strict) else "OK"
    console.print(f"\n{verdict}: {fails} error(s), {warns} warning(s)"
                  f"{' (--strict: warnings count as errors)' if strict and warns else ''} "
                  f"in {report.elapsed_s:.1f}s")


def to_json(report: Report, strict: bool = False) -> str:
    data = report.to_json(strict)
    for finding in data["findings"]:  # where its check's entry is (ddpctl doctor --explain CHECK)
        if catalog.named(finding["check"]) is not None:
            finding["explain"] = explain.docs_link(finding["check"])
    return json.dumps(data, indent=2)
