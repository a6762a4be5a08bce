"""The run report page: self-contained, escaped, bounded in size, and whole for an empty or partial report."""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET
from typing import Any

import pytest

from orchestrator.watch.report_html import downsample, hist_quantile, render_html

STARTED = 1_714_560_000.0  # 2024-05-01 10:40:00 UTC
EVIL = '<script>alert(1)</script> & "x"'


def realistic_report() -> dict[str, Any]:
    """3 hosts (2 with 2 GPUs each, 1 CPU-only), 6 ranks, 300 throughput points, a straggler and a hang."""
    hosts = [("gpu1", 0), ("gpu2", 1), ("cpu1", 2)]
    ranks = []
    for rank in range(6):
        slow = 2.0 if rank == 3 else 1.0
        ranks.append({
            "rank": rank, "host": hosts[rank // 2][0], "local_rank": rank % 2, "steps": 3000,
            "step_ms": {"min": 90.0 * slow, "p50": 100.0 * slow, "p95": 120.0 * slow, "max": 400.0 * slow},
            "hist": {"edges_ms": [0.0, 50.0, 100.0, 150.0, 800.0], "counts": [0, 1400, 1500, 100]},
            "wait_ms": 40.0 if rank != 3 else 2.0, "data_ms": 5.0, "compute_ms": 55.0 * slow,
        })
    throughput = [{"t": i * 6.0, "steps_per_s": 9.5 + math.sin(i / 10), "step": i * 10} for i in range(300)]
    samples = []
    for i in range(120):
        for name in ("gpu1", "gpu2"):
            samples.append({"t": i * 15.0, "host": name, "gpu_util": [95.0, 90.0 - (i % 7)],
                            "gpu_mem_used_mib": [30000.0 + i, 30100.0], "gpu_mem_total_mib": [81920.0, 81920.0],
                            "power_w": [650.0, 640.0], "cpu_percent": 35.0, "rss_mib": 12000.0})
        samples.append({"t": i * 15.0, "host": "cpu1", "gpu_util": [], "gpu_mem_used_mib": [],
                        "gpu_mem_total_mib": [], "power_w": [], "cpu_percent": 80.0, "rss_mib": 4000.0})
    return {
        "job_id": "resnet-7", "run_id": "r-20240501", "started": STARTED, "ended": STARTED + 1800.0, "exit_code": 1,
        "hosts": [{"name": n, "node_rank": i, "nproc": 2, "state": "exited", "exit_code": 1} for n, i in hosts],
        "ranks": ranks, "throughput": throughput, "samples": samples,
        "findings": [
            {"kind": "straggler", "t": 600.0, "at": STARTED + 600.0, "text": "rank 3 is 2.0x slower than the median",
             "rank": 3, "host": "gpu2"},
            {"kind": "hang", "t": None, "at": STARTED + 1750.0, "text": "no step for 120 s", "rank": None,
             "host": None},
        ],
    }


def svg_blocks(page: str) -> list[str]:
    return re.findall(r"<svg\b.*?</svg>", page, flags=re.S)


def test_a_realistic_report_renders_every_section() -> None:
    page = render_html(realistic_report())
    assert page.startswith("<!DOCTYPE html>")
    assert "<title>ddpctl run report: resnet-7</title>" in page
    assert "2024-05-01 10:40:00 UTC" in page and "30 min 0 s" in page
    assert 'class="bad">failed (exit 1)' in page
    assert "3 × 2 = 6 ranks" in page and "3,000" in page
    assert "rank 3 is 2.0x slower than the median" in page and "no step for 120 s" in page
    assert page.count('class="rank') == 6
    assert "DDP split per rank" in page
    assert "no findings" not in page and "no steps recorded" not in page


def test_every_svg_block_is_well_formed_xml() -> None:
    blocks = svg_blocks(render_html(realistic_report() | {"hosts": [{"name": EVIL}]}))
    assert len(blocks) >= 6  # throughput, step times, 6 split bars, 3 utilisation and 2 memory charts
    for block in blocks:
        assert ET.fromstring(block).tag == "svg"


def test_the_page_fetches_nothing_and_runs_nothing() -> None:
    page = render_html(realistic_report()).lower()
    for banned in ("http", "src=", "<script", "url(", "@import", "<link", "<img", "xmlns"):
        assert banned not in page, banned


def test_report_strings_are_escaped() -> None:
    report = realistic_report()
    report["job_id"] = EVIL
    report["hosts"][0]["name"] = EVIL
    report["ranks"][0]["host"] = EVIL
    report["findings"][0]["text"] = EVIL
    for sample in report["samples"]:
        if sample["host"] == "gpu1":
            sample["host"] = EVIL
    page = render_html(report)
    assert "<script" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt; &amp; &quot;x&quot;" in page
    for block in svg_blocks(page):
        ET.fromstring(block)


def test_the_stragglers_rank_is_highlighted_and_no_other() -> None:
    page = render_html(realistic_report())
    highlighted = re.findall(r'<g class="rank straggler" data-rank="(\d+)">', page)
    assert highlighted == ["3"]
    assert "rank 3 · gpu2 — straggler" in page
    assert len(re.findall(r'<tr class="straggler">', page)) == 1


def test_findings_mark_the_throughput_chart_at_their_time() -> None:
    page = render_html(realistic_report())
    titles = re.findall(r"<line [^>]*><title>([^<]*)</title></line>", page)
    assert titles == ["straggler: rank 3 is 2.0x slower than the median", "hang: no step for 120 s"]


def test_a_cpu_host_says_it_has_no_gpu_samples() -> None:
    page = render_html(realistic_report())
    cpu_block = page.split("<h3>cpu1</h3>")[1]
    assert cpu_block.startswith("<svg") and "no GPU samples" in cpu_block
    assert page.count("no GPU samples") == 1
    assert page.count("peak memory used / total (GiB)") == 2
    assert "29.4 / 80" in page  # peak used and total, MiB shown in GiB


def test_an_empty_report_renders_the_no_texts() -> None:
    page = render_html({"job_id": "j"})
    for text in ("no findings", "no steps recorded", "no step times recorded", "no host samples"):
        assert text in page, text
    assert "not finished or unknown" in page and "<svg" not in page


def test_a_run_that_never_started_renders() -> None:
    page = render_html({"job_id": "j", "run_id": None, "started": None, "ended": None, "exit_code": None,
                        "hosts": [{"name": "a", "node_rank": 0, "nproc": 4, "state": "failed", "exit_code": None}],
                        "ranks": [], "throughput": [], "samples": [], "findings": []})
    assert "1 × 4" in page and "no steps recorded" in page and "<td>failed</td>" in page


def test_a_long_series_stays_small() -> None:
    report = realistic_report()
    report["throughput"] = [{"t": i * 6.0, "steps_per_s": 10.0 + (i % 13), "step": i} for i in range(100_000)]
    report["samples"] = [{"t": i * 6.0, "host": "gpu1", "gpu_util": [float(i % 100)] * 8,
                          "gpu_mem_used_mib": [1000.0 + i] * 8, "gpu_mem_total_mib": [81920.0] * 8,
                          "cpu_percent": 50.0} for i in range(100_000)]
    page = render_html(report)
    assert len(page.encode()) < 400_000
    throughput_line = re.search(r'<polyline points="([^"]*)"', page)
    assert throughput_line is not None and len(throughput_line.group(1).split()) <= 500


def test_none_and_junk_values_are_skipped() -> None:
    report = realistic_report()
    report["throughput"] = [{"t": 0.0, "steps_per_s": 1.0}, {"t": 1.0, "steps_per_s": None},
                            {"t": None, "steps_per_s": 5.0}, {"t": 2.0, "steps_per_s": float("nan")},
                            {"t": 3.0, "steps_per_s": 2.0}, {"t": "x", "steps_per_s": True}, None]
    report["samples"] = [{"t": 0.0, "host": "gpu1", "gpu_util": [None, 50.0], "cpu_percent": None},
                         {"t": 1.0, "host": "gpu1", "gpu_util": None, "gpu_mem_used_mib": [None]},
                         {"t": 2.0, "host": "gpu1", "gpu_util": [10.0, 60.0], "cpu_percent": 20.0}]
    report["ranks"][0]["step_ms"] = None
    report["ranks"][1] = {"rank": 1, "step_ms": {"p50": None}, "hist": {"edges_ms": [1.0], "counts": [3, 4]}}
    report["findings"].append({"kind": None, "t": None, "at": None, "text": None})
    page = render_html(report)
    throughput_line = re.search(r'<polyline points="([^"]*)"', page)
    assert throughput_line is not None and len(throughput_line.group(1).split()) == 2
    assert "nan" not in page.lower()
    assert 'data-rank="0"' in page and 'data-rank="1"' not in page  # rank 0 falls back to its histogram
    for block in svg_blocks(page):
        ET.fromstring(block)


@pytest.mark.parametrize(("q", "expected"), [(0.0, 50.0), (0.5, 100.0 + 100 / 1500 * 50), (1.0, 800.0)])
def test_histogram_quantiles_interpolate_inside_the_bucket(q: float, expected: float) -> None:
    hist = {"edges_ms": [0.0, 50.0, 100.0, 150.0, 800.0], "counts": [0, 1400, 1500, 100]}
    assert hist_quantile(hist, q) == pytest.approx(expected)


def test_downsampling_keeps_spikes_and_order() -> None:
    points = [(float(i), 1.0) for i in range(10_000)]
    points[4321] = (4321.0, 99.0)
    kept = downsample(points, 500)
    assert len(kept) <= 500
    assert (4321.0, 99.0) in kept
    assert [x for x, _ in kept] == sorted(x for x, _ in kept)


def test_the_shape_line_says_hosts_times_ranks_per_host() -> None:
    report = realistic_report()
    assert "<dt>hosts × ranks per host</dt><dd>3 × 2 = 6 ranks</dd>" in render_html(report)
    two_by_one = dict(report, hosts=[dict(h, nproc=1) for h in report["hosts"][:2]],
                      ranks=[dict(r, rank=i) for i, r in enumerate(report["ranks"][:2])])
    assert "<dd>2 × 1 = 2 ranks</dd>" in render_html(two_by_one)  # not "2 × 2"
    uneven = dict(report, hosts=[dict(report["hosts"][0], nproc=2), dict(report["hosts"][1], nproc=1)],
                  ranks=report["ranks"][:3])
    assert "<dt>hosts, ranks</dt><dd>2 hosts, 3 ranks</dd>" in render_html(uneven)


def test_every_host_chart_has_a_legend() -> None:
    page = render_html(realistic_report())
    cpu_block = page.split("<h3>cpu1</h3>")[1]
    assert cpu_block.split("</svg>")[1].startswith('<p class="legend">') and "CPU %" in cpu_block  # one line too
    for name in ("gpu1", "gpu2"):
        block = page.split(f"<h3>{name}</h3>")[1].split("<h3>")[0]
        assert block.count('<p class="legend">') == 2 and "GPU 0" in block and "GPU 1" in block


def test_a_straggler_that_ended_says_how_long_and_marks_its_end() -> None:
    report = realistic_report()
    ended = dict(report["findings"][0], start=STARTED + 590.0, end=STARTED + 611.0, duration_s=21.0)
    still = {"kind": "straggler", "t": 1200.0, "at": STARTED + 1200.0, "text": "rank 5 is 30% slower",
             "rank": 5, "host": "cpu1", "start": STARTED + 1198.0, "end": None, "duration_s": 600.0}
    page = render_html(dict(report, findings=[ended, still, report["findings"][1]]))
    assert "<th>lasted</th>" in page
    assert "<td>back to pace after 21.0 s</td>" in page
    assert "<td>still slow at the end (10 min 0 s)</td>" in page
    assert page.count("<td>—</td>") >= 1  # the hang: no span
    titles = re.findall(r"<line [^>]*><title>([^<]*)</title></line>", page)
    assert "straggler over (back to pace after 21.0 s): rank 3 is 2.0x slower than the median" in titles
    assert len(titles) == 4  # 3 findings, 1 end
    legend = page.split("<h2>Throughput</h2>")[1].split('<p class="legend">')[1].split("</p>")[0]
    assert "steps/s" in legend and "straggler (dashed)" in legend and "hang (dashed)" in legend
    assert "back to pace (dashed)" in legend


def test_a_report_without_spans_has_no_end_markers() -> None:
    page = render_html(realistic_report())
    assert "back to pace" not in page


# -- the run's time account (report["account"], orchestrator/watch/account_html.py) -------------------------

def with_account() -> dict[str, Any]:
    from account_fixtures import account

    from orchestrator.account import text

    run = account("r-20240501", STARTED, wall=1800.0, node1=120.0, node0=30.0)
    return realistic_report() | {"account": {**run.to_json(), "line": text.line(run)}}


def test_the_account_section_draws_its_line_a_bar_of_the_wall_time_and_its_parts() -> None:
    report = with_account()
    page = render_html(report)
    assert page.index("<h2>Where the time went</h2>") < page.index("<h2>Findings</h2>")
    line = report["account"]["line"]
    assert line in page and line.startswith("goodput 90 % (27.1 min of 30.0 min)")
    bar = next(block for block in svg_blocks(page) if 'class="stack"' in block)
    kinds = re.findall(r'<rect [^>]*data-kind="([^"]+)"', bar)
    assert kinds == ["productive", "detection", "relaunch", "straggler", "start-up", "shutdown"]
    widths = [float(w) for w in re.findall(r'width="([\d.]+)"', bar)[1:]]
    assert sum(widths) == pytest.approx(760.0, abs=0.1)  # the parts add up to the wall time
    rows = re.findall(r'<tr data-kind="([^"]+)">.*?<td>([^<]*)</td><td>([^<]*)</td>', page)
    assert ("detection", "node1", "lost") in rows and ("straggler", "node0", "straggler") in rows
    assert ("start-up", "—", "start-up") in rows
    for block in svg_blocks(page):
        ET.fromstring(block)


def test_a_report_without_an_account_has_no_account_section() -> None:
    page = render_html(realistic_report())
    assert "Where the time went" not in page and "account-line" not in page and 'class="stack"' not in page


def test_an_account_without_its_line_is_said_from_its_parts_and_a_broken_one_says_so() -> None:
    report = with_account()
    line = report["account"].pop("line")
    assert line in render_html(report)
    assert "the account in report.json could not be read" in render_html(realistic_report() | {"account": {"x": 1}})


def test_the_accounts_strings_are_escaped() -> None:
    report = with_account()
    report["account"]["parts"][0]["host"] = EVIL
    report["account"]["line"] = EVIL
    page = render_html(report)
    assert "<script" not in page and "&lt;script&gt;" in page
