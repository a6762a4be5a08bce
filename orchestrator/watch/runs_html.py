"""`ddpctl runs --html`: the runs of a window as one self-contained page: goodput run by run, the
losses summed by kind and by host, and the table of runs. Inline CSS and SVG, no script, nothing
fetched; every string escaped."""

from __future__ import annotations

import html
import time
from collections.abc import Sequence

from orchestrator.account import text
from orchestrator.account.compute import PRODUCTIVE
from orchestrator.hostops.runs import RunRow, RunsView
from orchestrator.watch import account_html
from orchestrator.watch.report_html import CSS, Frame, nice_ticks

OUTCOME_COLOURS = {"ok": "#2ca02c", "failed": "#d62728", "stopped": "#7f7f7f"}
HOST_COLOUR = "#1f77b4"
BAR_ROW = 22  # pixels per row of a horizontal bar chart
MAX_TICKS = 6  # start times under the goodput chart


def when(at: float, form: str = "%Y-%m-%d %H:%M") -> str:
    return time.strftime(form, time.localtime(at))


def goodput_chart(rows: Sequence[RunRow]) -> str:
    """One bar per run, oldest first, as tall as its goodput, coloured by its outcome."""
    if not rows:
        return '<p class="none">no runs in the window</p>'
    runs = sorted(rows, key=lambda r: r.started)
    frame = Frame(0.0, float(len(runs)), 0.0, 100.0, height=240, bottom=40)
    slot = frame.px(1.0) - frame.px(0.0)
    every = max(1, -(-len(runs) // MAX_TICKS))
    xticks = [(i + 0.5, when(r.started, "%m-%d %H:%M")) for i, r in enumerate(runs) if i % every == 0]
    body = [frame.axes(xticks, [(v, f"{v:g} %") for v in nice_ticks(0.0, 100.0)], "runs by start (local time)",
                       "goodput")]
    for i, run in enumerate(runs):
        if run.goodput is None:
            continue
        top = frame.py(run.goodput * 100)
        tip = (f"{html.escape(run.run_id)} ({html.escape(run.job)}), {when(run.started)}: goodput "
               f"{text.percent(run.goodput)} of {text.seconds(run.wall_s)}, {html.escape(run.outcome)}"
               + (f"; biggest loss {html.escape(run.biggest)}" if run.biggest else ""))
        body.append(f'<rect class="run" x="{frame.px(float(i)) + slot * 0.15:.1f}" y="{top:.1f}" '
                    f'width="{max(slot * 0.7, 1.0):.1f}" height="{frame.py(0.0) - top:.1f}" '
                    f'fill="{OUTCOME_COLOURS.get(run.outcome, "#444444")}" data-run="{html.escape(run.run_id, True)}">'
                    f"<title>{tip}</title></rect>")
    legend = "".join(f'<span><i class="swatch" style="background:{c}"></i>{o}</span>'
                     for o, c in OUTCOME_COLOURS.items())
    return frame.svg(body, "goodput per run") + f'<p class="legend">{legend}</p>'


def bars(items: Sequence[tuple[str, float, str]], label: str, empty: str) -> str:
    """Horizontal bars, one per (name, seconds, colour), longest first, each labelled."""
    if not items:
        return f'<p class="none">{empty}</p>'
    longest = max(s for _, s, _ in items) or 1.0
    frame = Frame(0.0, longest * 1.15, 0.0, 1.0, height=len(items) * BAR_ROW + 40, left=160, right=20, bottom=30)
    size, unit = next((size, unit) for size, unit in ((1.0, "s"), (60.0, "min"), (3600.0, "h"))
                      if longest < size * 600 or unit == "h")
    ticks = [(v * size, f"{v:g}") for v in nice_ticks(0.0, frame.x1 / size)]
    body = [frame.axes(ticks, [], f"time lost ({unit})", "")]
    for i, (name, seconds, fill) in enumerate(items):
        y = frame.top + i * BAR_ROW
        end = frame.px(seconds)
        body.append(f'<g class="bar" data-name="{html.escape(name, True)}">'
                    f'<text x="{frame.left - 6}" y="{y + BAR_ROW / 2:.1f}" dy="4" text-anchor="end">'
                    f"{html.escape(name)}</text>"
                    f'<rect x="{frame.left}" y="{y + 3:.1f}" width="{max(end - frame.left, 1.0):.1f}" '
                    f'height="{BAR_ROW - 6}" fill="{fill}"><title>{html.escape(name)}: {text.seconds(seconds)}'
                    f"</title></rect>"
                    f'<text x="{end + 4:.1f}" y="{y + BAR_ROW / 2:.1f}" dy="4">{text.seconds(seconds)}</text></g>')
    return frame.svg(body, label)


def runs_table(rows: Sequence[RunRow]) -> str:
    head = ("run", "job", "start (local time)", "wall", "outcome", "attempts", "goodput", "biggest loss")
    cells = "".join(
        f'<tr data-run="{html.escape(r.run_id, True)}"><td>{html.escape(r.run_id)}</td><td>{html.escape(r.job)}</td>'
        f"<td>{when(r.started)}</td><td class='num'>{text.seconds(r.wall_s)}</td>"
        f'<td class="{"ok" if r.outcome == "ok" else "bad"}">{html.escape(r.outcome)}</td>'
        f"<td class='num'>{r.attempts}</td><td class='num'>{text.percent(r.goodput)}</td>"
        f"<td>{html.escape(r.biggest) or '—'}</td></tr>" for r in rows)
    return f"<table><tr>{''.join(f'<th>{h}</th>' for h in head)}</tr>{cells}</table>"


def summary(view: RunsView) -> str:
    wall = view.wall_s
    goodput = view.productive_s / wall if wall > 0 else None
    return (f'<p class="account-line">{len(view.accounts)} run(s) since {when(view.since)}: goodput '
            f"{text.percent(goodput)} ({text.seconds(view.productive_s)} of {text.seconds(wall)})</p>")


def render_runs_html(view: RunsView) -> str:
    """The whole page for the runs of `view`."""
    kinds = [(kind, s, account_html.colour(kind)) for kind, s in view.by_kind.items() if s > 0]
    hosts = [(host, s, HOST_COLOUR) for host, s in view.by_host.items() if s > 0]
    whole = account_html.stacked_bar([(PRODUCTIVE, view.productive_s), *view.by_kind.items()],
                                     "the window's wall time: productive and each loss")
    sections = [("Goodput per run", goodput_chart(view.rows)),
                ("Where the time went", whole + bars(kinds, "losses by cause", "no time lost")),
                ("Losses by host", bars(hosts, "losses by host", "no loss was charged to a host")),
                ("Runs", runs_table(view.rows) if view.rows else '<p class="none">no runs in the window</p>')]
    body = "".join(f"<section><h2>{title}</h2>{content}</section>" for title, content in sections)
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f"<title>ddpctl runs since {when(view.since)}</title><style>{CSS}{account_html.CSS}</style></head>"
            f"<body><header><h1>Runs since {when(view.since)} (local time)</h1>{summary(view)}</header>"
            f"{body}</body></html>\n")
