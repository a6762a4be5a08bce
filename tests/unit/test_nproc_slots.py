"""A host's slots (a DeepSpeed/MPI hostfile's `slots=2`, an inventory's `slots = 2`) are its process
count where the job sets no nproc_per_node (issue 27); the plan and the dry run say which source won."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from inventory import Host, HostNproc, Inventory, Job, JobOverrides, load_job
from inventory.slurm_table import nproc_for
from inventory.specs import SlurmSpec
from orchestrator.checks.context import from_job
from orchestrator.checks.model import CheckStatus, Observations, ProbeResults
from orchestrator.checks.node import check_nproc
from orchestrator.cli import app
from orchestrator.launch.labels import labels_for
from orchestrator.launch.plan import Nproc, build_plan
from orchestrator.launch.preflight import resolve_nprocs, static_nprocs
from orchestrator.remote.wire import Facts, HostFacts

HOSTFILE = "198.18.9.1 slots=2\n198.18.9.2 slots=3\n198.18.9.3\n"
runner = CliRunner()


def job_dir(tmp_path: Path, job: str, hostfile: str = HOSTFILE) -> Path:
    (tmp_path / "hostfile").write_text(hostfile)
    (tmp_path / "train.py").write_text("")
    path = tmp_path / "job.toml"
    path.write_text('inventory = "hostfile"\n[job]\nscript = "train.py"\n' + job)
    return path


def facts(name: str, gpus: int = 0, cpus: int = 8) -> HostFacts:
    return HostFacts(name, Facts(cpu_count=cpus, gpu_count=gpus))


def test_a_job_without_nproc_per_node_runs_each_hosts_slots_else_one(tmp_path: Path) -> None:
    job = load_job(job_dir(tmp_path, ""))
    assert job.nproc_per_node is None
    assert [job.nproc_of(h) for h in job.hosts] == [HostNproc(2, "hostfile slots"), HostNproc(3, "hostfile slots"),
                                                    HostNproc(1, "default")]
    assert static_nprocs(job) == {"198.18.9.1": 2, "198.18.9.2": 3, "198.18.9.3": 1}


@pytest.mark.parametrize("overrides", [None, JobOverrides(nproc_per_node=4)])
def test_the_jobs_nproc_per_node_wins_over_slots(tmp_path: Path, overrides: JobOverrides | None) -> None:
    job = load_job(job_dir(tmp_path, "nproc_per_node = 4\n" if overrides is None else ""), overrides)
    assert {job.nproc_of(h) for h in job.hosts} == {HostNproc(4, "job nproc_per_node")}


def test_an_inventory_hosts_slots_are_named_as_such(tmp_path: Path) -> None:
    (tmp_path / "hosts.toml").write_text('[[hosts]]\nname = "n0"\naddress = "198.18.9.1"\nslots = 2\n')
    (tmp_path / "train.py").write_text("")
    (tmp_path / "job.toml").write_text('inventory = "hosts.toml"\n[job]\nscript = "train.py"\n')
    job = load_job(tmp_path / "job.toml")
    assert job.nproc_of(job.hosts[0]) == HostNproc(2, "inventory slots")


def test_the_plan_numbers_ranks_by_each_hosts_own_count(tmp_path: Path) -> None:
    job = load_job(job_dir(tmp_path, ""))
    plan = build_plan(job, "j", static_nprocs(job) or {}, 29500)
    assert plan.world_size == 6
    assert [(hl.nproc, hl.nproc_source, hl.first_rank) for hl in plan.hosts] == [
        (2, "hostfile slots", 0), (3, "hostfile slots", 2), (1, "default", 5)]
    assert [hl.launcher[hl.launcher.index("--nproc-per-node") + 1] for hl in plan.hosts] == ["2", "3", "1"]
    # torchrun numbers the ranks by the counts of the nodes before: node 1's local rank 0 is rank 2
    assert labels_for(plan.hosts[1], c10d=False) == {"[default0]:": "2", "[default1]:": "3", "[default2]:": "4"}
    assert plan.hosts[2].rank_of(0) == 5


def test_resolved_counts_carry_what_decided_them() -> None:
    hosts = (Host("g", "198.18.9.1"), Host("c", "198.18.9.2"), Host("s", "198.18.9.3", slots=2))
    job = Job(name="t", inventory=Inventory(hosts), hosts=hosts[:2], script="train.py", nproc_per_node="auto")
    got = resolve_nprocs(job, {"g": facts("g", gpus=4), "c": facts("c", cpus=6)})
    assert got == {"g": 4, "c": 6}
    assert [(n, n.source) for n in got.values() if isinstance(n, Nproc)] == [(4, "auto: GPUs"),
                                                                            (6, "auto: CPUs, no GPU")]
    slots = Job(name="t", inventory=Inventory(hosts), hosts=hosts[2:], script="train.py")
    (n,) = resolve_nprocs(slots, {"s": facts("s", gpus=8)}).values()
    assert (n, getattr(n, "source", None)) == (2, "hostfile slots")  # slots are a number: GPUs do not matter


def test_the_dry_run_shows_each_hosts_count_and_its_source(tmp_path: Path) -> None:
    out = runner.invoke(app, ["up", str(job_dir(tmp_path, "[rendezvous]\nmaster_port = 29555\n")), "--dry-run"])
    assert out.exit_code == 0, out.output
    assert "3 host(s), world size 6" in out.output
    assert "198.18.9.1 (node_rank 0, nproc 2 (hostfile slots), ssh 198.18.9.1" in out.output
    assert "198.18.9.2 (node_rank 1, nproc 3 (hostfile slots)" in out.output
    assert "198.18.9.3 (node_rank 2, nproc 1 (default)" in out.output
    out = runner.invoke(app, ["up", str(job_dir(tmp_path, "[rendezvous]\nmaster_port = 29555\n")), "--dry-run",
                              "--nproc-per-node", "2"])
    assert out.output.count("nproc 2 (job nproc_per_node)") == 3


def test_doctor_judges_each_hosts_slots_against_its_cpus(tmp_path: Path) -> None:
    job = load_job(job_dir(tmp_path, "", "198.18.9.1 slots=64\n198.18.9.2 slots=2\n"))
    ctx = from_job(job)
    obs = Observations(ctx, {h.name: facts(h.name, cpus=4) for h in job.hosts}, {}, ProbeResults())
    findings = {f.host: f for f in check_nproc(obs)}
    assert findings["198.18.9.1"].status == CheckStatus.FAIL
    assert findings["198.18.9.1"].message.startswith("hostfile slots = 64 would start 64 ranks on 198.18.9.1")
    assert findings["198.18.9.2"].status == CheckStatus.OK
    assert findings["198.18.9.2"].message.startswith("2 rank(s) (hostfile slots = 2) on 4 CPU(s)")


def test_on_slurm_a_job_without_nproc_per_node_runs_one_rank_per_node() -> None:
    job = Job(name="t", inventory=Inventory(()), hosts=(), script="train.py", slurm=SlurmSpec(gpus_per_node=4))
    assert nproc_for(job, SlurmSpec(gpus_per_node=4)) == 1
