"""Pure launch planning: torchrun argv (static, c10d, module), node ranks, env masking, nproc."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest

from inventory import ConfigError, Host, Inventory, Job, Rendezvous
from inventory.model import MetricsSpec
from orchestrator.launch.backends.base import supervise_request
from orchestrator.launch.labels import RankLines, labels_for, split_rank
from orchestrator.launch.options import LaunchOptions
from orchestrator.launch.plan import build_plan, mask_env
from orchestrator.launch.preflight import resolve_nprocs
from orchestrator.remote.wire import Facts, HostFacts, PythonFact, WorkdirFact

A = Host(name="a", address="198.18.0.1", python="/opt/py/bin/python")
B = Host(name="b", address="198.18.0.2", python="python3")
C = Host(name="c", address="198.18.0.3", python="python3")


def make_job(hosts: tuple[Host, ...] = (A, B), backend: str = "static", module: str | None = None,
             nproc: int | str = 2, env: dict[str, str] | None = None) -> Job:
    return Job(name="t", inventory=Inventory(hosts=(A, B, C)), hosts=hosts,
               script=None if module else "train.py", module=module, args=("--lr", "0.1"),
               nproc_per_node=nproc,  # type: ignore[arg-type]
               rendezvous=Rendezvous(backend=backend),  # type: ignore[arg-type]
               env=env or {}, source=Path("/jobs/job.toml"), base_dir=Path("/jobs"))


def facts(name: str, gpus: int = 0, cpus: int = 8) -> HostFacts:
    return HostFacts(host=name, facts=Facts(hostname=name, cpu_count=cpus, gpu_count=gpus,
                                            python=PythonFact(found="/usr/bin/python3"),
                                            workdir=WorkdirFact(exists=True)))


def test_static_argv_carries_node_rank_and_master() -> None:
    plan = build_plan(make_job(), "t-1", {"a": 2, "b": 2}, 29500)
    a, b = plan.hosts
    assert a.argv() == ["/opt/py/bin/python", "-m", "torch.distributed.run", "--nnodes", "2",
                        "--nproc-per-node", "2", "--node-rank", "0", "--master-addr", "198.18.0.1",
                        "--master-port", "29500", "--max-restarts", "0", "--redirects", "3",
                        "train.py", "--lr", "0.1"]
    assert b.argv()[b.argv().index("--node-rank") + 1] == "1"
    assert b.argv()[0] == "python3"
    assert plan.world_size == 4 and plan.master_addr == "198.18.0.1"


def test_c10d_argv_uses_rendezvous_endpoint_and_job_id_without_node_rank() -> None:
    plan = build_plan(make_job(backend="c10d"), "t-xyz", {"a": 2, "b": 2}, 29400)
    for hl in plan.hosts:
        argv = hl.argv()
        joined = " ".join(argv)
        assert "--rdzv-backend c10d --rdzv-endpoint 198.18.0.1:29400 --rdzv-id t-xyz" in joined
        assert "--node-rank" not in argv and "--master-addr" not in argv


def test_c10d_gives_each_host_the_address_it_reported_never_its_name() -> None:
    """torchrun's c10d rendezvous hands the other hosts each host's own name unless --local-addr
    says its address: a name that resolves nowhere would hang the launch (issue 54)."""
    plan = build_plan(make_job(backend="c10d"), "t-xyz", {"a": 1, "b": 1}, 29400,
                      local_addrs={"a": "198.18.0.1", "b": "198.18.0.12"})
    assert [hl.argv()[hl.argv().index("--local-addr") + 1] for hl in plan.hosts] == ["198.18.0.1", "198.18.0.12"]
    # node 0 holds the store: said, not guessed from a lookup of the host's own name
    assert [hl.argv()[hl.argv().index("--rdzv-conf") + 1] for hl in plan.hosts] == ["is_host=1", "is_host=0"]
    # a host that reported no address of its own keeps torchrun's lookup (the dns check's case)
    (_, b) = build_plan(make_job(backend="c10d"), "t-xyz", {"a": 1, "b": 1}, 29400,
                        local_addrs={"a": "198.18.0.1"}).hosts
    assert "--local-addr" not in b.argv()
    # one host: no other host dials it
    (only,) = build_plan(make_job(hosts=(A,), backend="c10d"), "t-1", {"a": 1}, 29400).hosts
    assert only.argv()[only.argv().index("--local-addr") + 1] == "127.0.0.1"
    # the static rendezvous dials master_addr only
    assert all("--local-addr" not in hl.argv() for hl in
               build_plan(make_job(), "t-1", {"a": 1, "b": 1}, 29500, local_addrs={"a": "198.18.0.1"}).hosts)


def test_node_ranks_follow_host_order() -> None:
    plan = build_plan(make_job(hosts=(C, A, B)), "t-1", {"a": 1, "b": 1, "c": 1}, 29500)
    assert [(hl.host.name, hl.node_rank) for hl in plan.hosts] == [("c", 0), ("a", 1), ("b", 2)]
    assert plan.master_addr == "198.18.0.3"  # the first selected host is the master
    assert [hl.argv()[hl.argv().index("--node-rank") + 1] for hl in plan.hosts] == ["0", "1", "2"]


def test_module_job_runs_the_module_through_the_rank_wrapper() -> None:
    (hl,) = build_plan(make_job(hosts=(A,), module="pkg.train"), "t-1", {"a": 1}, 29500).hosts
    argv = hl.argv("/logs", "/state/rankwrap.py")
    assert argv[-7:] == ["--log-dir", "/logs", "/state/rankwrap.py", "-m", "pkg.train", "--lr", "0.1"]
    assert "--module" not in argv and hl.wrapped


def test_env_secrets_are_masked_and_job_id_is_set() -> None:
    env = {"HF_TOKEN": "abc", "AWS_SECRET_ACCESS_KEY": "k", "DB_PASSWORD": "p", "api_key": "x",
           "GLOO_SOCKET_IFNAME": "eth0"}
    (hl,) = build_plan(make_job(hosts=(A,), env=env), "t-9", {"a": 1}, 29500).hosts
    assert hl.env["HF_TOKEN"] == "abc" and hl.env["DDPCTL_JOB_ID"] == "t-9"
    masked = mask_env(hl.env)
    assert {k for k, v in masked.items() if v == "***"} == {"HF_TOKEN", "AWS_SECRET_ACCESS_KEY",
                                                            "DB_PASSWORD", "api_key"}
    assert masked["GLOO_SOCKET_IFNAME"] == "eth0" and masked["DDPCTL_JOB_ID"] == "t-9"


@pytest.mark.parametrize(("text", "c10d", "expected"), [
    ("[default1]:epoch=0 loss=1.0", False, ("3", "epoch=0 loss=1.0")),
    ("[default0]:", False, ("2", "")),
    ("[default1]:x", True, ("local1", "x")),
    ("plain torchrun line", False, (None, "plain torchrun line")),
])
def test_split_rank_maps_torchrun_prefix_to_global_rank(text: str, c10d: bool,
                                                        expected: tuple[str | None, str]) -> None:
    plan = build_plan(make_job(), "t-1", {"a": 2, "b": 2}, 29500)
    assert split_rank(plan.hosts[1], text, c10d) == expected


@pytest.mark.parametrize(("lines", "expected"), [
    (["[default0]:a", "[default1]:b", "[default0]:"], "<2>a\n<3>b\n<2>\n"),  # one replace per local rank
    (["torchrun's own", "[default1]:x"], "<-> torchrun's own\n<3>x\n"),  # mixed: line by line
    (["[default1]:[default0]:nested"], "<3>[default0]:nested\n"),  # only a line's own prefix
    ([], ""),
])
def test_a_batch_renders_each_line_after_its_ranks_prefix(lines: list[str], expected: str) -> None:
    plan = build_plan(make_job(), "t-1", {"a": 2, "b": 2}, 29500)
    batch = RankLines(lines, labels_for(plan.hosts[1], c10d=False))
    assert batch.render(lambda rank: f"<{rank}>" if rank is not None else "<-> ") == expected
    assert len(batch) == len(lines)


def test_gpu_nproc_with_unequal_counts_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"unequal GPU counts \(a=2, b=4\)"):
        resolve_nprocs(make_job(nproc="gpu"), {"a": facts("a", gpus=2), "b": facts("b", gpus=4)})


def test_gpu_nproc_on_a_host_without_gpu_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="b has no GPU"):
        resolve_nprocs(make_job(nproc="gpu"), {"a": facts("a", gpus=2), "b": facts("b", gpus=0)})


def test_auto_and_cpu_nproc() -> None:
    f = {"a": facts("a", gpus=2, cpus=16), "b": facts("b", gpus=0, cpus=4)}
    assert resolve_nprocs(make_job(nproc="auto"), f) == {"a": 2, "b": 4}
    assert resolve_nprocs(make_job(nproc="cpu"), f) == {"a": 16, "b": 4}
    assert resolve_nprocs(make_job(nproc="gpu"), {"a": facts("a", gpus=2), "b": facts("b", gpus=2)}) \
        == {"a": 2, "b": 2}
    assert resolve_nprocs(make_job(nproc=3), f) == {"a": 3, "b": 3}


def test_a_per_host_program_runs_standalone_on_each_host_and_finds_the_coordinator_in_its_env() -> None:
    from orchestrator.launch.inline import InlineProgram

    program = InlineProgram(("m",), "m", ("--x",), per_host=True)
    plan = build_plan(make_job(hosts=(A, B, C)), "t-1", {"a": 1, "b": 1, "c": 1}, 29511, inline=program)
    for rank, hl in enumerate(plan.hosts):
        argv = hl.argv()
        # its workers dial their own torchrun's store on loopback: never by the host's name, which
        # may resolve nowhere (torch's default is socket.getfqdn())
        assert argv[:10] == [hl.host.python, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "1",
                             "--standalone", "--local-addr", "127.0.0.1"]
        assert "--node-rank" not in argv and "--master-addr" not in argv and "--no-python" in argv
        assert hl.env["DDPCTL_NODE_RANK"] == str(rank) and hl.env["DDPCTL_NNODES"] == "3"
        assert hl.env["DDPCTL_COORDINATOR"] == "198.18.0.1:29511"
        assert hl.modules == ("m",)
    shared = build_plan(make_job(), "t-1", {"a": 1, "b": 1}, 29511, inline=InlineProgram(("m",), "m"))
    assert "DDPCTL_NODE_RANK" not in shared.hosts[0].env and "--standalone" not in shared.hosts[0].argv()
    assert "--local-addr" not in shared.hosts[0].argv()
    assert build_plan(make_job(), "t-1", {"a": 1, "b": 1}, 29511).hosts[0].modules == ()


def test_an_inline_programs_runner_runs_its_main_module_from_the_program_dir_as_python_m_would(
        tmp_path: Path) -> None:
    """RUNNER (a constant) puts $DDPCTL_PROGRAM_DIR first on the path, ahead of the working
    directory's own copy of a package, and runs the main module as __main__ with its arguments."""
    import subprocess
    import sys

    from node_agent.wire.layout import PROGRAM_DIR_ENV
    from orchestrator.launch.inline import InlineProgram

    shipped, workdir = tmp_path / "program", tmp_path / "work"
    for root, value in ((shipped, 41), (workdir, -1)):
        (root / "pkg").mkdir(parents=True)
        (root / "pkg" / "__init__.py").write_text("")
        (root / "pkg" / "base.py").write_text(f"VALUE = {value}\n")
    (shipped / "pkg" / "main.py").write_text("import sys\nfrom pkg.base import VALUE\n"
                                             "print(__name__, VALUE + 1, sys.argv[1:])\n")
    argv = InlineProgram(("pkg", "pkg.base", "pkg.main"), "pkg.main", ("--x", "a b")).argv(sys.executable)
    out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60, cwd=workdir,
                         env={**os.environ, PROGRAM_DIR_ENV: str(shipped)})
    assert out.stdout.strip() == "__main__ 42 ['--x', 'a b']"


def test_the_supervise_request_carries_each_hosts_textfile_dir_and_the_jobs_metrics_timing() -> None:
    with_dir = replace(A, metrics_dir="/var/lib/prometheus/node-exporter")
    job = replace(make_job(hosts=(with_dir, B)), metrics=MetricsSpec(port=9400, every=2.5, keep_ended=60.0))
    plan = build_plan(job, "t-1", {"a": 2, "b": 2}, 29500)
    a, b = (supervise_request(plan, hl, LaunchOptions(), detach=False) for hl in plan.hosts)
    assert (a.metrics_dir, a.metrics_every, a.metrics_keep) == ("/var/lib/prometheus/node-exporter", 2.5, 60.0)
    assert (b.metrics_dir, b.metrics_every, b.metrics_keep) == ("", 2.5, 60.0)  # "": this host writes none
