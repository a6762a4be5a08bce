"""doctor's gpu check on hosts that select GPUs, driven by recorded nvidia-smi output (parsed by the
node agent's own pure parsers): a selected index the host lacks, a selected GPU another user or
job already uses, and the launch's narrower facts."""

from __future__ import annotations

from typing import Any

import pytest
from doctor_fixtures import HOSTS, context, host_facts, observe

from inventory import Host
from node_agent.host import factparse
from orchestrator.checks import agreement, node
from orchestrator.checks.model import CheckStatus, Finding, Observations, ProbeResults
from orchestrator.checks.registry import run_checks
from orchestrator.checks.spec import Runs

FAIL, WARN, OK = CheckStatus.FAIL, CheckStatus.WARN, CheckStatus.OK

# `nvidia-smi --query-gpu=index,uuid,name,memory.total,memory.used --format=csv,noheader,nounits`
# on a 4-GPU host, and --query-compute-apps=gpu_uuid,pid,process_name,used_memory on it.
QUERY_GPU_4 = """\
0, GPU-5a1c6e8f-0b2d-4c3e-9f41-2d7a8b6c9e01, NVIDIA A100-SXM4-80GB, 81920, 4
1, GPU-7e2f4a10-3c5b-4d6e-8a92-1b3c5d7e9f02, NVIDIA A100-SXM4-80GB, 81920, 30521
2, GPU-0d1e2f3a-4b5c-6d7e-8f90-a1b2c3d4e5f6, NVIDIA A100-SXM4-80GB, 81920, 4
3, GPU-9c8b7a65-4321-4fed-cba9-876543210fed, NVIDIA A100-SXM4-80GB, 81920, 12005
"""
QUERY_APPS = """\
GPU-7e2f4a10-3c5b-4d6e-8a92-1b3c5d7e9f02, 48213, /home/alice/.venv/bin/python, 30512
GPU-9c8b7a65-4321-4fed-cba9-876543210fed, 51022, /usr/bin/python3, 11996
"""
QUERY_GPU_2 = """\
0, GPU-11111111-2222-3333-4444-555555555555, NVIDIA GeForce RTX 4090, 24564, 1
1, GPU-66666666-7777-8888-9999-000000000000, NVIDIA GeForce RTX 4090, 24564, 1
"""
# What the node agent adds to each app from /proc (pid -> user, DDPCTL_JOB_ID).
OWNERS = {48213: {"user": "alice", "ddpctl_job_id": None},
          51022: {"user": "ddp", "ddpctl_job_id": "bert-20260101-120000-ab12"}}


def smi(query_gpu: str, query_apps: str = "", user: str = "ddp") -> dict[str, Any]:
    apps = [{**a, **OWNERS.get(a["pid"], {"user": None, "ddpctl_job_id": None})}
            for a in factparse.parse_nvidia_apps(query_apps)]
    return {"gpus": factparse.parse_nvidia_gpus(query_gpu), "apps": apps, "user": user}


def selecting(gpus: dict[int, tuple[int, ...]]) -> tuple[Host, ...]:
    """The fixture cluster, host i selecting gpus[i]."""
    return tuple(Host(name=h.name, address=h.address, gpus=gpus.get(i, "auto")) for i, h in enumerate(HOSTS))


def on(findings: list[Finding], host: str, status: CheckStatus) -> list[Finding]:
    return [f for f in findings if f.host == host and f.status == status]


def test_a_selection_of_free_gpus_that_exist_is_ok_and_names_cuda_visible_devices() -> None:
    obs = observe({1: {"gpus": smi(QUERY_GPU_4, QUERY_APPS)}}, hosts=selecting({1: (0, 2)}))
    findings = node.check_gpu(obs)
    assert [f.status for f in findings if f.host == "node1"] == [OK]
    (good,) = on(findings, "node1", OK)
    assert "gpus = [0, 2] of 4 GPU(s): CUDA_VISIBLE_DEVICES=0,2" in good.message
    assert "A100" in good.evidence


@pytest.mark.parametrize(("selected", "query", "message", "fix"), [
    ((0, 4), QUERY_GPU_4, "gpus = [0, 4] selects GPU 4, which node1 does not have (it has 4 GPU(s))",
     "set gpus = [0, 1] for node1 in the inventory"),
    ((2, 3), QUERY_GPU_2, "selects GPUs 2, 3, which node1 does not have (it has 2 GPU(s))",
     "set gpus = [0, 1] for node1"),
    ((1,), "", "gpus = [1] selects GPU 1, but node1 has no NVIDIA GPU", "remove gpus from node1's entry"),
], ids=["one-missing", "two-missing", "no-gpu"])
def test_a_selected_index_the_host_lacks_is_an_error_naming_host_and_fix(
        selected: tuple[int, ...], query: str, message: str, fix: str) -> None:
    obs = observe({1: {"gpus": smi(query)}}, hosts=selecting({1: selected}))
    findings = node.check_gpu(obs)
    (bad,) = on(findings, "node1", FAIL)
    assert message in bad.message and fix in bad.fix
    assert on(findings, "node0", FAIL) == [] and on(findings, "node2", FAIL) == []


TORCH_0 = {"importable": True, "version": "2.13.0", "cuda_available": False, "device_count": 0}


@pytest.mark.parametrize(("facts", "selected", "status", "text"), [
    ({"gpus": None, "torch": TORCH_0}, (0,), FAIL, "gpus = [0] selects GPU 0, but node2 has no NVIDIA GPU"),
    ({"gpus": None}, (1,), OK, "nvidia-smi is not installed; torch sees 2 GPU(s)"),  # doctor: torch counts
    ({"gpus": None, "gpu_count": 4}, (5,), FAIL, "which node2 does not have (it has 4 GPU(s))"),  # launch
], ids=["no-gpu-at-all", "torch-sees-them", "driver-count"])
def test_without_nvidia_smi_the_selection_is_judged_by_the_gpus_another_fact_counts(
        facts: dict[str, Any], selected: tuple[int, ...], status: CheckStatus, text: str) -> None:
    findings = node.check_gpu(observe({2: facts}, hosts=selecting({2: selected}), nproc_per_node=1))
    (found,) = [f for f in findings if f.host == "node2"]
    assert found.status == status and (text in found.message or text in found.evidence)
    assert "nvidia-smi is not installed" in found.evidence


@pytest.mark.parametrize(("selected", "who", "fix"), [
    ((1, 2), "GPU 1: pid 48213 /home/alice/.venv/bin/python (30512 MiB), user alice",
     "select free GPUs: gpus = [0, 2] for node1"),
    ((0, 3), "GPU 3: pid 51022 /usr/bin/python3 (11996 MiB), ddpctl job bert-20260101-120000-ab12",
     "ddpctl down bert-20260101-120000-ab12; or select free GPUs: gpus = [0, 2]"),
], ids=["another-user", "another-ddpctl-job"])
def test_a_selected_gpu_in_use_is_a_warning_naming_the_process_and_its_owner(
        selected: tuple[int, ...], who: str, fix: str) -> None:
    obs = observe({1: {"gpus": smi(QUERY_GPU_4, QUERY_APPS)}}, hosts=selecting({1: selected}))
    findings = node.check_gpu(obs)
    (busy,) = on(findings, "node1", WARN)
    assert busy.message == "1 process(es) already use the GPUs selected on node1"
    assert busy.evidence == who
    assert fix in busy.fix
    assert on(findings, "node1", FAIL) == []


def test_busy_gpus_outside_the_selection_are_not_reported_but_are_without_one() -> None:
    facts = {1: {"gpus": smi(QUERY_GPU_4, QUERY_APPS)}}
    assert on(node.check_gpu(observe(facts, hosts=selecting({1: (0, 2)}))), "node1", WARN) == []
    (busy,) = on(node.check_gpu(observe(facts)), "node1", WARN)
    assert "2 process(es) already use GPUs on node1" in busy.message
    assert "user alice" in busy.evidence and "gpus = [...] for node1" in busy.fix


def test_an_owner_the_host_cannot_see_is_said_so() -> None:
    query = "GPU-11111111-2222-3333-4444-555555555555, 777, python, 500\n"
    findings = node.check_gpu(observe({0: {"gpus": smi(QUERY_GPU_2, query)}}, hosts=selecting({0: (0,)})))
    (busy,) = on(findings, "node0", WARN)
    assert busy.evidence == "GPU 0: pid 777 python (500 MiB), owner not visible on the host"
    assert "select free GPUs: gpus = [1]" in busy.fix


def test_a_job_env_against_the_selection_is_an_error_in_doctor_too() -> None:
    obs = observe({1: {"gpus": smi(QUERY_GPU_4)}}, hosts=selecting({1: (0, 2)}),
                  env={"CUDA_VISIBLE_DEVICES": "3"})
    (bad,) = on(node.check_gpu(obs), "node1", FAIL)
    assert 'CUDA_VISIBLE_DEVICES = "3" in the job env contradicts gpus = [0, 2] of node1' in bad.message


def test_nproc_and_gpu_agreement_count_the_selection_not_the_hosts_gpus() -> None:
    four, two = smi(QUERY_GPU_4), smi(QUERY_GPU_2)
    hosts = selecting({0: (1, 3), 2: (0, 2)})  # node1 has 2 of its own (auto): all hosts run 2 ranks
    obs = observe({0: {"gpus": four}, 1: {"gpus": two}, 2: {"gpus": four}}, hosts=hosts)
    assert [f for f in agreement.check_versions(obs) if f.status == FAIL] == []
    assert [f.message for f in node.check_nproc(obs) if f.host == "node0"] == [
        '2 rank(s) (nproc_per_node = gpu) on 16 CPU(s), 2 GPU(s) (gpus = [1, 3])']
    unequal = observe({0: {"gpus": four}, 1: {"gpus": two}, 2: {"gpus": four}}, hosts=selecting({0: (1,), 2: (0, 2)}))
    assert [f.host for f in agreement.check_versions(unequal) if f.status == FAIL] == ["node0"]
    too_many = node.check_nproc(observe({0: {"gpus": four}}, hosts=selecting({0: (0, 2)}), nproc_per_node=4))
    assert [(f.status, f.message.split(":")[0]) for f in too_many if f.host == "node0"] == [
        (WARN, "nproc_per_node = 4 is more than the 2 GPU(s) of node0")]


def launch_facts(query_gpu: str | None) -> dict[str, Any]:
    """What the launch gathers for the gpu check: no torch; nvidia-smi only with a selection."""
    facts: dict[str, Any] = {"hostname": "n", "cpu_count": 16, "gpu_count": 4}
    if query_gpu is not None:
        facts["gpus"] = smi(query_gpu, QUERY_APPS)
    return facts


def test_the_launch_checks_stop_on_a_missing_index_and_stay_quiet_without_nvidia_smi_facts() -> None:
    facts = {h.name: host_facts(h.name, launch_facts(QUERY_GPU_4 if i == 0 else None))
             for i, h in enumerate(HOSTS)}
    obs = Observations(context(hosts=selecting({0: (0, 7)}), nproc_per_node=1), facts, {}, ProbeResults())
    gpu = [f for f in run_checks(obs, Runs.LAUNCH) if f.check == "gpu"]
    assert [(f.host, f.status) for f in gpu] == [("node0", FAIL)]
    assert "selects GPU 7" in gpu[0].message
