"""`ddpctl doctor --deep` on the real namespace cluster: a host whose link is rate-limited (tbf on
both ends) and a host whose sessions get a small CPU quota are each named, with the right kind,
and nothing else is; a healthy cluster gives no finding, run after run."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster import Cluster, require_cluster, start_cluster
from tests.cluster_faults import cpu_quota, slow_link
from tests.ddpctl_run import run_ddpctl, ssh_args, write_job

pytestmark = pytest.mark.cluster
ENV = {"GLOO_SOCKET_IFNAME": "eth0", "NCCL_SOCKET_IFNAME": "eth0", "NCCL_IB_DISABLE": "1"}
DEEP = ("links", "compute")


@pytest.fixture(scope="module")
def cluster5(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    require_cluster()
    with start_cluster(5, tmp_path_factory.mktemp("deep")) as c:
        yield c


def deep(cluster: Cluster, tmp_path: Path) -> dict[str, Any]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    job = write_job(tmp_path, cluster, "deep", nproc=1, env=ENV)
    out = run_ddpctl("doctor", str(job), "--deep", "--json", "--runs-dir", str(tmp_path / "runs"),
                     *ssh_args(cluster), timeout=300)
    report: dict[str, Any] = json.loads(out.stdout)
    assert report["deep"] is not None, out.stdout[-3000:] + out.stderr[-2000:]
    return report


def flagged(report: dict[str, Any]) -> dict[str, set[str]]:
    """check -> the hosts it warned about or failed."""
    out: dict[str, set[str]] = {c: set() for c in DEEP}
    for f in report["findings"]:
        if f["check"] in DEEP and f["status"] in ("warn", "fail"):
            out[f["check"]].add(f["host"])
    return out


def test_a_healthy_cluster_gives_no_deep_finding_in_repeated_runs(cluster5: Cluster, tmp_path: Path) -> None:
    for run in range(2):
        report = deep(cluster5, tmp_path / str(run))
        assert flagged(report) == {"links": set(), "compute": set()}, report["findings"]
        figures = report["deep"]
        assert figures["all_pairs"] and len(figures["links"]) == 10 and figures["rounds"] == 5
        assert sorted(row["rank"] for row in figures["compute"]) == [0, 1, 2, 3, 4]
        assert figures["hosts"] == [h.name for h in cluster5.hosts]
        assert report["exit_code"] == 0
        gpu = [f for f in report["findings"] if f["check"] == "gpu_health"]  # these hosts have no nvidia-smi
        assert sorted(f["host"] for f in gpu) == figures["hosts"] and {f["status"] for f in gpu} == {"skip"}


def test_deep_names_the_slow_link_and_the_slow_host_each_with_its_kind(cluster5: Cluster, tmp_path: Path) -> None:
    slow, throttled = cluster5.hosts[1].name, cluster5.hosts[3].name
    with slow_link(cluster5, 1, "40mbit"), cpu_quota(cluster5, 3, 20):
        report = deep(cluster5, tmp_path)
    assert flagged(report) == {"links": {slow}, "compute": {throttled}}, report["findings"]
    link = next(f for f in report["findings"] if f["check"] == "links" and f["host"] == slow)
    assert link["message"].startswith("every link ") and "a degraded NIC or cable" in link["message"]
    compute = next(f for f in report["findings"] if f["check"] == "compute" and f["host"] == throttled)
    assert compute["message"].startswith("compute ") and "below the median of its 4 peer(s)" in compute["message"]
    assert compute["fix"] and link["fix"]
    assert report["exit_code"] == 0  # warnings: the job could run, slowly
    out = run_ddpctl("hosts", "-i", str(cluster5.hosts_toml), "--json")  # the ledger remembers both as suspect
    states = {row["name"]: row["state"] for row in json.loads(out.stdout)["hosts"]}
    assert states == {h.name: "suspect" if h.name in (slow, throttled) else "ok" for h in cluster5.hosts}, out.stdout
