"""A launch finds a host interpreter without torch before any rank starts (issue 27): the node agent
looks torch up without importing it, and doctor's python check judges it, for doctor and the launch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from inventory import LOCALHOST, Host, Inventory, Job
from node_agent.ops import facts as agent_facts
from node_agent.ops import torch_facts
from orchestrator.checks import catalog
from orchestrator.checks.context import from_job
from orchestrator.checks.gather import facts_request
from orchestrator.checks.model import CheckStatus, Observations, ProbeResults
from orchestrator.checks.node import python_findings
from orchestrator.checks.registry import run_checks
from orchestrator.checks.spec import Runs
from orchestrator.launch.preflight import CHECK_FACTS, ChecksFailed, launch_facts
from orchestrator.remote.agent import call_agent
from orchestrator.remote.transport import LocalTransport
from orchestrator.remote.wire import HostFacts, parse_facts

NO_TORCH = "/usr/bin/python3"


def no_site_python(tmp_path: Path) -> Path:
    """An interpreter that finds no site-packages (so no torch): this one, started with -S -s -E."""
    path = tmp_path / "bare-python"
    path.write_text(f'#!/bin/sh\nexec {sys.executable} -S -s -E "$@"\n')
    path.chmod(0o755)
    return path


# --- the node agent's lookup -----------------------------------------------------------------------


def test_the_agents_own_interpreter_finds_torch_in_process_without_importing_it() -> None:
    root = str(Path(__file__).resolve().parents[2])
    code = (f"import sys, json; sys.path.insert(0, {root!r})\n"
            "import subprocess\n"
            "def no_child(*a, **k): raise AssertionError('a child was started')\n"
            "subprocess.run = no_child\n"
            "from node_agent.ops.torch_facts import fact_torch_lookup\n"
            "found = fact_torch_lookup({'python': sys.executable})\n"
            "print(json.dumps([found, 'torch' in sys.modules]))")
    out = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, check=True)
    found, imported = json.loads(out.stdout)
    assert found["found"] is True and found["origin"].endswith("torch/__init__.py")
    assert imported is False  # looked up, not imported: it costs seconds


def test_an_interpreter_without_torch_is_asked_itself_and_says_so(tmp_path: Path) -> None:
    found = torch_facts.fact_torch_lookup({"python": str(no_site_python(tmp_path))})
    assert found["found"] is False and found["origin"] is None


def test_the_jobs_pythonpath_is_where_the_interpreter_looks(tmp_path: Path) -> None:
    (tmp_path / "lib" / "torch").mkdir(parents=True)
    (tmp_path / "lib" / "torch" / "__init__.py").write_text("raise SystemExit('imported!')\n")
    found = torch_facts.fact_torch_lookup({"python": str(no_site_python(tmp_path)),
                                           "import_env": {"PYTHONPATH": str(tmp_path / "lib")}})
    assert found["found"] is False  # -E: the bare interpreter ignores PYTHONPATH, as ours must not
    found = torch_facts.fact_torch_lookup({"python": sys.executable,
                                           "import_env": {"PYTHONPATH": str(tmp_path / "lib")}})
    assert found["found"] is True and found["origin"] == str(tmp_path / "lib" / "torch" / "__init__.py")


def test_a_missing_or_crashing_interpreter_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="interpreter /nonexistent/python9 not found"):
        torch_facts.fact_torch_lookup({"python": "/nonexistent/python9"})
    broken = tmp_path / "broken-python"
    broken.write_text("#!/bin/sh\necho 'boom: no stdlib' >&2\nexit 3\n")
    broken.chmod(0o755)
    with pytest.raises(RuntimeError, match="exited 3: boom: no stdlib"):
        torch_facts.fact_torch_lookup({"python": str(broken)})


def test_doctor_imports_torch_where_the_launch_only_looks_it_up() -> None:
    everything, _ = agent_facts.sub_facts({})
    assert "torch" in everything and "torch_lookup" not in everything
    selected, _ = agent_facts.sub_facts({"select": ["python", "torch_lookup"]})
    assert list(selected) == ["python", "torch_lookup"]


def test_the_real_agent_answers_the_launchs_lookup(tmp_path: Path) -> None:
    reply = call_agent(LocalTransport(LOCALHOST), "facts", {"python": sys.executable, "workdir": str(tmp_path),
                                                           "select": ["python", "torch_lookup"]}, timeout=60)
    assert reply.result["facts"]["torch_lookup"]["found"] is True
    assert "torch" not in reply.result["facts"]


def test_the_request_carries_the_jobs_python_variables() -> None:
    host = Host("n0", "198.18.9.1", env={"PYTHONPATH": "/host", "OTHER": "x"})
    job = Job(name="t", inventory=Inventory((host,)), hosts=(host,), script="train.py",
              env={"PYTHONNOUSERSITE": "1"})
    assert facts_request(from_job(job), host, probe=False)["import_env"] == {"PYTHONPATH": "/host",
                                                                             "PYTHONNOUSERSITE": "1"}


# --- one judgement: doctor's python check ----------------------------------------------------------

HOSTS = (Host("n0", "198.18.9.1", python="/opt/venv/bin/python"), Host("n1", "198.18.9.2", python="python3"))
JOB = Job(name="t", inventory=Inventory(HOSTS), hosts=HOSTS, script="train.py", nproc_per_node=1)


def host(name: str, python: str, **facts: Any) -> HostFacts:
    errors = facts.pop("errors", {})
    return parse_facts(name, {"facts": {"python": {"requested": python, "found": python}, "cpu_count": 4, **facts},
                              "errors": errors})


@pytest.mark.parametrize(("facts", "status", "message"), [
    ({"torch_lookup": {"found": True, "origin": "/v/torch/__init__.py"}}, CheckStatus.OK,
     "torch found by /opt/venv/bin/python"),
    ({"torch_lookup": {"found": False, "origin": None}}, CheckStatus.FAIL,
     "torch is not importable by /opt/venv/bin/python"),
    ({"errors": {"torch_lookup": "TimeoutExpired: 30s"}}, CheckStatus.FAIL,
     "running /opt/venv/bin/python to look torch up failed"),
    ({"torch": {"importable": False, "error": "ModuleNotFoundError: No module named 'torch'"}}, CheckStatus.FAIL,
     "torch is not importable by /opt/venv/bin/python"),
])
def test_looked_up_or_imported_torch_is_judged_the_same(facts: dict[str, Any], status: CheckStatus,
                                                        message: str) -> None:
    (finding,) = python_findings("n0", host("n0", "/opt/venv/bin/python", **facts), from_job(JOB))
    assert (finding.status, finding.message) == (status, message)
    if "not importable" in message:
        assert finding.fix.startswith("on n0: /opt/venv/bin/python -m pip install torch")
        assert 'set python = "/absolute/path/to/python" for n0 in the inventory' in finding.fix


def test_the_launch_checks_refuse_the_host_without_torch_and_name_it() -> None:
    assert "python" in catalog.names(Runs.LAUNCH) and "torch_lookup" in CHECK_FACTS
    assert "torch_lookup" in launch_facts(JOB, checks=True) and "torch_lookup" not in launch_facts(JOB, checks=False)
    obs = Observations(from_job(JOB), {
        "n0": host("n0", "/opt/venv/bin/python", torch_lookup={"found": True, "origin": "/v/torch/__init__.py"}),
        "n1": host("n1", NO_TORCH, torch_lookup={"found": False, "origin": None})}, {}, ProbeResults())
    findings = [f for f in run_checks(obs, Runs.LAUNCH) if f.check == "python"]
    assert [(f.host, f.status) for f in findings] == [("n0", CheckStatus.OK), ("n1", CheckStatus.FAIL)]
    assert f"[python] n1: torch is not importable by {NO_TORCH}" in str(ChecksFailed(findings))


@pytest.mark.skipif(not os.path.exists(NO_TORCH), reason=f"no {NO_TORCH}")
def test_the_system_python_here_has_no_torch_as_the_cluster_test_assumes() -> None:
    found = torch_facts.fact_torch_lookup({"python": NO_TORCH})
    assert found["found"] is False
