"""Every Prometheus series is declared once (node_agent/wire/metrics.py) and everything else follows
it: docs/metrics.md's table is METRICS row for row; the names follow Prometheus' conventions; the
agent's own exposition text parses back (prometheus-client's parser) and passes `promtool check
metrics`; the alert rules and the Grafana dashboard name only declared series, and promtool accepts
the rules and every dashboard query. The promtool tests are skipped where promtool is missing and
DDPCTL_REQUIRE_CLUSTER is unset; under DDPCTL_REQUIRE_CLUSTER=1 (CI) a missing promtool fails."""

from __future__ import annotations

import json
import math
import re
import subprocess
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from node_agent.wire.metrics import BY_NAME, COUNTER, GAUGE, METRICS, MetricName, exposition
from tests.prometheus import promtool

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "metrics.md"
RULES = ROOT / "docs" / "metrics" / "ddpctl-alerts.yml"
DASHBOARD = ROOT / "docs" / "metrics" / "ddpctl-dashboard.json"
SOURCES = ("host", "up", "ledger")
HOSTILE = ('say "hi"', "back\\slash\\", "two\nlines", " spaced  out ", "$(rm -rf /); echo", "ünï ☃ 日本", "")
SAMPLE_NAMES = {m.sample_name for m in METRICS}


def run_promtool(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool(), *args], input=stdin, capture_output=True, text=True, timeout=60, check=False)


# -- (a) the docs' table is the declaration ----------------------------------------------------------

def documented_rows() -> list[tuple[str, str, tuple[str, ...], str, str]]:
    """(sample name, type, labels, from, meaning) of each row of docs/metrics.md's table of series."""
    rows = []
    for line in PAGE.read_text(encoding="utf-8").splitlines():
        m = re.fullmatch(r"\| `(ddpctl_\w+)` \| (\w+) \| (.*?) \| (\w+) \| (.+?) \|", line)
        if m:
            labels = tuple(re.findall(r"`([^`]+)`", m.group(3)))
            rows.append((m.group(1), m.group(2), labels, m.group(4), m.group(5)))
    return rows


def test_the_docs_table_is_every_declared_series_in_order() -> None:
    declared = [(m.sample_name, m.kind, m.labels, m.source, m.help) for m in METRICS]
    documented = documented_rows()
    assert len(documented) == len(declared), (
        f"docs/metrics.md has {len(documented)} series rows, METRICS {len(declared)}; missing: "
        f"{sorted({d[0] for d in declared} - {d[0] for d in documented})}, "
        f"not declared: {sorted({d[0] for d in documented} - {d[0] for d in declared})}")
    for doc, want in zip(documented, declared, strict=True):
        assert doc == want, f"docs/metrics.md's row for {want[0]} differs from METRICS:\n{doc}\n{want}"


# -- (b) Prometheus' naming conventions --------------------------------------------------------------

@pytest.mark.parametrize("metric", METRICS, ids=lambda m: m.name)
def test_each_name_follows_prometheus_conventions(metric: MetricName) -> None:
    assert re.fullmatch(r"ddpctl_[a-z0-9_]+", metric.name) and "__" not in metric.name
    assert metric.kind in (GAUGE, COUNTER) and metric.source in SOURCES
    assert not metric.name.endswith("_total"), "a counter is declared without _total; gauges never have it"
    assert metric.sample_name.endswith("_total") == (metric.kind == COUNTER)
    help_text = metric.help.lower()
    if "timestamp" in metric.name or "(unix time)" in help_text:
        assert metric.name.endswith("_timestamp_seconds"), "a point in time is *_timestamp_seconds"
    if "(0 to 1)" in help_text:
        assert metric.name.endswith("_ratio"), "a fraction is *_ratio"
    elif re.search(r"\btime\b", help_text):
        assert metric.name.endswith("_seconds"), "a time is in *_seconds"
    if "memory" in help_text:
        assert metric.name.endswith("_bytes"), "memory is in *_bytes"
    if metric.name.endswith("_seconds"):
        assert re.search(r"\btime\b|\bwhen\b", help_text), "a *_seconds series says it is a time"
    if metric.name.endswith("_ratio"):
        assert "(0 to 1)" in help_text or " over " in help_text, "a *_ratio series says it is a fraction"
    assert metric.help.endswith(".") and metric.help == metric.help.strip()
    assert len(set(metric.labels)) == len(metric.labels)
    for label in metric.labels:
        assert re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", label) and not label.startswith("__"), label
        assert label not in ("le", "quantile", "instance"), f"{label} is Prometheus' own label"


def test_no_two_series_share_a_name_or_a_help_text() -> None:
    assert len({m.name for m in METRICS}) == len(METRICS) == len(BY_NAME)
    helps = [m.help for m in METRICS]
    assert sorted(h for h in helps if helps.count(h) > 1) == []
    assert not {m.name for m in METRICS} & SAMPLE_NAMES - {m.sample_name for m in METRICS if m.kind == GAUGE}


# -- (c) the exposition text the agent writes ---------------------------------------------------------

VALUES = (0.0, 1.0, 0.25, 1796000000.125, 3.0e-7, 12345678901.0, 2.5e16, -1.0)


def every_series() -> list[tuple[str, list[tuple[dict[str, str], float]]]]:
    """Two samples of each declared series, with hostile label values (quotes, backslashes, newlines,
    spaces, shell, unicode, empty) that differ between the two."""
    series = []
    for i, metric in enumerate(METRICS):
        samples = []
        for k in range(2):
            labels = {label: f"{HOSTILE[(i + j + k) % len(HOSTILE)]}#{k}" for j, label in enumerate(metric.labels)}
            samples.append((labels, VALUES[(i + k) % len(VALUES)]))
        series.append((metric.name, samples))
    return series


def parsed(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        metric = BY_NAME[family.name]
        assert family.type == metric.kind and family.documentation == metric.help
        for sample in family.samples:
            assert sample.name == metric.sample_name
            out[sample.name, frozenset(sample.labels.items())] = sample.value
    return out


def test_the_exposition_text_parses_back_to_the_same_labels_and_values() -> None:
    series = every_series()
    text = exposition(series)
    want = {(BY_NAME[name].sample_name, frozenset(labels.items())): value
            for name, samples in series for labels, value in samples}
    assert parsed(text) == want
    assert text.endswith("\n") and text.count("# HELP ") == text.count("# TYPE ") == len(METRICS)


def test_the_exposition_text_writes_special_values_and_leaves_out_empty_series() -> None:
    text = exposition([("ddpctl_job_running", []), ("ddpctl_run_goodput_ratio",
                       [({"job_name": "a", "run": "1"}, math.nan), ({"job_name": "b", "run": "2"}, math.inf),
                        ({"job_name": "c", "run": "3"}, -math.inf), ({"job_name": "d", "run": "4"}, 7)])])
    assert "ddpctl_job_running" not in text
    values = {dict(k[1])["job_name"]: v for k, v in parsed(text).items()}
    assert math.isnan(values["a"]) and values["b"] == math.inf and values["c"] == -math.inf and values["d"] == 7
    assert 'ddpctl_run_goodput_ratio{job_name="d",run="4"} 7\n' in text  # labels in the declared order, no ".0"


def test_a_series_given_twice_gets_one_help_and_type() -> None:
    rank = {"Hostname": "node0", "job_name": "train", "run": "r1", "attempt": "0", "local_rank": "0"}
    text = exposition([("ddpctl_rank_steps", [({**rank, "rank": "0"}, 3)]), ("ddpctl_job_running", [({}, 1)]),
                       ("ddpctl_rank_steps", [({**rank, "rank": "1", "local_rank": "1"}, 4)])])
    assert text.count("# TYPE ddpctl_rank_steps_total counter") == 1
    assert len(parsed(text)) == 3


def test_the_exposition_text_refuses_an_undeclared_label_or_series() -> None:
    with pytest.raises(ValueError, match="no label instance"):
        exposition([("ddpctl_job_running", [({"instance": "x"}, 1)])])
    with pytest.raises(KeyError):
        exposition([("ddpctl_no_such_series", [({}, 1)])])


def test_promtool_checks_the_exposition_text_with_no_lint_problem() -> None:
    clean = run_promtool("check", "metrics", stdin=exposition(every_series()))
    assert clean.returncode == 0 and not (clean.stdout + clean.stderr).strip(), clean.stdout + clean.stderr


# -- (d) the alert rules -----------------------------------------------------------------------------

def test_promtool_checks_the_alert_rules() -> None:
    out = run_promtool("check", "rules", str(RULES))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS: 2 rules found" in out.stdout


RULES_TEST = """rule_files: [{rules}]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      # run r1 took its last step at 0 s and still runs: no step for 10 minutes from 11m on
      - series: 'ddpctl_rank_last_step_timestamp_seconds{{Hostname="n0",job_name="train",run="r1",rank="0"}}'
        values: '0x20'
      - series: 'ddpctl_rank_last_step_timestamp_seconds{{Hostname="n1",job_name="train",run="r1",rank="1"}}'
        values: '0x20'
      - series: 'ddpctl_job_running{{Hostname="n0",job_name="train",run="r1",attempt="0"}}'
        values: '1x20'
      - series: 'ddpctl_job_running{{Hostname="n1",job_name="train",run="r1",attempt="0"}}'
        values: '0x20'
      # run r2 ended on every host: no alert however old its last step
      - series: 'ddpctl_rank_last_step_timestamp_seconds{{Hostname="n2",job_name="eval",run="r2",attempt="0",rank="0"}}'
        values: '0x20'
      - series: 'ddpctl_job_running{{Hostname="n2",job_name="eval",run="r2",attempt="0"}}'
        values: '0x20'
      - series: 'ddpctl_host_state{{Hostname="n1",state="quarantined"}}'
        values: '0x5 1x10'
      - series: 'ddpctl_host_state{{Hostname="n0",state="quarantined"}}'
        values: '0x20'
    alert_rule_test:
      - eval_time: 9m
        alertname: DdpctlNoStep
        exp_alerts: []
      - eval_time: 13m
        alertname: DdpctlNoStep
        exp_alerts:
          - exp_labels: {{severity: critical, job_name: train, run: r1}}
            exp_annotations:
              summary: "ddpctl job train (run r1) has taken no step for 10 minutes"
              description: "No rank of job train, run r1, has taken an optimizer step for 13m 0s, yet the job \
still runs. It may hang: `ddpctl stacks` shows where every rank is."
      - eval_time: 10m
        alertname: DdpctlHostQuarantined
        exp_alerts:
          - exp_labels: {{severity: warning, Hostname: n1}}
            exp_annotations:
              summary: "host n1 is quarantined in ddpctl's host ledger"
              description: "ddpctl's ledger holds n1 quarantined: it had too many host faults in the quarantine \
window, and `ddpctl up` leaves it out. After a repair, release it with `ddpctl hosts --release n1 --check`."
"""


def test_the_alerts_fire_for_a_silent_running_job_and_a_quarantined_host_only(tmp_path: Path) -> None:
    test_file = tmp_path / "alerts_test.yml"
    test_file.write_text(RULES_TEST.format(rules=json.dumps(str(RULES))), encoding="utf-8")
    out = run_promtool("test", "rules", str(test_file))
    assert out.returncode == 0, out.stdout + out.stderr


# -- (e) the rules and the dashboard name declared series only ----------------------------------------

def rule_exprs() -> list[str]:
    """Each `expr:` of the rules file (a one-line one, or a folded `>-` block)."""
    exprs, lines = [], RULES.read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"(\s*)expr:\s*(.*)$", line)
        if not m:
            continue
        if m.group(2) not in (">-", ">", "|", "|-"):
            exprs.append(m.group(2))
            continue
        block = []
        for follow in lines[i + 1:]:
            if len(follow) - len(follow.lstrip()) <= len(m.group(1)):
                break
            block.append(follow.strip())
        exprs.append(" ".join(block))
    return exprs


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text(encoding="utf-8"))


def dashboard_exprs() -> list[str]:
    return [target["expr"] for panel in dashboard()["panels"] for target in panel["targets"]]


def referenced(exprs: list[str]) -> set[str]:
    return {name for expr in exprs for name in re.findall(r"\bddpctl_[a-z0-9_]+", expr)}


def test_the_rules_and_the_dashboard_name_only_declared_series() -> None:
    exprs = rule_exprs()
    assert len(exprs) == 2 and all("ddpctl_" in e for e in exprs)
    assert sorted(referenced(exprs) - SAMPLE_NAMES) == [], "the rules name undeclared series"
    used = referenced(dashboard_exprs())
    assert sorted(used - SAMPLE_NAMES) == [], "the dashboard names undeclared series (a counter's ends in _total)"
    for variable in dashboard()["templating"]["list"]:
        assert referenced([json.dumps(variable.get("query", ""))]) <= SAMPLE_NAMES
    assert {"ddpctl_run_goodput_ratio", "ddpctl_run_lost_seconds", "ddpctl_rank_steps_total",
            "ddpctl_rank_step_median_seconds", "ddpctl_rank_step_part_seconds", "ddpctl_rank_straggler",
            "ddpctl_run_straggler", "ddpctl_gpu_info", "ddpctl_gpu_utilization_ratio", "ddpctl_run_restarts_total",
            "ddpctl_host_state"} <= used


def test_the_dashboard_is_grafana_json_with_a_title_and_a_query_per_panel() -> None:
    board = dashboard()
    assert board["title"] and 36 <= board["schemaVersion"] <= 41
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert variables["job"]["definition"] == "label_values(ddpctl_job_info, job_name)"
    ids = [panel["id"] for panel in board["panels"]]
    assert len(set(ids)) == len(ids)
    for panel in board["panels"]:
        assert panel.get("title"), panel
        assert panel.get("targets") and all(t.get("expr") and t.get("refId") for t in panel["targets"]), panel["title"]
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        if "ddpctl_host_state" not in json.dumps(panel["targets"]):  # the ledger's hosts are no job's
            assert all('job_name=~"$job"' in t["expr"] for t in panel["targets"]), panel["title"]


def test_promtool_parses_every_dashboard_query(tmp_path: Path) -> None:
    """Each query, $job replaced by a regex, as a recording rule: promtool parses it as Prometheus would."""
    rules = ["groups:", "  - name: dashboard", "    rules:"]
    for i, expr in enumerate(dashboard_exprs()):
        rules += [f"      - record: dashboard:query{i}", f"        expr: {json.dumps(expr.replace('$job', '.+'))}"]
    path = tmp_path / "dashboard_rules.yml"
    path.write_text("\n".join(rules) + "\n", encoding="utf-8")
    out = run_promtool("check", "rules", str(path))
    assert out.returncode == 0, out.stdout + out.stderr
