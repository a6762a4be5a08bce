"""Doctor's `restarts` check: for a job with restarts, whether the first host's interpreter finds
ddpctl (`up --detach` runs the job's restarts from there, and refuses without it). The judgement
from recorded facts (pure), the node agent's lookup on this machine, and doctor on this machine."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from doctor_fixtures import HOSTS, context, doctor_here, observe

import orchestrator.cli
from inventory import Host
from node_agent.ops import facts, torch_facts
from orchestrator.checks import restarts
from orchestrator.checks.gather import facts_request
from orchestrator.checks.model import CheckStatus, DoctorContext, Finding
from orchestrator.checks.registry import run_checks

WARN, OK, SKIP = CheckStatus.WARN, CheckStatus.OK, CheckStatus.SKIP
FOUND = {"found": True, "origin": "/opt/venv/lib/python3.11/site-packages/orchestrator/cli.py",
         "executable": "/opt/venv/bin/python"}
MISSING = {"found": False, "origin": None, "executable": "/usr/bin/python3.11"}


def judge(*per_host: dict[str, Any] | None, max_restarts: int = 3,
          errors: dict[int, dict[str, str]] | None = None, **ctx: Any) -> list[Finding]:
    changes = {i: {"ddpctl_lookup": f} for i, f in enumerate(per_host) if f is not None}
    return restarts.check(observe(changes, errors, max_restarts=max_restarts, **ctx))


# -- the judgement (pure) ------------------------------------------------------------------------

def test_without_restarts_the_check_only_says_it_skipped() -> None:
    findings = judge(MISSING, max_restarts=0)
    assert [(f.status, f.host) for f in findings] == [(SKIP, None)]
    assert "max_restarts" in findings[0].message


def test_ddpctl_found_on_the_first_host_is_ok_and_names_interpreter_and_host() -> None:
    findings = judge(FOUND, MISSING, MISSING)  # the other hosts need no ddpctl
    (found,) = findings
    assert (found.status, found.host, found.check) == (OK, "node0", "restarts")
    assert found.message == ("ddpctl is importable by python3 on node0: `up --detach` can run the job's "
                             "restarts from there")
    assert FOUND["origin"] in found.evidence


def test_ddpctl_missing_on_the_first_host_is_a_warning_with_the_fix() -> None:
    findings = judge(MISSING, FOUND, FOUND, hosts=tuple(Host(h.name, h.address, python="/usr/bin/python3.11")
                                                        for h in HOSTS))
    (missing,) = findings
    assert (missing.status, missing.host) == (WARN, "node0")  # not a failure: an attached `up` restarts
    assert missing.message == ("ddpctl is not importable by /usr/bin/python3.11 on node0: `up --detach` with "
                               "restarts would refuse")
    assert missing.fix == "install ddpctl into that interpreter on node0, or run `up` attached (tmux/screen)"
    assert "does not find orchestrator.cli" in missing.evidence


def test_a_parent_package_that_fails_to_import_is_missing_with_its_error() -> None:
    (missing,) = judge({**MISSING, "error": "ImportError: cannot import name 'x'"})
    assert missing.status == WARN and "cannot import name 'x'" in missing.evidence


def test_a_lookup_that_failed_is_a_warning_with_its_error() -> None:
    (unknown,) = judge(None, errors={0: {"ddpctl_lookup": "RuntimeError: python3 exited 1: boom"}})
    assert (unknown.status, unknown.host) == (WARN, "node0")
    assert "could not tell whether ddpctl is importable by python3 on node0" in unknown.message
    assert "boom" in unknown.evidence


def test_an_unreachable_first_host_leaves_it_to_the_ssh_check() -> None:
    obs = observe({1: {"ddpctl_lookup": FOUND}}, max_restarts=1)
    obs.facts.pop("node0")
    assert restarts.check(obs) == []


def test_the_check_runs_with_the_others_and_a_clean_cluster_stays_clean() -> None:
    findings = run_checks(observe({0: {"ddpctl_lookup": FOUND}}, max_restarts=2))
    assert [f for f in findings if f.status.rank >= WARN.rank] == []
    assert [(f.check, f.status, f.host) for f in findings if f.check == "restarts"] == [("restarts", OK, "node0")]


def test_only_the_first_host_is_asked_and_only_for_a_job_with_restarts() -> None:
    with_restarts = context(max_restarts=1)
    assert facts_request(with_restarts, HOSTS[0], probe=True)["ddpctl_lookup"] is True
    assert "ddpctl_lookup" not in facts_request(with_restarts, HOSTS[1], probe=True)
    assert "ddpctl_lookup" not in facts_request(context(), HOSTS[0], probe=True)
    # the launch's selection does not ask for it
    assert "ddpctl_lookup" not in facts_request(with_restarts, HOSTS[0], probe=False, select=["python"])


# -- the node agent's fact, on this machine ------------------------------------------------------

def isolated_python(tmp_path: Path) -> Path:
    """This interpreter with no site-packages, no PYTHON* variables and no cwd on sys.path: it
    finds no ddpctl (however this one has it: installed, editable, or from the cwd)."""
    path = tmp_path / "isolated-python"
    path.write_text(f'#!/bin/sh\nexec {sys.executable} -I -S "$@"\n')
    path.chmod(0o755)
    return path


def test_the_interpreter_that_runs_ddpctl_finds_it() -> None:
    found = torch_facts.fact_ddpctl_lookup({"python": sys.executable})
    assert found["found"] is True and "error" not in found
    assert Path(found["origin"]).resolve() == Path(orchestrator.cli.__file__).resolve()
    assert Path(found["executable"]).resolve() == Path(sys.executable).resolve()


def test_an_interpreter_without_ddpctl_says_so(tmp_path: Path) -> None:
    found = torch_facts.fact_ddpctl_lookup({"python": str(isolated_python(tmp_path))})
    assert found == {"found": False, "origin": None, "executable": found["executable"]}
    assert Path(found["executable"]).resolve() == Path(sys.executable).resolve()


def test_a_missing_interpreter_is_an_error() -> None:
    with pytest.raises(FileNotFoundError, match="interpreter /nonexistent/python9 not found"):
        torch_facts.fact_ddpctl_lookup({"python": "/nonexistent/python9"})


def test_a_missing_parent_is_not_found_and_a_broken_one_says_why(tmp_path: Path) -> None:
    lib = tmp_path / "lib"
    for name, init in {"ddpctl_test_broken": "raise ImportError('broken on purpose')\n",
                       "ddpctl_test_needs": "import ddpctl_test_no_such_dependency\n"}.items():
        (lib / name).mkdir(parents=True)
        (lib / name / "__init__.py").write_text(init)
    env = {"PYTHONPATH": str(lib)}
    assert torch_facts.lookup_module(sys.executable, "ddpctl_test_absent.cli", env) == {
        "found": False, "origin": None, "executable": sys.executable}
    broken = torch_facts.lookup_module(sys.executable, "ddpctl_test_broken.cli", env)
    assert broken["found"] is False and broken["error"] == "ImportError: broken on purpose"
    needs = torch_facts.lookup_module(sys.executable, "ddpctl_test_needs.cli", env)
    assert needs["found"] is False
    assert needs["error"] == "ModuleNotFoundError: No module named 'ddpctl_test_no_such_dependency'"


def test_the_module_name_is_data_never_code() -> None:
    found = torch_facts.lookup_module(sys.executable, "os\"); raise SystemExit(9) #")
    assert found["found"] is False


def test_the_facts_op_runs_the_lookup_only_when_asked() -> None:
    assert "ddpctl_lookup" in facts.sub_facts({"ddpctl_lookup": True})[0]
    assert "ddpctl_lookup" not in facts.sub_facts({})[0]
    assert facts.sub_facts({"select": ["ddpctl_lookup"]})[0] == {}


# -- doctor on this machine ----------------------------------------------------------------------

def local_ctx(tmp_path: Path, python: str, max_restarts: int) -> DoctorContext:
    host = Host(name="a", address="127.0.0.1", python=python, workdir=str(tmp_path))
    return DoctorContext(hosts=(host,), master=host, master_addr="127.0.0.1", master_port=None,
                         workdirs={"a": str(tmp_path)}, timeout_s=60, max_restarts=max_restarts)


def doctor(ctx: DoctorContext) -> tuple[list[str], list[Finding]]:
    report = doctor_here(ctx)
    return report.checks, [f for f in report.findings if f.check == "restarts"]


def test_doctor_warns_when_the_first_hosts_interpreter_has_no_ddpctl(tmp_path: Path) -> None:
    python = str(isolated_python(tmp_path))
    checks, found = doctor(local_ctx(tmp_path, python, 1))
    assert "restarts" in checks
    assert [(f.status, f.host) for f in found] == [(WARN, "a")], found
    assert f"ddpctl is not importable by {python} on a" in found[0].message


def test_a_job_without_restarts_has_no_restarts_column(tmp_path: Path) -> None:
    checks, found = doctor(local_ctx(tmp_path, "/nonexistent/python9", 0))
    assert "restarts" not in checks and "workdir" in checks
    assert [(f.status, f.host) for f in found] == [(SKIP, None)]
