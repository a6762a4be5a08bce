"""A finished run's report.json as one self-contained HTML page: tables and inline SVG charts drawn by hand
(where the report has the run's time account, its section first: account_html.py).

Standard library only, no script, no external URL: the page opens the same on a laptop offline or from a
CI artifact. Every string from the report is escaped; every number may be missing (None, NaN) and is then
skipped. Long series are cut to a few hundred points per chart, so a week of samples stays a small page.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, TypeAlias

from orchestrator.watch import account_html

Point: TypeAlias = tuple[float, float]
Tick: TypeAlias = tuple[float, str]

MAX_POINTS = 500  # one throughput line; a longer series keeps each bucket's lowest and highest point
HOST_CHART_POINTS = 1200  # all the lines of one host chart together
MAX_BOX_ROWS = 256  # ranks in the step-time chart: every straggler, then the slowest by p95
MAX_MARKERS = 200  # finding markers on the throughput chart
ROW = 18  # pixels per rank in the step-time chart
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22")
CPU_COLOUR = "#555555"
END_COLOUR = "#2ca02c"  # a finding's end on the throughput chart (a straggler back to pace)
KIND_COLOURS = {"straggler": "#d62728", "hang": "#7f0000", "gpu idle": "#ff7f0e",
                "memory creeping": "#9467bd", "host lost": "#111111"}
SPLIT = (("wait_ms", "wait", "#d62728"), ("data_ms", "data", "#ff7f0e"), ("compute_ms", "compute", "#1f77b4"))
NONE = "—"

CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px auto;max-width:980px;color:#222;padding:0 12px}
h1{font-size:22px;margin:0 0 8px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd}
h3{font-size:14px;margin:16px 0 4px}
dl{display:grid;grid-template-columns:max-content 1fr;gap:2px 16px;margin:0}dt{color:#666}dd{margin:0}
table{border-collapse:collapse;margin:6px 0}th,td{padding:3px 10px;border-bottom:1px solid #eee;text-align:left;
vertical-align:top}td.num{text-align:right;font-variant-numeric:tabular-nums}td.text{white-space:pre-wrap}
.ok{color:#1a7f37;font-weight:600}.bad{color:#cf222e;font-weight:600}.none{color:#888;font-style:italic}
.kind{font-weight:600}.legend span{margin-right:14px}.swatch{display:inline-block;width:14px;height:3px;
vertical-align:middle;margin-right:4px}
svg{display:block;margin:4px 0;max-width:100%;height:auto}svg text{font-size:11px;fill:#444}
.axis line{stroke:#999}.grid{stroke:#eee}.rank.straggler text{fill:#d62728;font-weight:700}
tr.straggler td{background:#fdecec}
"""


# --- values from the report: anything may be missing or of the wrong type ---------------------------------

def _num(value: object) -> float | None:
    """A finite number, or None for anything else (None, text, bools, NaN, infinities)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _records(value: object) -> list[Mapping[str, Any]]:
    return [item for item in value if isinstance(item, Mapping)] if isinstance(value, list) else []


def _esc(value: object) -> str:
    """The report's value as escaped text; a dash when it is missing."""
    return NONE if value is None or value == "" else html.escape(str(value), quote=True)


def _first(*values: float | None) -> float | None:
    return next((v for v in values if v is not None), None)


def _or(value: float | None, fallback: float) -> float:
    return fallback if value is None else value


def _series(pairs: Iterable[tuple[object, object]]) -> list[Point]:
    """(x, y) pairs with both numbers, in x order; the others are skipped."""
    points = [(x, y) for rx, ry in pairs if (x := _num(rx)) is not None and (y := _num(ry)) is not None]
    return sorted(points, key=lambda p: p[0])


def downsample(points: Sequence[Point], limit: int = MAX_POINTS) -> list[Point]:
    """At most `limit` points: each bucket of neighbours keeps its lowest and highest, so spikes and dips stay."""
    if len(points) <= limit:
        return list(points)
    buckets = max(1, limit // 2)
    size = len(points) / buckets
    kept: list[Point] = []
    for b in range(buckets):
        chunk = points[int(b * size):int((b + 1) * size)]
        if not chunk:
            continue
        low, high = min(chunk, key=lambda p: p[1]), max(chunk, key=lambda p: p[1])
        kept.extend([low] if low is high else sorted((low, high), key=lambda p: p[0]))
    return kept


# --- formatting -------------------------------------------------------------------------------------------

def _fmt(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"


def _fmt_epoch(epoch: float | None) -> str:
    if epoch is None:
        return NONE
    try:
        return datetime.fromtimestamp(epoch, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (OverflowError, OSError, ValueError):
        return NONE


def _fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return NONE
    sign, s = ("-" if seconds < 0 else ""), abs(seconds)
    if s < 60:
        return f"{sign}{s:.1f} s"
    units = [(86400, "d"), (3600, "h"), (60, "min"), (1, "s")]
    parts: list[str] = []
    for size, name in units:
        if s >= size or parts:
            count, s = divmod(s, size)
            parts.append(f"{int(count)} {name}")
        if len(parts) == 2:
            break
    return sign + " ".join(parts)


# --- the SVG helper shared by every chart -----------------------------------------------------------------

def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """Round values (1, 2, 2.5, 5 × 10^n apart) from low to high, about `count` of them."""
    if not high > low:
        high = low + 1.0
    raw = (high - low) / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    first = math.ceil(low / step) * step
    return [first + i * step for i in range(int((high - first) / step + 1e-9) + 1)]


def _value_ticks(low: float, high: float) -> list[Tick]:
    return [(v, _fmt(v)) for v in nice_ticks(low, high)]


def _time_ticks(low: float, high: float) -> list[Tick]:
    """Ticks for seconds into the run, labelled in the unit that suits the span."""
    span = high - low
    size, unit = next((s, u) for s, u in ((1, "s"), (60, "min"), (3600, "h"), (86400, "d"))
                      if span <= s * 120 or u == "d")
    return [(v * size, f"{_fmt(v)} {unit}") for v in nice_ticks(low / size, high / size)]


@dataclass(frozen=True)
class Frame:
    """One chart: the data box x0..x1 × y0..y1 drawn into a width × height SVG, inside its margins."""

    x0: float
    x1: float
    y0: float
    y1: float
    width: int = 760
    height: int = 220
    left: int = 60
    right: int = 14
    top: int = 10
    bottom: int = 36

    def px(self, x: float) -> float:
        return self.left + (x - self.x0) / ((self.x1 - self.x0) or 1.0) * (self.width - self.left - self.right)

    def py(self, y: float) -> float:
        inner = self.height - self.top - self.bottom
        return self.height - self.bottom - (y - self.y0) / ((self.y1 - self.y0) or 1.0) * inner

    def polyline(self, points: Iterable[Point], colour: str, dashed: bool = False) -> str:
        coords = " ".join(f"{self.px(x):.1f},{self.py(y):.1f}" for x, y in points)
        dash = ' stroke-dasharray="5 3"' if dashed else ""
        return f'<polyline points="{coords}" fill="none" stroke="{colour}" stroke-width="1.4"{dash} />'

    def vline(self, x: float, colour: str, title: str) -> str:
        at = f"{self.px(x):.1f}"
        return (f'<line x1="{at}" y1="{self.top}" x2="{at}" y2="{self.height - self.bottom}" stroke="{colour}" '
                f'stroke-width="1.5" stroke-dasharray="3 2"><title>{title}</title></line>')

    def axes(self, xticks: Iterable[Tick], yticks: Iterable[Tick], xlabel: str, ylabel: str) -> str:
        base, right = self.height - self.bottom, self.width - self.right
        parts = ['<g class="axis">', f'<line x1="{self.left}" y1="{base}" x2="{right}" y2="{base}" />']
        for x, label in xticks:
            at = f"{self.px(x):.1f}"
            parts.append(f'<line x1="{at}" y1="{base}" x2="{at}" y2="{base + 4}" />'
                         f'<text x="{at}" y="{base + 15}" text-anchor="middle">{label}</text>')
        for y, label in yticks:
            at = f"{self.py(y):.1f}"
            parts.append(f'<line class="grid" x1="{self.left}" y1="{at}" x2="{right}" y2="{at}" />'
                         f'<text x="{self.left - 5}" y="{at}" dy="4" text-anchor="end">{label}</text>')
        middle = (self.top + base) / 2
        parts.append(f'<text x="{(self.left + right) / 2:.0f}" y="{self.height - 4}" text-anchor="middle">'
                     f'{xlabel}</text>')
        if ylabel:
            parts.append(f'<text x="12" y="{middle:.0f}" text-anchor="middle" '
                         f'transform="rotate(-90 12 {middle:.0f})">{ylabel}</text>')
        return "".join([*parts, "</g>"])

    def svg(self, body: Iterable[str], label: str) -> str:
        return (f'<svg viewBox="0 0 {self.width} {self.height}" width="{self.width}" height="{self.height}" '
                f'role="img" aria-label="{label}">{"".join(body)}</svg>')


@dataclass(frozen=True)
class Line:
    """One series of a line chart, with its colour and legend label (already escaped)."""

    points: list[Point]
    colour: str
    label: str
    dashed: bool = False


def _line_chart(lines: Sequence[Line], ylabel: str, *, budget: int, y_floor: float = 0.0, height: int = 220,
                markers: Sequence[tuple[float, str, str]] = (), marker_legend: Sequence[tuple[str, str]] = ()) -> str:
    """Lines over time into the run, y from 0, with vertical (time, colour, title) markers; the
    legend names the lines, then (colour, label) for the markers."""
    xs = [x for line in lines for x, _ in line.points] + [t for t, _, _ in markers]
    ys = [y for line in lines for _, y in line.points]
    frame = Frame(min([0.0, *xs]), max(xs, default=1.0), min([0.0, *ys]), max([y_floor, *ys]) * 1.08 or 1.0,
                  height=height)
    per_line = max(40, budget // max(1, len(lines)))
    body = [frame.axes(_time_ticks(frame.x0, frame.x1), _value_ticks(frame.y0, frame.y1), "time into the run", ylabel)]
    body += [frame.polyline(downsample(line.points, per_line), line.colour, line.dashed) for line in lines]
    body += [frame.vline(t, colour, title) for t, colour, title in markers]
    legend = "".join(f'<span><i class="swatch" style="background:{colour}"></i>{label}</span>'
                     for colour, label in [*((line.colour, line.label) for line in lines), *marker_legend])
    return frame.svg(body, ylabel) + (f'<p class="legend">{legend}</p>' if lines else "")


# --- sections ---------------------------------------------------------------------------------------------

def _none(text: str) -> str:
    return f'<p class="none">{text}</p>'


def _table(head: Sequence[str], rows: Iterable[str]) -> str:
    return f"<table><tr>{''.join(f'<th>{h}</th>' for h in head)}</tr>{''.join(rows)}</table>"


def _finding_t(finding: Mapping[str, Any], started: float | None) -> float | None:
    at = _num(finding.get("at"))
    return _first(_num(finding.get("t")), at - started if at is not None and started is not None else None)


def _header(report: Mapping[str, Any]) -> str:
    started, ended = _num(report.get("started")), _num(report.get("ended"))
    hosts, ranks = _records(report.get("hosts")), _records(report.get("ranks"))
    code = _int(report.get("exit_code"))
    outcome = (_none("not finished or unknown") if code is None
               else '<span class="ok">success (exit 0)</span>' if code == 0
               else f'<span class="bad">failed (exit {code})</span>')
    n_ranks = len(ranks) or sum(n for h in hosts if (n := _int(h.get("nproc"))) is not None)
    steps = [s for r in ranks if (s := _int(r.get("steps"))) is not None]
    steps += [s for p in _records(report.get("throughput")) if (s := _int(p.get("step"))) is not None]
    facts = [("run", _esc(report.get("run_id"))), ("started", _fmt_epoch(started)), ("ended", _fmt_epoch(ended)),
             ("duration", _fmt_duration(ended - started if started is not None and ended is not None else None)),
             ("outcome", outcome), _shape(hosts, n_ranks),
             ("steps", _fmt(max(steps)) if steps else NONE)]
    rows = [f"<tr><td>{_esc(h.get('name'))}</td><td class='num'>{_esc(_int(h.get('node_rank')))}</td>"
            f"<td class='num'>{_esc(_int(h.get('nproc')))}</td><td>{_esc(h.get('state'))}</td>"
            f"<td class='num'>{_esc(_int(h.get('exit_code')))}</td></tr>" for h in hosts]
    table = _table(["host", "node rank", "nproc", "state", "exit code"], rows) if rows else ""
    return (f"<h1>Run report: {_esc(report.get('job_id'))}</h1><dl>"
            + "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in facts) + f"</dl>{table}")


def _shape(hosts: Sequence[Mapping[str, Any]], ranks: int) -> tuple[str, str]:
    """The job's shape: `2 × 1 = 2` (hosts × ranks per host = ranks) where every host runs as
    many ranks, else the hosts and the ranks in all."""
    per_host = {_int(h.get("nproc")) for h in hosts}
    if len(per_host) == 1 and (n := per_host.pop()) is not None and n * len(hosts) == ranks:
        return "hosts × ranks per host", f"{len(hosts)} × {n} = {ranks} ranks"
    return "hosts, ranks", f"{len(hosts)} hosts, {ranks} ranks"


def _lasted(finding: Mapping[str, Any]) -> str:
    """How long a finding that can end (a straggler) lasted, and whether it ended."""
    lasted = _num(finding.get("duration_s"))
    if lasted is None:
        return NONE
    straggler = finding.get("kind") == "straggler"
    if _num(finding.get("end")) is not None:
        return f"{'back to pace' if straggler else 'over'} after {_fmt_duration(lasted)}"
    return f"{'still slow' if straggler else 'not over'} at the end ({_fmt_duration(lasted)})"


def _findings_table(findings: Sequence[Mapping[str, Any]], started: float | None) -> str:
    if not findings:
        return _none("no findings")
    timed = sorted(((_finding_t(f, started), f) for f in findings), key=lambda tf: (tf[0] is None, tf[0] or 0.0))
    rows = [f'<tr><td class="kind" style="color:{KIND_COLOURS.get(str(f.get("kind")), "#444")}">'
            f"{_esc(f.get('kind'))}</td><td class='num'>{_fmt_duration(t)}</td>"
            f"<td class='num'>{_esc(_int(f.get('rank')))}</td><td>{_esc(f.get('host'))}</td>"
            f"<td class='text'>{_esc(f.get('text'))}</td><td>{_lasted(f)}</td></tr>" for t, f in timed]
    return _table(["kind", "time into run", "rank", "host", "finding", "lasted"], rows)


def _end_t(finding: Mapping[str, Any], started: float | None) -> float | None:
    end = _num(finding.get("end"))
    return end - started if end is not None and started is not None else None


def _throughput_chart(report: Mapping[str, Any], findings: Sequence[Mapping[str, Any]], started: float | None) -> str:
    points = _series((p.get("t"), p.get("steps_per_s")) for p in _records(report.get("throughput")))
    if not points:
        return _none("no steps recorded")
    markers = [(t, KIND_COLOURS.get(str(f.get("kind")), "#444"), f"{_esc(f.get('kind'))}: {_esc(f.get('text'))}")
               for f in findings if (t := _finding_t(f, started)) is not None]
    markers += [(t, END_COLOUR, f"{_esc(f.get('kind'))} over ({_lasted(f)}): {_esc(f.get('text'))}")
                for f in findings if (t := _end_t(f, started)) is not None]
    markers = sorted(markers)[:MAX_MARKERS]
    kinds = sorted({str(f.get("kind")) for f in findings if _finding_t(f, started) is not None})
    legend = [(KIND_COLOURS.get(kind, "#444"), f"{_esc(kind)} (dashed)") for kind in kinds]
    legend += [(END_COLOUR, "back to pace (dashed)")] if any(_end_t(f, started) is not None for f in findings) else []
    return _line_chart([Line(points, PALETTE[0], "steps/s")], "steps/s", budget=MAX_POINTS, markers=markers,
                       marker_legend=legend)


@dataclass(frozen=True)
class Box:
    """One rank's step times in ms: whiskers min..max, box p5..p95, a line at the median."""

    low: float
    p5: float
    p50: float
    p95: float
    high: float


def hist_quantile(hist: object, q: float) -> float | None:
    """The q-quantile of a {edges_ms, counts} histogram, linear inside its bucket; None if it is unusable."""
    if not isinstance(hist, Mapping) or not isinstance(hist.get("edges_ms"), list) \
            or not isinstance(hist.get("counts"), list):
        return None
    edges, counts = [_num(e) for e in hist["edges_ms"]], [_num(c) for c in hist["counts"]]
    total = sum(c for c in counts if c is not None and c > 0)
    if len(edges) != len(counts) + 1 or None in edges or total <= 0:
        return None
    target, seen = q * total, 0.0
    for i, count in enumerate(counts):
        if count is not None and count > 0 and seen + count >= target:
            lo, hi = edges[i], edges[i + 1]
            assert lo is not None and hi is not None
            return lo + (target - seen) / count * (hi - lo)
        seen += count if count is not None and count > 0 else 0.0
    return None


def _box(rank: Mapping[str, Any]) -> Box | None:
    raw = rank.get("step_ms")
    stats: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}

    def pick(key: str, q: float) -> float | None:
        return _first(_num(stats.get(key)), hist_quantile(rank.get("hist"), q))

    p50 = pick("p50", 0.5)
    if p50 is None:
        return None
    p95, low = _or(pick("p95", 0.95), p50), _or(pick("min", 0.0), p50)
    p5 = min(max(_or(pick("p5", 0.05), low), low), p50)  # a coarse histogram's p5 may fall below step_ms' min
    return Box(low, p5, p50, p95, _or(pick("max", 1.0), p95))


def _rank_label(rank: Mapping[str, Any]) -> str:
    host = rank.get("host")
    name = f"rank {_esc(_int(rank.get('rank')))}"
    return f"{name} · {html.escape(str(host)[:28])}" if host is not None and host != "" else name


def _box_row(frame: Frame, y: float, rank: Mapping[str, Any], box: Box, straggler: bool) -> str:
    px, mid = frame.px, f"{y:.1f}"
    left, right = px(min(box.p5, box.p95)), px(min(max(box.p5, box.p95), frame.x1))
    label = _rank_label(rank) + (" — straggler" if straggler else "")
    clipped = (f'<text x="{frame.width - frame.right + 4}" y="{mid}" dy="4">max {_fmt(box.high)} ms</text>'
               if box.high > frame.x1 else "")
    tip = f"{label}: min {_fmt(box.low)}, p5 {_fmt(box.p5)}, p50 {_fmt(box.p50)}, p95 {_fmt(box.p95)}, " \
          f"max {_fmt(box.high)} ms"
    return (f'<g class="rank{" straggler" if straggler else ""}" data-rank="{_esc(_int(rank.get("rank")))}">'
            f"<title>{tip}</title>"
            f'<text x="{frame.left - 6}" y="{mid}" dy="4" text-anchor="end">{label}</text>'
            f'<line x1="{px(box.low):.1f}" y1="{mid}" x2="{px(min(box.high, frame.x1)):.1f}" y2="{mid}" '
            f'stroke="#666" />'
            f'<rect x="{left:.1f}" y="{y - 5:.1f}" width="{max(1.0, right - left):.1f}" height="10" '
            f'fill="{"#f4b4b4" if straggler else "#bcd6ee"}" stroke="{"#d62728" if straggler else "#1f77b4"}" />'
            f'<line x1="{px(min(box.p50, frame.x1)):.1f}" y1="{y - 6:.1f}" x2="{px(min(box.p50, frame.x1)):.1f}" '
            f'y2="{y + 6:.1f}" stroke="#222" stroke-width="2" />{clipped}</g>')


def _chosen(rows: list[tuple[Mapping[str, Any], Box]], stragglers: set[int]) -> list[tuple[Mapping[str, Any], Box]]:
    """At most MAX_BOX_ROWS ranks in rank order: every straggler, then the slowest by p95."""
    def rank_of(row: tuple[Mapping[str, Any], Box]) -> float:
        number = _int(row[0].get("rank"))
        return math.inf if number is None else number

    by_need = sorted(rows, key=lambda row: (_int(row[0].get("rank")) not in stragglers, -row[1].p95))
    return sorted(by_need[:MAX_BOX_ROWS], key=rank_of)


def _rank_chart(ranks: Sequence[Mapping[str, Any]], stragglers: set[int]) -> str:
    rows = [(rank, box) for rank in ranks if (box := _box(rank)) is not None]
    if not rows:
        return _none("no step times recorded")
    shown = _chosen(rows, stragglers)
    top = max(box.p95 for _, box in shown)
    frame = Frame(0.0, min(max(box.high for _, box in shown), 3 * top) * 1.02 or 1.0, 0.0, 1.0,
                  height=len(shown) * ROW + 46, left=210, right=110)
    body = [frame.axes(_value_ticks(0.0, frame.x1), [], "step time (ms): whiskers min–max, box p5–p95, "
                       "line median", "")]
    body += [_box_row(frame, frame.top + ROW * (i + 0.5), rank, box, _int(rank.get("rank")) in stragglers)
             for i, (rank, box) in enumerate(shown)]
    note = "" if len(shown) == len(rows) else _none(
        f"showing {len(shown)} of {len(rows)} ranks: every straggler, then the slowest by p95")
    return frame.svg(body, "step time per rank") + note


def _split_bar(values: Sequence[float | None]) -> str:
    total = sum(v for v in values if v is not None and v > 0)
    if total <= 0:
        return ""
    parts, x = [], 0.0
    for value, (_, name, colour) in zip(values, SPLIT, strict=True):
        if value is not None and value > 0:
            width = value / total * 160
            parts.append(f'<rect x="{x:.1f}" y="0" width="{width:.1f}" height="12" fill="{colour}">'
                         f"<title>{name} {_fmt(value)} ms</title></rect>")
            x += width
    return f'<svg viewBox="0 0 160 12" width="160" height="12" role="img" aria-label="DDP split">{"".join(parts)}</svg>'


def _ddp_split(ranks: Sequence[Mapping[str, Any]], stragglers: set[int]) -> str:
    rows = []
    for rank in sorted(ranks, key=lambda r: (_int(r.get("rank")) is None, _int(r.get("rank")) or 0)):
        values = [_num(rank.get(key)) for key, _, _ in SPLIT]
        if all(v is None for v in values):
            continue
        cells = "".join(f"<td class='num'>{NONE if v is None else _fmt(v)}</td>" for v in values)
        css = ' class="straggler"' if _int(rank.get("rank")) in stragglers else ""
        rows.append(f"<tr{css}><td>{_rank_label(rank)}</td><td class='num'>{_esc(_int(rank.get('steps')))}</td>"
                    f"{cells}<td>{_split_bar(values)}</td></tr>")
    if not rows:
        return ""
    legend = "".join(f'<span><i class="swatch" style="background:{c}"></i>{n}</span>' for _, n, c in SPLIT)
    return (f"<h3>DDP split per rank (ms)</h3><p class='legend'>{legend}</p>"
            + _table(["rank", "steps", "wait", "data", "compute", "split"], rows))


def _per_gpu(samples: Sequence[Mapping[str, Any]], key: str) -> list[list[Point]]:
    """One (t, value) series per GPU index from each sample's list under `key`."""
    lists = [(s.get("t"), s.get(key)) for s in samples]
    count = max((len(v) for _, v in lists if isinstance(v, list)), default=0)
    return [_series((t, v[i] if isinstance(v, list) and i < len(v) else None) for t, v in lists) for i in range(count)]


def _gpu_table(util: list[list[Point]], used: list[list[Point]], total: list[list[Point]],
               power: list[list[Point]]) -> str:
    def peak(series: list[list[Point]], i: int, scale: float = 1.0) -> str:
        values = [y for _, y in series[i]] if i < len(series) else []
        return _fmt(max(values) / scale) if values else NONE

    rows = []
    for i in range(max(len(util), len(used))):
        values = [y for _, y in util[i]] if i < len(util) else []
        mean = _fmt(sum(values) / len(values)) if values else NONE
        rows.append(f"<tr><td>GPU {i}</td><td class='num'>{mean}</td><td class='num'>{peak(used, i, 1024)} / "
                    f"{peak(total, i, 1024)}</td><td class='num'>{peak(power, i)}</td></tr>")
    return _table(["GPU", "mean util %", "peak memory used / total (GiB)", "peak power (W)"], rows)


def _host_block(name: str, samples: Sequence[Mapping[str, Any]]) -> str:
    util, used = _per_gpu(samples, "gpu_util"), _per_gpu(samples, "gpu_mem_used_mib")
    total, power = _per_gpu(samples, "gpu_mem_total_mib"), _per_gpu(samples, "power_w")
    cpu = _series((s.get("t"), s.get("cpu_percent")) for s in samples)
    lines = [Line(points, PALETTE[i % len(PALETTE)], f"GPU {i}") for i, points in enumerate(util) if points]
    lines += [Line(cpu, CPU_COLOUR, "CPU %", dashed=True)] if cpu else []
    parts = [f"<h3>{html.escape(name)}</h3>"]
    parts.append(_line_chart(lines, "utilisation %", budget=HOST_CHART_POINTS, y_floor=100.0, height=180)
                 if lines else _none("no CPU or GPU utilisation samples"))
    if not any(util) and not any(used):
        return "".join([*parts, _none("no GPU samples")])
    gib = [Line([(t, v / 1024) for t, v in points], PALETTE[i % len(PALETTE)], f"GPU {i}")
           for i, points in enumerate(used) if points]
    ceiling = max((v / 1024 for points in total for _, v in points), default=0.0)
    if gib:
        parts.append(_line_chart(gib, "memory GiB", budget=HOST_CHART_POINTS, y_floor=ceiling,
                                 height=160))
    return "".join([*parts, _gpu_table(util, used, total, power)])


def _host_charts(report: Mapping[str, Any]) -> str:
    by_host: dict[str, list[Mapping[str, Any]]] = {}
    for name in (h.get("name") for h in _records(report.get("hosts"))):
        by_host.setdefault(str(name), [])
    for sample in _records(report.get("samples")):
        by_host.setdefault(str(sample.get("host")), []).append(sample)
    blocks = [_host_block(name, samples) for name, samples in by_host.items() if samples]
    return "".join(blocks) if blocks else _none("no host samples (no GPU samples)")


def render_html(report: Mapping[str, Any]) -> str:
    """The whole page for one run's report.json content: inline CSS and SVG, no script, nothing fetched."""
    started = _num(report.get("started"))
    findings, ranks = _records(report.get("findings")), _records(report.get("ranks"))
    stragglers = {r for f in findings if f.get("kind") == "straggler" and (r := _int(f.get("rank"))) is not None}
    account = report.get("account")
    sections = [("Where the time went", account_html.account_section(account))] if isinstance(account, Mapping) else []
    sections += [("Findings", _findings_table(findings, started)),
                ("Throughput", _throughput_chart(report, findings, started)),
                ("Step time per rank", _rank_chart(ranks, stragglers) + _ddp_split(ranks, stragglers)),
                ("Hosts", _host_charts(report))]
    body = "".join(f"<section><h2>{title}</h2>{content}</section>" for title, content in sections)
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f"<title>ddpctl run report: {_esc(report.get('job_id'))}</title>"
            f"<style>{CSS}{account_html.CSS if isinstance(account, Mapping) else ''}</style></head>"
            f"<body><header>{_header(report)}</header>{body}</body></html>\n")
