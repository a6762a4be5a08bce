"""`ddpctl doctor --deep` on the real 8-host namespace cluster whose hostnames resolve nowhere (no DNS,
no /etc/hosts entry: common on bare metal and DHCP-named cloud hosts) and whose job leaves
GLOO_SOCKET_IFNAME to ddpctl: a healthy cluster gives no finding, run after run, and the check's
processes show a short command line with no program source on it; a host whose link is rate-limited
(tbf on both ends) and a host whose sessions get a sliver of a core are each named, with the right
kind, and no other host is (in the findings or as `suspect` in the ledger); a host that barely moves
data and one that is starved are named at their deadlines; a host with both faults is named once per
kind. A start that fails is named with what the host printed: a host that cannot reach node 0's
store (the others' figures stand), and node 0 itself starved (no coordinator: doctor's own bound).
How long each case takes beside the healthy one is bench/doctor_deep.py's (docs/performance.md)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from orchestrator.remote.programs import SHIPPED, TRAIN_JOBS
from tests.cluster import Cluster, require_cluster, start_cluster
from tests.cluster_faults import Process, cpu_quota, job_processes, slow_link, store_cut_once_started
from tests.ddpctl_run import ddpctl_argv, run_ddpctl, ssh_args, wait_for, write_job

pytestmark = pytest.mark.cluster
ENV = {"NCCL_IB_DISABLE": "1"}  # no GLOO_SOCKET_IFNAME: where a host's name resolves nowhere, ddpctl sets it
DEEP = ("links", "compute")
HOSTS = 8
JOB_PREFIX = "ddpctl-deep-"  # the host check's job ids
RUN_BOUND_S = 400  # a run that takes longer is stuck (the test fails rather than hangs)
LOOK_EVERY_S = 0.5  # how often a test looks at the check's processes while it runs (one pass over /proc)


@dataclass
class Seen:
    """The host check's processes seen while it ran: pid -> (host index, command line, environment)."""

    processes: dict[int, Process] = field(default_factory=dict)

    @classmethod
    def now(cls, cluster: Cluster) -> Seen:
        return cls(job_processes(cluster, JOB_PREFIX))

    def look(self, cluster: Cluster) -> None:
        self.processes.update(job_processes(cluster, JOB_PREFIX))


@pytest.fixture(scope="module")
def cluster8(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    require_cluster()
    with start_cluster(HOSTS, tmp_path_factory.mktemp("deep")) as c:
        yield c


@pytest.fixture(scope="module")
def healthy(cluster8: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Seen:
    """Two healthy runs first, each with no finding; the check's processes as the second saw them."""
    seen = Seen()
    for run in range(2):
        look = (lambda: seen.look(cluster8)) if run else None
        report = deep(cluster8, tmp_path_factory.mktemp(f"healthy{run}"), look)
        assert [f for f in report["findings"] if f["status"] in ("warn", "fail")] == [], report["findings"]
        figures = report["deep"]
        assert figures["all_pairs"] and len(figures["links"]) == HOSTS * (HOSTS - 1) // 2, figures["links"]
        assert figures["missed"] == [] and figures["tested"] == list(range(HOSTS))
        assert sorted(row["rank"] for row in figures["compute"]) == list(range(HOSTS))
        assert figures["hosts"] == [h.name for h in cluster8.hosts]
        assert report["exit_code"] == 0
    return seen


def deep(cluster: Cluster, tmp_path: Path, during: Callable[[], None] | None = None,
         expect_figures: bool = True) -> dict[str, Any]:
    """doctor --deep's JSON report; `during` is called again and again while it runs."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    job = write_job(tmp_path, cluster, "deep", nproc=1, env=ENV)
    argv = ddpctl_argv("doctor", str(job), "--deep", "--json", "--runs-dir", str(tmp_path / "runs"),
                       *ssh_args(cluster))
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ticks = 0
    while True:
        try:
            stdout, stderr = proc.communicate(timeout=LOOK_EVERY_S)
            break
        except subprocess.TimeoutExpired:
            ticks += 1
            if ticks * LOOK_EVERY_S > RUN_BOUND_S:
                proc.kill()
                raise
            if during is not None:
                during()
    report: dict[str, Any] = json.loads(stdout)
    assert (report["deep"] is not None) == expect_figures, stdout[-3000:] + stderr[-2000:]
    return report


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


def test_a_healthy_cluster_whose_names_resolve_nowhere_gives_no_deep_finding_in_repeated_runs(
        cluster8: Cluster, healthy: Seen) -> None:
    """Nothing in the check dials a host by its name: torchrun's own store on loopback (--local-addr),
    node 0's store at its address, a pair's gloo device on the interface ddpctl picked."""
    assert not any(cluster8.resolves(i) for i in range(HOSTS))
    on = {i for i, _argv, _env in healthy.processes.values()}
    assert on == set(range(HOSTS)), healthy.processes
    assert {env.get("GLOO_SOCKET_IFNAME") for _i, _argv, env in healthy.processes.values()} == {"eth0"}  # ddpctl's


def test_the_checks_processes_show_a_short_command_line_with_no_program_source(healthy: Seen) -> None:
    """What `ps` shows of torchrun and the check on each host: a few hundred bytes, names and not
    sources (the modules are in the job's state directory, from the agent's cache)."""
    sources = {line.strip() for rel in SHIPPED for line in (TRAIN_JOBS / rel).read_text().splitlines()
               if len(line.strip()) > 30}
    workers = [argv for _i, argv, _env in healthy.processes.values() if "train_jobs.hostcheck.check" in argv]
    assert len({i for i, argv, _env in healthy.processes.values() if argv in workers}) == HOSTS
    for _i, argv, _env in healthy.processes.values():
        line = " ".join(argv)
        assert len(line.encode()) < 1024, line
        assert not [s for s in sources if s in line], line


def test_a_slow_link_and_a_starved_host_are_named_and_no_other_host(cluster8: Cluster, tmp_path: Path,
                                                                   healthy: Seen) -> None:
    """The case of the issue: node3 at 40 Mbit/s, node5's sessions at 4 % of a core."""
    slow, starved = cluster8.hosts[3].name, cluster8.hosts[5].name
    with slow_link(cluster8, 3, "40mbit"), cpu_quota(cluster8, 5, 4):
        report = deep(cluster8, tmp_path)
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
    # repaired (the faults are gone): released with a measurement against three hosts known good
    out = run_ddpctl("hosts", "-i", str(cluster8.hosts_toml), "--release", slow, "--check", "--json",
                     "--runs-dir", str(tmp_path / "release"), *ssh_args(cluster8), timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    checked = json.loads(out.stdout)
    assert checked["released"] and len(checked["partners"]) == 3 and starved not in checked["partners"]
    assert ledger_states(cluster8)[slow] == "ok"


def test_a_link_that_barely_moves_and_a_starved_host_are_each_named_at_their_deadline(
        cluster8: Cluster, tmp_path: Path, healthy: Seen) -> None:
    crawling, starved = cluster8.hosts[2].name, cluster8.hosts[6].name
    with slow_link(cluster8, 2, "2mbit"), cpu_quota(cluster8, 6, 4):
        report = deep(cluster8, tmp_path)
    assert flagged(report) == {"links": {crawling}, "compute": {starved}}, report["findings"]
    link = one(report, "links", crawling)
    assert "below the others' median" in link["message"], link
    late = one(report, "compute", starved)
    assert late["message"].startswith(("did not start its host check in", "did not finish its compute test in")), late


def test_a_host_with_a_slow_link_and_a_slow_cpu_is_named_once_per_kind_and_no_peer_is_blamed(
        cluster8: Cluster, tmp_path: Path, healthy: Seen) -> None:
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


def test_a_host_that_cannot_reach_node_0s_store_is_named_with_what_it_printed_and_the_others_figures_stand(
        cluster8: Cluster, tmp_path: Path, healthy: Seen) -> None:
    """Host 3's packets to the master port are dropped once its check is under way (before, doctor's
    own probe of that port would find the firewall first): its check starts and never joins."""
    cut = cluster8.hosts[3].name
    with store_cut_once_started(cluster8, 3) as blocked:
        report = deep(cluster8, tmp_path)
    assert blocked, "the check never started on host 3"
    assert flagged(report) == {"links": set(), "compute": {cut}}, report["findings"]
    named = one(report, "compute", cut)
    assert named["status"] == "fail", named
    assert named["message"].startswith(f"started its host check but did not reach node 0's store at {blocked[0]} in ")
    assert named["evidence"].startswith(f"{cut} printed:") and "DDPCTL-DEEP-START rank=3" in named["evidence"]
    figures = report["deep"]  # the other seven were measured in full
    others = [r for r in range(HOSTS) if r != 3]
    assert figures["tested"] == others and sorted(row["rank"] for row in figures["compute"]) == others
    assert {(row["a"], row["b"]) for row in figures["links"]} == {(a, b) for a in others for b in others if a < b}
    assert [m["phase"] for m in figures["missed"]] == ["join"]


def test_node_0_starved_is_named_by_doctor_itself_with_what_it_printed(cluster8: Cluster, tmp_path: Path,
                                                                      healthy: Seen) -> None:
    """Node 0 coordinates the check; starved (4 % of a core), it does not start, and no host could
    name it: doctor does, at the start deadline, and stops the others."""
    node0 = cluster8.hosts[0].name
    with cpu_quota(cluster8, 0, 4):
        report = deep(cluster8, tmp_path, expect_figures=False)
    assert flagged(report) == {"links": {node0}, "compute": {node0}}, report["findings"]
    named = one(report, "compute", node0)
    assert named["message"].startswith("did not start its host check in ") and "the others started in" in \
        named["message"], named
    assert named["evidence"].startswith(f"{node0} printed"), named
    assert one(report, "links", node0)["message"] == "the host check printed no result"
    wait_for(lambda: not Seen.now(cluster8).processes, 30, "every host's check to end")
