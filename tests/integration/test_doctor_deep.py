"""`ddpctl doctor --deep` on the real 8-host namespace cluster: a host whose link is rate-limited (tbf
on both ends) and a host whose sessions get a sliver of a core are each named, with the right kind,
and no other host is (in the findings or as `suspect` in the ledger); a host that barely moves data
and one that is starved are named at their deadlines, so the run ends within about twice its
healthy time; a host with both faults is named once per kind; a healthy cluster gives no finding,
run after run."""

from __future__ import annotations

import json
import time
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
HOSTS = 8


@pytest.fixture(scope="module")
def cluster8(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    require_cluster()
    with start_cluster(HOSTS, tmp_path_factory.mktemp("deep")) as c:
        yield c


@pytest.fixture(scope="module")
def healthy_s(cluster8: Cluster, tmp_path_factory: pytest.TempPathFactory) -> list[float]:
    """Two healthy runs first: their wall times (the reference for the deadlines) and no finding."""
    times = []
    for run in range(2):
        report, took = timed_deep(cluster8, tmp_path_factory.mktemp(f"healthy{run}"))
        times.append(took)
        assert flagged(report) == {"links": set(), "compute": set()}, report["findings"]
        figures = report["deep"]
        assert figures["all_pairs"] and len(figures["links"]) == HOSTS * (HOSTS - 1) // 2, figures["links"]
        assert figures["missed"] == [] and figures["tested"] == list(range(HOSTS))
        assert sorted(row["rank"] for row in figures["compute"]) == list(range(HOSTS))
        assert figures["hosts"] == [h.name for h in cluster8.hosts]
        assert report["exit_code"] == 0
    return times


def deep(cluster: Cluster, tmp_path: Path) -> dict[str, Any]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    job = write_job(tmp_path, cluster, "deep", nproc=1, env=ENV)
    out = run_ddpctl("doctor", str(job), "--deep", "--json", "--runs-dir", str(tmp_path / "runs"),
                     *ssh_args(cluster), timeout=400)
    report: dict[str, Any] = json.loads(out.stdout)
    assert report["deep"] is not None, out.stdout[-3000:] + out.stderr[-2000:]
    return report


def timed_deep(cluster: Cluster, tmp_path: Path) -> tuple[dict[str, Any], float]:
    started = time.monotonic()
    report = deep(cluster, tmp_path)
    return report, time.monotonic() - started


def flagged(report: dict[str, Any]) -> dict[str, set[str]]:
    """check -> the hosts it warned about or failed."""
    out: dict[str, set[str]] = {c: set() for c in DEEP}
    for f in report["findings"]:
        if f["check"] in DEEP and f["status"] in ("warn", "fail"):
            out[f["check"]].add(f["host"])
    return out


def ledger_states(cluster: Cluster) -> dict[str, str]:
    out = run_ddpctl("hosts", "-i", str(cluster.hosts_toml), "--json")
    return {row["name"]: row["state"] for row in json.loads(out.stdout)["hosts"]}


def one(report: dict[str, Any], check: str, host: str) -> dict[str, Any]:
    (found,) = [f for f in report["findings"] if f["check"] == check and f["host"] == host]
    return found


def test_a_healthy_cluster_gives_no_deep_finding_in_repeated_runs(healthy_s: list[float]) -> None:
    assert len(healthy_s) == 2  # the fixture's two runs, each checked there


def test_a_slow_link_and_a_starved_host_are_named_and_no_other_host(cluster8: Cluster, tmp_path: Path,
                                                                   healthy_s: list[float]) -> None:
    """The case of the issue: node3 at 40 Mbit/s, node5's sessions at 4 % of a core."""
    slow, starved = cluster8.hosts[3].name, cluster8.hosts[5].name
    with slow_link(cluster8, 3, "40mbit"), cpu_quota(cluster8, 5, 4):
        report, took = timed_deep(cluster8, tmp_path)
    assert flagged(report) == {"links": {slow}, "compute": {starved}}, report["findings"]
    link = one(report, "links", slow)
    assert link["message"].startswith("its links are ") and "a degraded NIC or cable" in link["message"]
    assert link["basis"]["measurements"] >= 2 and len(link["basis"]["partners"]) >= 2, link
    compute = one(report, "compute", starved)
    assert compute["message"].startswith(("did not start its host check in", "did not finish its compute test in",
                                          "compute ")), compute
    # no peer of either is blamed, and only those two are suspect in the ledger
    assert ledger_states(cluster8) == {h.name: "suspect" if h.name in (slow, starved) else "ok"
                                       for h in cluster8.hosts}
    assert took < 2 * max(healthy_s) + 10, (took, healthy_s)
    # repaired (the faults are gone): released with a measurement against three hosts known good
    out = run_ddpctl("hosts", "-i", str(cluster8.hosts_toml), "--release", slow, "--check", "--json",
                     "--runs-dir", str(tmp_path / "release"), *ssh_args(cluster8), timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    checked = json.loads(out.stdout)
    assert checked["released"] and len(checked["partners"]) == 3 and starved not in checked["partners"]
    assert ledger_states(cluster8)[slow] == "ok"


def test_a_link_that_barely_moves_and_a_starved_host_end_within_twice_the_healthy_time(
        cluster8: Cluster, tmp_path: Path, healthy_s: list[float]) -> None:
    crawling, starved = cluster8.hosts[2].name, cluster8.hosts[6].name
    with slow_link(cluster8, 2, "2mbit"), cpu_quota(cluster8, 6, 4):
        report, took = timed_deep(cluster8, tmp_path)
    assert flagged(report) == {"links": {crawling}, "compute": {starved}}, report["findings"]
    assert took < 2 * max(healthy_s) + 10, (took, healthy_s)  # the two cores' noise: 10 s
    link = one(report, "links", crawling)
    assert "below the others' median" in link["message"], link


def test_a_host_with_a_slow_link_and_a_slow_cpu_is_named_once_per_kind_and_no_peer_is_blamed(
        cluster8: Cluster, tmp_path: Path, healthy_s: list[float]) -> None:
    both = cluster8.hosts[4].name
    with slow_link(cluster8, 4, "40mbit"), cpu_quota(cluster8, 4, 15):
        report = deep(cluster8, tmp_path)
        held = run_ddpctl("hosts", "-i", str(cluster8.hosts_toml), "--release", both, "--check",
                          "--runs-dir", str(tmp_path / "release"), *ssh_args(cluster8), timeout=300)
    assert held.returncode == 1, held.stdout[-2000:] + held.stderr[-2000:]
    assert f"{both} is not released" in held.stdout and "[compute]" in held.stdout, held.stdout
    found = flagged(report)
    assert found["compute"] == {both} and found["links"] <= {both}, report["findings"]
    assert len([f for f in report["findings"] if f["host"] == both and f["check"] == "compute"]) == 1
    assert len([f for f in report["findings"] if f["host"] == both and f["check"] == "links"]) <= 1
    assert {h for h, s in ledger_states(cluster8).items() if s != "ok"} == {both}
