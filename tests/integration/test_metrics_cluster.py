"""Metrics where teams already look, on the real cluster with a real Prometheus: node_exporter on each
namespace host reads the job's textfile, Prometheus scrapes those and `up --metrics-port`; while a
2-host job runs, each rank's step counter rises and the straggler flag is on the slowed rank's host;
after the run the series say it ended and the files go; every file and page ddpctl writes passes
`promtool check metrics`; docs/metrics' alert rules load and the quarantine alert fires on the
ledger's `hosts --prom` file."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from inventory import load_inventory
from orchestrator.hostops.ledger import EventKind, Ledger, Note, Sighting
from tests.cluster import Cluster
from tests.ddpctl_run import (
    REPO,
    ddpctl_argv,
    no_job_processes,
    only_summary,
    run_ddpctl,
    ssh_args,
    wait_for,
    write_job,
)
from tests.prometheus import (
    NODE_EXPORTER,
    PROMETHEUS,
    PROMTOOL,
    Prometheus,
    free_port,
    node_exporter_argv,
    prometheus,
    promtool_check_metrics,
    require,
)

pytestmark = pytest.mark.cluster

WATCHED = REPO / "train_jobs" / "watched.py"
ALERTS = REPO / "docs" / "metrics" / "ddpctl-alerts.yml"
EXPORTER_PORT = 9100


def inventory_with_textfiles(cluster: Cluster, dirs: list[Path], path: Path) -> Path:
    """The cluster's inventory, each host with its own textfile directory."""
    lines, host = [], -1
    for line in cluster.hosts_toml.read_text().splitlines():
        lines.append(line)
        if line.startswith("address = "):
            host += 1
            lines.append(f"metrics = {{ textfile_dir = {json.dumps(str(dirs[host]))} }}")
    path.write_text("\n".join(lines) + "\n")
    return path


def test_prometheus_sees_each_rank_step_the_straggler_and_the_end(cluster2: Cluster, tmp_path: Path) -> None:
    require(PROMETHEUS, NODE_EXPORTER, PROMTOOL)
    dirs = [tmp_path / f"textfiles-{i}" for i in range(2)]
    for d in dirs:
        d.mkdir()
        d.chmod(0o755)
    job = write_job(tmp_path, cluster2, "metrics", ["--step-ms", "60", "--steps", "260", "--slow-rank", "3",
                                                    "--slow-ms", "40", "--slow-after", "30"], script=WATCHED)
    inventory = inventory_with_textfiles(cluster2, dirs, tmp_path / "hosts.toml")
    job.write_text(job.read_text().replace(str(cluster2.hosts_toml), str(inventory)) +
                   "[watch]\npulse = 2\nstraggler_warmup = 1\n[metrics]\nevery = 0.5\nkeep_ended = 6\n")
    control = tmp_path / "textfiles-control"  # the control machine's, for `hosts --prom`
    control.mkdir()
    control.chmod(0o755)
    exporters = [cluster2.exec_in(i, node_exporter_argv(dirs[i], cluster2.hosts[i].address, EXPORTER_PORT),
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for i in range(2)]
    control_port = free_port(cluster2.bridge_address)  # this machine may run a node_exporter of its own on 9100
    exporters.append(subprocess.Popen(node_exporter_argv(control, cluster2.bridge_address, control_port),
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    port = free_port()
    targets = {"node": [f"{h.address}:{EXPORTER_PORT}" for h in cluster2.hosts],
               "control": [f"{cluster2.bridge_address}:{control_port}"], "ddpctl": [f"127.0.0.1:{port}"]}
    runs = tmp_path / "runs"
    try:
        with prometheus(tmp_path / "prometheus", targets, [ALERTS]) as prom:
            def rules() -> dict[str, str]:
                return {r["name"]: r["health"] for g in prom.api("rules")["groups"] for r in g["rules"]}

            wait_for(lambda: rules() == {"DdpctlNoStep": "ok", "DdpctlHostQuarantined": "ok"}, 20,
                     "the alert rules loaded and evaluated")
            doctor_sees_the_readers(cluster2, job, dirs, tmp_path)
            up = subprocess.Popen(ddpctl_argv("up", str(job), "--runs-dir", str(runs), "--grace", "3",
                                              "--metrics-port", str(port), *ssh_args(cluster2)),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            try:
                watch_it_run(prom, port, dirs)
                _out, err = up.communicate(timeout=180)
            finally:
                if up.poll() is None:
                    up.kill()
            assert up.returncode == 0, err[-3000:]
            summary = only_summary(runs)
            wait_for(lambda: no_job_processes(cluster2, summary["job_id"]), 30, "no process of the job left")
            after_the_run(prom, dirs, summary)
            quarantine_alert(prom, inventory, control)
    finally:
        for proc in exporters:
            proc.terminate()
            proc.wait(10)


def doctor_sees_the_readers(cluster: Cluster, job: Path, dirs: list[Path], tmp_path: Path) -> None:
    """doctor's metrics_dir check, with each host's node_exporter running: both read; then node1's
    directory missing: a warning for node1 alone, and doctor still passes."""
    def findings(job_file: Path) -> tuple[int, dict[str | None, tuple[str, str]]]:
        out = run_ddpctl("doctor", str(job_file), "--json", *ssh_args(cluster), timeout=120)
        data = json.loads(out.stdout)
        return out.returncode, {f["host"]: (f["status"], f["message"]) for f in data["findings"]
                                if f["check"] == "metrics_dir"}

    code, found = findings(job)
    reads = "is writable by root and node_exporter reads it"
    assert code == 0 and found == {f"node{i}": ("ok", f"metrics_dir {dirs[i]} {reads}") for i in range(2)}, found
    missing = tmp_path / "missing"
    inventory = inventory_with_textfiles(cluster, [dirs[0], missing], tmp_path / "hosts-missing.toml")
    broken = tmp_path / "job-missing.toml"
    broken.write_text(job.read_text().replace(str(tmp_path / "hosts.toml"), str(inventory)))
    code, found = findings(broken)
    assert code == 0 and found["node0"][0] == "ok" and found["node1"][0] == "warn", found
    assert found["node1"][1].startswith(f"metrics_dir {missing} does not exist on node1"), found


def watch_it_run(prom: Prometheus, port: int, dirs: list[Path]) -> None:

    def steps() -> dict[str, float]:
        return prom.values("ddpctl_rank_steps_total", "rank")

    first = wait_for(lambda: (s := steps()) and len(s) == 4 and all(v > 0 for v in s.values()) and s, 90,
                     "every rank's step counter in Prometheus")
    assert set(first) == {"0", "1", "2", "3"}
    wait_for(lambda: all(v > first[r] for r, v in steps().items()), 30, "every rank's step counter rising")
    hosts = {r["metric"]["rank"]: r["metric"]["Hostname"] for r in prom.query("ddpctl_rank_steps_total")}
    assert hosts == {"0": "node0", "1": "node0", "2": "node1", "3": "node1"}
    flagged = wait_for(lambda: prom.query("ddpctl_rank_straggler == 1"), 90, "the straggler flag on a rank")
    assert [(r["metric"]["Hostname"], r["metric"]["rank"]) for r in flagged] == [("node1", "3")]
    assert prom.values("ddpctl_rank_straggler == 0", "rank").keys() == {"0", "1", "2"}
    # `up`'s own series: the same straggler, the run going, its goodput so far
    wait_for(lambda: prom.query("ddpctl_run_straggler"), 30, "up's straggler series")
    assert [(r["metric"]["Hostname"], r["metric"]["rank"]) for r in prom.query("ddpctl_run_straggler")] == [
        ("node1", "3")]
    assert prom.values("ddpctl_run_running", "job_name") == {"metrics": 1.0}
    wait_for(lambda: prom.query("ddpctl_run_goodput_ratio"), 30, "up's goodput so far")
    assert prom.values('ddpctl_run_hosts{state="running"}', "job_name") == {"metrics": 2.0}
    # every file and page ddpctl writes passes promtool's check, as they are while the job runs
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        page = reply.read().decode()
    assert "ddpctl_run_goodput_ratio{" in page and promtool_check_metrics(page) == "", page
    for d in dirs:
        (textfile,) = d.glob("ddpctl-*.prom")
        text = textfile.read_text()
        assert "ddpctl_job_running{" in text and promtool_check_metrics(text) == "", text


def after_the_run(prom: Prometheus, dirs: list[Path], summary: dict[str, object]) -> None:
    ended = wait_for(lambda: (v := prom.values("ddpctl_job_running", "Hostname")) == {"node0": 0.0, "node1": 0.0}
                     and v, 20, "both hosts' textfiles saying the job ended")
    assert ended
    exit_codes = prom.values("ddpctl_job_exit_code", "Hostname")
    assert exit_codes == {"node0": 0.0, "node1": 0.0}
    assert prom.values("ddpctl_rank_steps_total", "rank") == {r: 260.0 for r in ("0", "1", "2", "3")}
    for d in dirs:
        (textfile,) = d.glob("ddpctl-*.prom")
        assert promtool_check_metrics(textfile.read_text()) == ""
    # up served the final values to one more scrape before it left
    assert prom.values("ddpctl_run_running", "job_name") == {"metrics": 0.0}
    goodput = prom.values("ddpctl_run_goodput_ratio", "job_name")["metrics"]
    account = summary["account"]
    assert isinstance(account, dict) and goodput == pytest.approx(account["goodput"], abs=0.02)
    lost = prom.values('ddpctl_run_lost_seconds{kind="straggler"}', "Hostname")
    assert set(lost) == {"node1"} and lost["node1"] > 0
    wait_for(lambda: not [f for d in dirs for f in d.glob("ddpctl-*.prom")], 30,
             "the ended job's textfiles removed after keep_ended")


def quarantine_alert(prom: Prometheus, inventory: Path, control: Path) -> None:
    """Two host faults quarantine node1 in the ledger; `hosts --prom` into the control machine's
    textfile directory; the alert rule from docs/metrics fires for node1."""
    hosts = load_inventory(inventory).hosts
    node1 = next(h for h in hosts if h.name == "node1")
    now = time.time()
    for i in range(2):
        Ledger().record(f"metrics-{i}", "up", [Sighting(h) for h in hosts],
                        [Note(node1, EventKind.LOST, "node1 lost: link down", at=now - 60 + i)], at=now - 60 + i)
    out = run_ddpctl("hosts", "--inventory", str(inventory), "--prom", str(control / "ddpctl-hosts.prom"))
    assert out.returncode == 0, out.stderr
    text = (control / "ddpctl-hosts.prom").read_text()
    assert promtool_check_metrics(text) == "", text
    wait_for(lambda: prom.values('ddpctl_host_state{state="quarantined"} == 1', "Hostname") == {"node1": 1.0}, 20,
             "the ledger's quarantine in Prometheus")
    alerts = wait_for(lambda: [a for a in prom.api("alerts")["alerts"] if a["labels"]["alertname"] ==
                               "DdpctlHostQuarantined"], 20, "the quarantine alert")
    assert [a["labels"]["Hostname"] for a in alerts] == ["node1"]
