"""The programs doctor runs on the hosts (smoke, bandwidth, the deep host check) travel with the node
agent: cached on a host under the agent's key, named in the supervise request, written out by the
node's supervisor, and run through a constant loader, so every process's command line is short and
carries no source; from a host's cache, and from the sources a call brought where the cache cannot
be written."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from inventory import LOCALHOST, Host, Inventory, Job, Rendezvous
from node_agent.runtime.programs import write_program
from node_agent.wire.layout import PROGRAM_DIR
from node_agent.wire.protocol import parse_line
from node_agent.wire.replies import wire
from orchestrator.doctor import deep
from orchestrator.doctor.collective_jobs import bandwidth_program, smoke_program
from orchestrator.launch.backends.base import supervise_request
from orchestrator.launch.inline import InlineProgram, shipped_program
from orchestrator.launch.options import LaunchOptions
from orchestrator.launch.plan import build_plan
from orchestrator.remote import agent, programs
from orchestrator.remote.agent import (
    BOOTSTRAP,
    AgentResult,
    AgentStream,
    agent_code,
    agent_payload,
    call_agent,
    start_agent,
)
from orchestrator.remote.programs import SHIPPED, TRAIN_JOBS, module_of, modules_of
from orchestrator.remote.transport import LocalTransport, OutputLine
from tests.unit.test_agent_shipping import CANNOT_WRITE, _call, python_with_cache_on

SMOKE = shipped_program(("smoke.py",), per_host=True)
MAX_ARGV = 512  # bytes: a command line that `ps` shows whole, whatever the program's size


def doctor_programs() -> dict[str, InlineProgram]:
    return {"smoke": smoke_program(), "bandwidth": bandwidth_program("64M"),
            "deep": deep.program(deep.LINKS_BUDGET_S, deep.EXCHANGE_BYTES)}


def job_here(host: Host) -> Job:
    return Job(name="shipped", inventory=Inventory((host,)), hosts=(host,), script="-",
               rendezvous=Rendezvous(None, 29500, "static"))


@pytest.mark.parametrize("name", ["smoke", "bandwidth", "deep"])
def test_each_doctor_program_has_a_short_command_line_that_carries_no_module_source(name: str) -> None:
    program = doctor_programs()[name]
    argv = program.argv("/usr/bin/python3")
    assert sum(len(a.encode()) + 1 for a in argv) < MAX_ARGV, argv
    assert not any("\n" in a for a in argv)
    plan = build_plan(job_here(LOCALHOST), "t-1", {LOCALHOST.name: 1}, 29500, inline=program)
    (launch,) = plan.hosts
    shown = launch.display("~/.ddpctl/runs/t-1/node0/torchrun")  # the dry run's line, torchrun's own argv
    assert len(shown.encode()) < MAX_ARGV + 300, shown
    for module in program.modules:  # named, each shipped with the agent, never carried
        assert module in {module_of(rel) for rel in SHIPPED}
    sources = [line for rel in SHIPPED for line in (TRAIN_JOBS / rel).read_text().splitlines() if len(line) > 40]
    assert not [line for line in sources if line.strip() in shown]
    request = supervise_request(plan, launch, LaunchOptions(), detach=False)
    assert request.modules == program.modules and request.program == launch.program


def test_a_program_names_the_packages_above_its_files_and_no_file_that_is_not_shipped() -> None:
    assert modules_of("hostcheck/verdict.py", "hostcheck/check.py") == (
        "train_jobs", "train_jobs.hostcheck", "train_jobs.hostcheck.verdict", "train_jobs.hostcheck.check")
    assert shipped_program(("smoke.py",)).main == "train_jobs.smoke"
    with pytest.raises(ValueError, match=r"train_jobs/resumable\.py is not shipped with the agent"):
        modules_of("resumable.py")


def test_the_supervisor_writes_a_programs_modules_as_files_only_its_user_reads(tmp_path: Path) -> None:
    folder = tmp_path / "program"
    write_program(folder, deep.program(1.0, 1).modules)
    written = sorted(str(p.relative_to(folder)) for p in folder.rglob("*.py"))
    assert written == ["train_jobs/__init__.py", "train_jobs/hostcheck/__init__.py", "train_jobs/hostcheck/check.py",
                       "train_jobs/hostcheck/coordinate.py", "train_jobs/hostcheck/figures.py",
                       "train_jobs/hostcheck/schedule.py", "train_jobs/hostcheck/verdict.py"]
    assert (folder / "train_jobs/hostcheck/check.py").read_text() == (TRAIN_JOBS / "hostcheck/check.py").read_text()
    assert {stat.S_IMODE(p.stat().st_mode) for p in folder.rglob("*") if p.is_dir()} | {
        stat.S_IMODE(folder.stat().st_mode)} == {0o700}
    assert {stat.S_IMODE(p.stat().st_mode) for p in folder.rglob("*.py")} == {0o600}


def supervise_smoke(host: Host, job_id: str) -> tuple[AgentStream, int | None, list[str]]:
    """The smoke program under a real torchrun (standalone, one rank), supervised by the agent on
    `host` (this machine): the stream, its exit code and the output lines."""
    plan = build_plan(job_here(host), job_id, {host.name: 1}, 29500, inline=SMOKE)
    request = replace(supervise_request(plan, plan.hosts[0], LaunchOptions(), detach=False), heartbeat_timeout=0)
    stream = start_agent(LocalTransport(host), "supervise", wire(request))
    messages = list(stream.messages())
    assert any(isinstance(m, AgentResult) for m in messages)
    return stream, stream.wait(120), [m.text for m in messages if isinstance(m, OutputLine)]


def ran_from_its_program_dir(state: Path, job_id: str, code: int | None, lines: list[str]) -> None:
    assert code == 0, lines[-20:]
    assert any("DDPCTL-SMOKE rank=0 world=1 ok=True" in line for line in lines), lines[-20:]
    folder = state / "runs" / job_id / "node0" / PROGRAM_DIR
    assert sorted(str(p.relative_to(folder)) for p in folder.rglob("*.py")) == [
        "train_jobs/__init__.py", "train_jobs/smoke.py"]


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DDPCTL_STATE_ROOT", str(tmp_path / "state"))  # LocalTransport passes os.environ on
    monkeypatch.delenv("PYTHONDONTWRITEBYTECODE", raising=False)
    return tmp_path / "state"


def test_a_program_runs_from_the_hosts_agent_cache_on_a_call_that_sends_only_the_key(
        state: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    host = replace(LOCALHOST, python=sys.executable)
    assert _call(LocalTransport(host))[1].shipped  # the first call leaves the agent, programs included, cached
    stream, code, lines = supervise_smoke(host, "shipped-cached-1")
    assert not stream.shipped and stream.cache == "cached"
    ran_from_its_program_dir(state, "shipped-cached-1", code, lines)


@pytest.mark.skipif(shutil.which("unshare") is None or os.getuid() != 0, reason="needs root and unshare")
def test_a_program_runs_from_the_sources_the_call_brought_where_the_cache_cannot_be_written(
        state: Path, tmp_path: Path) -> None:
    _disk, mount, why = CANNOT_WRITE[0]  # a read-only filesystem over the cache, in the host's own mount namespace
    cache = tmp_path / "cache"
    python = python_with_cache_on(tmp_path, cache, mount)
    stream, code, lines = supervise_smoke(replace(LOCALHOST, python=str(python)), "shipped-ro-1")
    assert stream.shipped and (stream.cache, stream.stored) == ("absent", why)
    ran_from_its_program_dir(state, "shipped-ro-1", code, lines)
    assert list(cache.iterdir()) == []


def test_a_slurm_batch_node_runs_a_program_from_the_agent_whole_in_its_node_in(state: Path, tmp_path: Path) -> None:
    """A batch node reads the agent's payload from a file (no one to ask for what it lacks): the
    program's modules are in it, and its supervisor writes them out as on any host."""


    plan = build_plan(job_here(LOCALHOST), "shipped-batch-1", {LOCALHOST.name: 1}, 29500, inline=SMOKE)
    request = replace(supervise_request(plan, plan.hosts[0], LaunchOptions(), detach=False), batch=True,
                      node_rank_env="SLURM_PROCID", heartbeat_timeout=0)
    (tmp_path / "agent.py").write_text(BOOTSTRAP)
    (tmp_path / "node.in").write_bytes(agent_payload() + json.dumps({"op": "supervise", **wire(request)}).encode()
                                       + b"\n")
    with (tmp_path / "node.in").open("rb") as stdin:
        out = subprocess.run([sys.executable, str(tmp_path / "agent.py")], stdin=stdin, capture_output=True,
                             text=True, timeout=120, env={**os.environ, "SLURM_PROCID": "0"})
    lines = [line for line in out.stdout.splitlines() if parse_line(line) is None]
    ran_from_its_program_dir(state, "shipped-batch-1", out.returncode, lines)


def test_a_detached_start_runs_a_program_after_its_call_has_ended(state: Path) -> None:
    """The daemon the call leaves behind writes the program out from the agent it was started with."""


    plan = build_plan(job_here(LOCALHOST), "shipped-detached-1", {LOCALHOST.name: 1}, 29500, inline=SMOKE)
    request = supervise_request(plan, plan.hosts[0], LaunchOptions(), detach=True)
    assert call_agent(LocalTransport(LOCALHOST), "supervise", wire(request)).result["exit_code"] == 0
    node = state / "runs" / "shipped-detached-1" / "node0"
    deadline = time.monotonic() + 120
    while json.loads((node / "state.json").read_text()).get("status") != "exited":
        assert time.monotonic() < deadline, (node / "output.log").read_text()[-2000:]
        time.sleep(0.2)
    code = json.loads((node / "state.json").read_text())["exit_code"]
    ran_from_its_program_dir(state, "shipped-detached-1", code, (node / "output.log").read_text().splitlines())


def test_the_agent_key_names_the_programs_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """A changed program is a new agent: a host that cached the old one is sent the new one."""

    def changed() -> dict[str, tuple[bool, str]]:
        sources = programs.shipped_sources()
        sources["train_jobs.smoke"] = (False, sources["train_jobs.smoke"][1] + "# changed\n")
        return sources

    monkeypatch.setattr(agent, "shipped_sources", changed)
    assert agent.agent_code.__wrapped__()[0] != agent_code()[0]
