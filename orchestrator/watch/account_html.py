"""A run's time account (orchestrator/account) as HTML: its line, a bar of its wall time cut into
productive time and each kind of loss, and the table of its parts; the colours and the bar are the
runs page's too (runs_html.py). Inline SVG, no script; every string escaped."""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

from orchestrator.account import compute, text
from orchestrator.account.compute import Account

PRODUCTIVE_COLOUR = "#2ca02c"
LOSS_COLOURS = {
    compute.STARTUP: "#9ecae1", compute.PENDING: "#c7c7c7", compute.DETECTION: "#d62728",
    compute.FENCING: "#7f0000", compute.BACKOFF: "#ff9896", compute.RELAUNCH: "#ff7f0e",
    compute.REDONE: "#e377c2", compute.NO_PROGRESS: "#8c564b", compute.STRAGGLER: "#bcbd22",
    compute.REQUEUE: "#969696", compute.STOPPED: "#555555", compute.FAILURE: "#9467bd",
    compute.SHUTDOWN: "#17becf", compute.OTHER: "#dddddd",
}
BAR_WIDTH = 760
CSS = """
.account-line{font-weight:600}.stack rect{stroke:#fff;stroke-width:0.5}
"""


def colour(kind: str) -> str:
    return PRODUCTIVE_COLOUR if kind == compute.PRODUCTIVE else LOSS_COLOURS.get(kind, "#444444")


def stacked_bar(segments: Sequence[tuple[str, float]], label: str, width: int = BAR_WIDTH, height: int = 26) -> str:
    """One bar cut into (kind, seconds) segments in their order, each with its colour and a tooltip,
    and the legend below it; "" when there is nothing to draw."""
    total = sum(s for _, s in segments if s > 0)
    if total <= 0:
        return ""
    rects, x = [], 0.0
    for kind, seconds in segments:
        if seconds <= 0:
            continue
        w = seconds / total * width
        tip = f"{html.escape(kind)}: {text.seconds(seconds)} ({seconds / total * 100:.1f} %)"
        rects.append(f'<rect x="{x:.2f}" y="0" width="{w:.2f}" height="{height}" fill="{colour(kind)}" '
                     f'data-kind="{html.escape(kind, quote=True)}"><title>{tip}</title></rect>')
        x += w
    legend = "".join(f'<span><i class="swatch" style="background:{colour(kind)}"></i>{html.escape(kind)} '
                     f"{text.seconds(seconds)}</span>" for kind, seconds in segments if seconds > 0)
    return (f'<svg class="stack" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
            f'aria-label="{html.escape(label, quote=True)}">{"".join(rects)}</svg><p class="legend">{legend}</p>')


def wall_segments(account: Account) -> list[tuple[str, float]]:
    """The account's wall time: productive first, then each kind of loss, most first."""
    return [(compute.PRODUCTIVE, account.productive_s), *account.by_kind().items()]


def parts_table(account: Account) -> str:
    """One row per part: kind, host, cause, seconds and its share of the wall time."""
    wall = account.wall_s or 1.0
    rows = "".join(
        f'<tr data-kind="{html.escape(p.kind, quote=True)}"><td class="kind" style="color:{colour(p.kind)}">'
        f"{html.escape(p.kind)}</td><td>{html.escape(p.host or '—')}</td><td>{html.escape(p.cause or '—')}</td>"
        f"<td class='num'>{p.seconds:.1f}</td><td class='num'>{p.seconds / wall * 100:.1f} %</td></tr>"
        for p in account.parts)
    return ("<table><tr><th>loss</th><th>host</th><th>cause</th><th>seconds</th><th>of the wall time</th></tr>"
            f"{rows}</table>")


def account_section(data: Mapping[str, Any]) -> str:
    """report.json's "account" (Account.to_json() and its "line") as the section's content."""
    try:
        account = Account.from_json(dict(data))
    except (KeyError, TypeError, ValueError):
        return '<p class="none">the account in report.json could not be read</p>'
    said = data.get("line")
    line = said if isinstance(said, str) and said else text.line(account)
    table = parts_table(account) if account.parts else '<p class="none">no time lost</p>'
    return (f'<p class="account-line">{html.escape(line)}</p>'
            + stacked_bar(wall_segments(account), "wall time: productive and each loss") + table)
