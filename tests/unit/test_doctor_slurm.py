"""doctor for Slurm jobs without a cluster: the controller checks over recorded scontrol output
(tables of fits / does not fit), the node-check job's script and time, the probe's outcomes, the
slurm_check op between two local processes, and the allocation's life cycle on a scripted Slurm
behind the transport seam (it always scancels what it does not see end)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from inventory import LOCALHOST, load_job
from inventory.specs import SlurmSpec
from node_agent.wire.protocol import RESULT_PREFIX
from orchestrator.checks import slurm_controller as dc
from orchestrator.checks import slurm_nodes as ds
from orchestrator.checks.model import CheckStatus, Finding
from orchestrator.doctor import slurm_doctor
from orchestrator.remote.slurm_client import SlurmClient, node_script, parse_config
from orchestrator.remote.transport import CommandResult

ROOT = Path(__file__).resolve().parents[2]

# Recorded from the test cluster's slurmctld (Slurm 22.05): `scontrol -a -o show partition`.
PARTITIONS = (
    "PartitionName=debug AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL AllocNodes=ALL Default=YES QoS=N/A "
    "DefaultTime=NONE DisableRootJobs=NO ExclusiveUser=NO GraceTime=0 Hidden=NO MaxNodes=UNLIMITED "
    "MaxTime=UNLIMITED MinNodes=0 LLN=NO MaxCPUsPerNode=UNLIMITED Nodes=c[1-2] PriorityJobFactor=1 "
    "PriorityTier=1 RootOnly=NO ReqResv=NO OverSubscribe=NO OverTimeLimit=NONE PreemptMode=OFF State=UP "
    "TotalCPUs=4 TotalNodes=2 SelectTypeParameters=NONE JobDefaults=(null) DefMemPerNode=UNLIMITED "
    "MaxMemPerNode=UNLIMITED TRES=cpu=4,mem=4000M,node=2,billing=4\n"
    "PartitionName=short AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL AllocNodes=ALL Default=NO QoS=N/A "
    "DefaultTime=NONE DisableRootJobs=NO ExclusiveUser=NO GraceTime=0 Hidden=NO MaxNodes=1 MaxTime=00:10:00 "
    "MinNodes=0 LLN=NO MaxCPUsPerNode=UNLIMITED Nodes=c[1-2] PriorityJobFactor=1 PriorityTier=1 RootOnly=NO "
    "ReqResv=NO OverSubscribe=NO OverTimeLimit=NONE PreemptMode=OFF State=UP TotalCPUs=4 TotalNodes=2 "
    "SelectTypeParameters=NONE JobDefaults=(null) DefMemPerNode=UNLIMITED MaxMemPerNode=UNLIMITED "
    "TRES=cpu=4,mem=4000M,node=2,billing=4\n"
)
CONFIG = """Configuration data as of 2026-11-23T15:00:00
AccountingStorageTRES   = cpu,mem,energy,node,billing,fs/disk,vmem,pages
ClusterName             = lab
GresTypes               = (null)
ProctrackType           = proctrack/cgroup
SlurmctldHost[0]        = lab-login(198.18.0.10)
SLURM_VERSION           = 22.05.8
"""
GPU_PARTITION = ("PartitionName=gpu Default=NO Hidden=NO MaxNodes=UNLIMITED MaxTime=2-00:00:00 MinNodes=0 "
                 "Nodes=g[1-4] State=UP TotalNodes=4 TRES=cpu=256,mem=2000G,node=4,billing=256,gres/gpu=16")


@pytest.fixture(autouse=True)
def fast_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ds, "POLL_S", 0.01)


def controller(config: dict[str, str] | None = None, extra: Sequence[str] = ()) -> dc.Controller:
    return dc.Controller({**parse_config(CONFIG), **(config or {})},
                         dc.parse_partitions(PARTITIONS + "\n".join(extra)))


def statuses(findings: list[Finding], check: str) -> list[CheckStatus]:
    return [f.status for f in findings if f.check == check]


def failures(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.status == CheckStatus.FAIL]


# -- time limits -------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "seconds"), [
    ("UNLIMITED", math.inf), ("INFINITE", math.inf), (" unlimited ", math.inf), ("00:10:00", 600),
    ("10", 600), ("5:30", 330), ("1-00:00:00", 86400), ("2-12", 216000), ("1-2:30", 95400),
    ("NONE", None), ("", None), ("soon", None), (None, None),
])
def test_time_limits_read_every_form_slurm_prints(text: str | None, seconds: float | None) -> None:
    assert dc.time_limit_s(text) == seconds


@pytest.mark.parametrize(("timeout", "job_time", "max_time", "minutes"), [
    (120.0, None, None, 3),  # the run's timeout and a minute
    (120.0, None, math.inf, 3),  # UNLIMITED caps nothing
    (120.0, 3600.0, 600.0, 3),
    (900.0, None, 600.0, 10),  # never past the partition's MaxTime: it would queue forever
    (900.0, 300.0, None, 5),  # nor past the job's own time
    (1.0, 30.0, None, 1),  # at least a minute
])
def test_the_node_check_job_asks_for_a_time_the_partition_takes(timeout: float, job_time: float | None,
                                                                  max_time: float | None, minutes: int) -> None:
    assert ds.allocation_minutes(timeout, job_time, max_time) == minutes


# -- the controller checks ---------------------------------------------------------------------

def test_a_request_that_fits_the_default_partition_is_all_ok() -> None:
    findings = dc.controller_checks(controller(), SlurmSpec(nodes=2, time="01:00:00"), "slurm")
    assert [(f.check, f.status) for f in findings] == [
        ("slurm", CheckStatus.OK), ("partition", CheckStatus.OK), ("proctrack", CheckStatus.OK)]
    assert "Slurm 22.05.8" in findings[0].message and "lab" in findings[0].message
    assert "partition debug takes 2 node(s)" in findings[1].message
    assert {f.host for f in findings} == {"slurm"}


@pytest.mark.parametrize(("spec", "words"), [
    (SlurmSpec(nodes=2, partition="short"), ["MaxNodes=1", "PartitionNodeLimit"]),
    (SlurmSpec(nodes=3), ["TotalNodes=2", "nodes = 3"]),
    (SlurmSpec(nodes=1, partition="short", time="20"), ["MaxTime=00:10:00", 'time = "20" (0:20:00)']),
    (SlurmSpec(nodes=1, partition="short", time="UNLIMITED"), ["MaxTime=00:10:00", "(UNLIMITED)"]),
    (SlurmSpec(nodes=1, partition="short", time="0-1"), ["MaxTime=00:10:00"]),
])
def test_a_request_that_does_not_fit_is_an_error_naming_the_limit(spec: SlurmSpec, words: list[str]) -> None:
    (bad,) = failures(dc.controller_checks(controller(), spec, "login1"))
    assert bad.check == "partition" and bad.host == "login1"
    for word in words:
        assert word in bad.message
    assert bad.fix.startswith("set [slurm]")


@pytest.mark.parametrize("spec", [
    SlurmSpec(nodes=1, partition="short", time="00:10:00"),  # exactly MaxTime
    SlurmSpec(nodes=1, partition="short", time="9:59"),
    SlurmSpec(nodes=2, partition="debug", time="UNLIMITED"),  # UNLIMITED on an UNLIMITED partition
    SlurmSpec(nodes=2, partition="debug", time="365-00:00:00"),
    SlurmSpec(nodes=1, partition="short"),  # no time: the partition's default
])
def test_time_limits_at_or_within_max_time_fit(spec: SlurmSpec) -> None:
    assert failures(dc.controller_checks(controller(), spec, "slurm")) == []


def test_a_missing_partition_lists_the_partitions_and_the_closest_name() -> None:
    (bad,) = failures(dc.controller_checks(controller(), SlurmSpec(partition="shrot"), "slurm"))
    assert bad.message == "partition shrot does not exist (did you mean short?)"
    assert bad.evidence == "partitions: debug, short"
    assert "debug, short" in bad.fix


def test_no_partition_and_no_default_partition_is_an_error() -> None:
    ctrl = replace(controller(), partitions=tuple({**p, "Default": "NO"} for p in controller().partitions))
    (bad,) = failures(dc.controller_checks(ctrl, SlurmSpec(), "slurm"))
    assert "no default partition" in bad.message and "debug, short" in bad.fix


def test_hidden_partitions_are_checked_but_not_suggested() -> None:
    hidden = "PartitionName=secret Default=NO Hidden=YES MaxNodes=UNLIMITED MaxTime=UNLIMITED State=UP TotalNodes=8"
    ctrl = controller(extra=[hidden])
    assert failures(dc.controller_checks(ctrl, SlurmSpec(nodes=4, partition="secret"), "slurm")) == []
    (bad,) = failures(dc.controller_checks(ctrl, SlurmSpec(partition="nope"), "slurm"))
    assert "secret" not in bad.evidence


@pytest.mark.parametrize(("state", "words"), [("DOWN", "none starts"), ("DRAIN", "no new jobs"),
                                              ("INACTIVE", "takes no jobs")])
def test_a_partition_that_is_not_up_is_an_error(state: str, words: str) -> None:
    ctrl = controller(extra=[f"PartitionName=p State={state} TotalNodes=4 MaxNodes=UNLIMITED MaxTime=UNLIMITED"])
    (bad,) = failures(dc.controller_checks(ctrl, SlurmSpec(partition="p"), "slurm"))
    assert f"partition p is {state}" in bad.message and words in bad.message


def test_a_comma_list_of_partitions_fails_only_when_none_fits() -> None:
    some = dc.controller_checks(controller(), SlurmSpec(nodes=2, partition="short,debug"), "slurm")
    assert failures(some) == [] and CheckStatus.WARN in statuses(some, "partition")
    none = dc.controller_checks(controller(), SlurmSpec(nodes=3, partition="short,debug"), "slurm")
    assert len(failures(none)) == 3


@pytest.mark.parametrize(("kind", "status"), [
    ("proctrack/linuxproc", CheckStatus.WARN), ("proctrack/pgid", CheckStatus.WARN),
    ("proctrack/cgroup", CheckStatus.OK), ("proctrack/cray_aries", CheckStatus.OK),
])
def test_proctrack_that_loses_double_forked_processes_is_a_warning(kind: str, status: CheckStatus) -> None:
    (f,) = dc.proctrack_findings({"ProctrackType": kind}, "slurm")
    assert f.status == status and kind in f.message
    if status == CheckStatus.WARN:
        assert "scancel" in f.message and "proctrack/cgroup" in f.fix


def test_proctrack_is_not_judged_when_the_config_does_not_say() -> None:
    assert dc.proctrack_findings({}, "slurm") == []


@pytest.mark.parametrize(("gres", "spec", "words"), [
    ("(null)", SlurmSpec(nodes=1, gpus_per_node=1, partition="debug"), "defines no GPUs"),
    ("gpu", SlurmSpec(nodes=4, gpus_per_node=8, partition="gpu"), "4 x 8 GPU(s)"),
])
def test_gpus_that_the_controller_says_it_lacks_are_an_error(gres: str, spec: SlurmSpec, words: str) -> None:
    (bad,) = failures(dc.controller_checks(controller({"GresTypes": gres}, [GPU_PARTITION]), spec, "slurm"))
    assert words in bad.message


@pytest.mark.parametrize("spec", [
    SlurmSpec(nodes=4, gpus_per_node=4, partition="gpu"),  # 16 in all: fits
    SlurmSpec(nodes=2, gpus_per_node=8, partition="debug"),  # TRES counts no GPUs: not determinable
    SlurmSpec(nodes=2, gpus_per_node=0, partition="debug"),
])
def test_gpus_are_judged_only_where_the_controller_says(spec: SlurmSpec) -> None:
    ctrl = controller({"GresTypes": "gpu,shard"}, [GPU_PARTITION])
    assert failures(dc.controller_checks(ctrl, spec, "slurm")) == []


def test_a_default_time_is_mentioned_when_the_job_sets_none() -> None:
    ctrl = controller(extra=["PartitionName=p State=UP TotalNodes=4 MaxNodes=UNLIMITED DefaultTime=01:00:00 "
                             "MaxTime=1-00:00:00"])
    findings = dc.controller_checks(ctrl, SlurmSpec(partition="p"), "slurm")
    assert statuses(findings, "partition") == [CheckStatus.INFO, CheckStatus.OK]
    assert "DefaultTime=01:00:00" in findings[1].message


# -- controller_findings through the transport seam --------------------------------------------

class ScriptedSlurm:
    """Slurm behind the transport seam: answers each command from a script, records every argv."""

    def __init__(self, queue: Sequence[str] = ("RUNNING", "COMPLETED"), files: dict[str, str] | None = None,
                 missing: Sequence[str] = (), sbatch_error: str = "") -> None:
        self.host = LOCALHOST
        self.calls: list[list[str]] = []
        self.queue = list(queue)
        self.files = dict(files or {})  # file name in the job directory -> content
        self.written: dict[str, bytes] = {}
        self.missing = set(missing)  # commands that are "not found"
        self.sbatch_error = sbatch_error
        self.cancelled = False

    def result(self, argv: Sequence[str], code: int = 0, out: str = "", err: str = "") -> CommandResult:
        return CommandResult("localhost", tuple(argv), code, out, err, 0.0)

    def run(self, argv: Sequence[str], *, stdin: bytes | None = None, timeout: float | None = None) -> CommandResult:
        self.calls.append(list(argv))
        if argv[0] in self.missing:
            return self.result(argv, 127, err=f"sh: 1: {argv[0]}: not found")
        if argv[0] == "scontrol":
            return self.result(argv, out=CONFIG if argv[1] == "show" else PARTITIONS)
        if argv[0] == "sh":  # home, or write
            if "HOME" in argv[2]:
                return self.result(argv, out="/home/alice")
            self.written[argv[4]] = stdin or b""
            return self.result(argv)
        if argv[0] == "sbatch":
            return self.result(argv, 1, err=self.sbatch_error) if self.sbatch_error else self.result(argv, out="42\n")
        if argv[0] == "squeue":
            state = "CANCELLED" if self.cancelled else (self.queue.pop(0) if len(self.queue) > 1 else self.queue[0])
            reason = "Resources" if state == "PENDING" else "None"
            return self.result(argv, out=f"42|{state}|{reason}|c[1-2]|ddpctl-doctor|0:01|\n")
        if argv[0] == "scancel":
            self.cancelled = True
            return self.result(argv)
        if argv[0] == "cat":
            name = argv[2].rsplit("/", 1)[-1]
            return self.result(argv, out=self.files[name]) if name in self.files else self.result(argv, 1)
        return self.result(argv)  # rm

    def start(self, argv: Sequence[str], *, stdin: bytes | None = None) -> Any:
        raise NotImplementedError

    def close(self) -> None:
        return None

    def ran(self, command: str) -> list[list[str]]:
        return [c for c in self.calls if c[0] == command]


def test_controller_findings_cost_two_scontrol_calls() -> None:
    fake = ScriptedSlurm()
    findings = ds.controller_findings(SlurmClient(fake), SlurmSpec(nodes=2, partition="short"))
    assert [c[:2] for c in fake.calls] == [["scontrol", "show"], ["scontrol", "-a"]]
    assert [f.status for f in failures(findings)] == [CheckStatus.FAIL]


def test_a_missing_slurm_client_is_one_error_with_a_fix() -> None:
    (f,) = ds.controller_findings(SlurmClient(ScriptedSlurm(missing=["scontrol"])), SlurmSpec())
    assert f.check == "slurm" and f.status == CheckStatus.FAIL and f.host == "slurm"
    assert "scontrol is not available on this machine" in f.message
    assert "login" in f.fix


# -- the node-check job ------------------------------------------------------------------------

def test_the_batch_script_asks_for_what_the_launch_asks_for_and_runs_one_task_per_node() -> None:
    spec = SlurmSpec(nodes=4, partition="gpu", account="p42", gpus_per_node=8, mem="480G", time="1-00:00:00",
                     extra_sbatch=("--exclusive",), setup=("module load cuda",), python="/opt/venv/bin/python")
    script = ds.batch_script(spec, "/home/a b/.ddpctl/runs/doctor-x")
    assert "#SBATCH --partition=gpu\n#SBATCH --account=p42\n#SBATCH --gpus-per-node=8\n#SBATCH --mem=480G\n" \
           "#SBATCH --exclusive\n" in script
    assert "--time" not in script  # on sbatch's command line: the doctor job is short
    assert "S='/home/a b/.ddpctl/runs/doctor-x'" in script
    assert 'srun --nodes=4 --ntasks-per-node=1 --input="$S/node.in" --output="$S/node-%t.out" bash "$S/node.sh"' \
           in script
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    node = node_script(spec)
    assert node.splitlines()[2] == "module load cuda"
    assert node.splitlines()[3].startswith("exec sh -c ") and "/opt/venv/bin/python" in node
    subprocess.run(["bash", "-n"], input=node, text=True, check=True)
    argv = ds.sbatch_argv(spec, "/s", 3)
    assert {"--time=3", "--nodes=4", "--job-name=ddpctl-doctor", "--no-requeue", "--chdir=/s"} <= set(argv)
    assert argv[-1] == "/s/job.sbatch"


def reply_line(hostname: str, rank: int, results: list[dict[str, Any]],
               listeners: list[dict[str, Any]] | None = None) -> str:
    probe = {"rank": rank, "world": 2, "hostname": hostname, "listeners": listeners or [], "results": results,
             "missing": [], "late": []}
    facts = {"hostname": hostname, "hostname_resolution": [{"family": "inet", "address": f"198.18.0.{11 + rank}"}]}
    return "some warning on stderr\n" + RESULT_PREFIX + json.dumps({"facts": facts, "errors": {}, "probe": probe})


def dialed(rank: int, hostname: str, purpose: str, port: int, ok: bool = True) -> dict[str, Any]:
    return {"rank": rank, "hostname": hostname, "purpose": purpose, "port": port, "ok": ok,
            "kind": "ok" if ok else "refused", "error": None if ok else "Connection refused"}


def test_probe_outcomes_name_the_nodes_and_the_rendezvous_port_is_the_master_port() -> None:
    replies = {
        "c1": json.loads(reply_line("c1", 0, [dialed(1, "c2", "ephemeral", 40001)],
                                    [{"purpose": "master_port", "port": 29542}]).split(RESULT_PREFIX)[1]),
        "c2": json.loads(reply_line("c2", 1, [dialed(0, "c1", "ephemeral", 40000),
                                              dialed(0, "c1", "master_port", 29542, ok=False)]
                                    ).split(RESULT_PREFIX)[1]),
    }
    probes = ds.probe_results(["c1", "c2"], replies)
    assert [(o.source, o.target_host, o.port, o.purpose, o.ok) for o in probes.outcomes] == [
        ("c1", "c2", 40001, "ephemeral", True), ("c2", "c1", 40000, "ephemeral", True),
        ("c2", "c1", 29542, "master_port", False)]
    assert probes.skipped == {} and probes.errors == {}
    replies["c1"]["probe"]["listeners"] = [{"purpose": "master_port", "port": None, "error": "all busy"}]
    assert "all busy" in ds.probe_results(["c1", "c2"], replies).skipped["master_port"]
    replies["c2"]["probe"]["missing"] = [0]
    assert "never saw their files" in ds.probe_results(["c1", "c2"], replies).errors["c2"]
    assert ds.probe_results(["c1"], {"c1": replies["c1"]}).skipped["ephemeral"] == ds.TOO_FEW


def test_the_allocation_reads_every_node_and_leaves_nothing_behind() -> None:
    fake = ScriptedSlurm(files={"nodes": "c1\nc2\n", "node-0.out": reply_line("c1", 0, []),
                                "node-1.out": "Traceback (most recent call last):\nImportError: boom\n"})
    notes: list[str] = []
    run = ds.run_allocation(SlurmClient(fake), SlurmSpec(nodes=2), {"python": "python3"}, 10.0, 1, "slurm",
                            notes.append)
    assert run.slurm_id == "42" and run.nodes == ["c1", "c2"] and list(run.replies) == ["c1"]
    assert "ImportError: boom" in run.failed["c2"].message
    assert [f.status for f in run.findings] == [CheckStatus.OK]
    assert fake.ran("scancel") == []  # it ended by itself
    (rm,) = fake.ran("rm")
    assert rm[-1].startswith("/home/alice/.ddpctl/runs/doctor-")
    request = fake.written[rm[-1] + "/node.in"]
    assert b'"op": "slurm_check"' in request and f'"dir": "{rm[-1]}"'.encode() in request
    assert any("runs on c[1-2]" in n for n in notes)


def test_a_job_still_queued_at_the_timeout_is_cancelled_and_is_an_error() -> None:
    fake = ScriptedSlurm(queue=["PENDING"])
    run = ds.run_allocation(SlurmClient(fake), SlurmSpec(nodes=2), {}, 0.05, 1, "slurm", lambda _: None)
    (f,) = run.findings
    assert f.status == CheckStatus.FAIL and "still queued" in f.message and "(Resources)" in f.message
    assert "cancelled it" in f.message
    assert fake.ran("scancel") == [["scancel", "42"]] and run.ended and len(fake.ran("rm")) == 1


def test_a_failure_while_waiting_still_cancels_the_job(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = ScriptedSlurm()
    calls = {"n": 0}

    def broken(argv: Sequence[str], **kw: Any) -> CommandResult:
        if argv[0] == "squeue" and calls["n"] == 0:
            calls["n"] += 1
            raise KeyboardInterrupt
        return ScriptedSlurm.run(fake, argv, **kw)

    monkeypatch.setattr(fake, "run", broken)
    with pytest.raises(KeyboardInterrupt):
        ds.run_allocation(SlurmClient(fake), SlurmSpec(nodes=2), {}, 10.0, 1, "slurm", lambda _: None)
    assert fake.ran("scancel") == [["scancel", "42"]] and len(fake.ran("rm")) == 1


def test_a_refused_submission_is_an_error_and_nothing_to_cancel() -> None:
    fake = ScriptedSlurm(sbatch_error="sbatch: error: Batch job submission failed: Invalid account")
    run = ds.run_allocation(SlurmClient(fake), SlurmSpec(nodes=2, account="x"), {}, 10.0, 1, "slurm",
                            lambda _: None)
    (f,) = run.findings
    assert f.status == CheckStatus.FAIL and "Invalid account" in f.message
    assert fake.ran("scancel") == [] and len(fake.ran("rm")) == 1


def test_run_slurm_doctor_skips_the_node_checks_when_the_job_cannot_start(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "job.toml").write_text('[job]\nname = "t"\nscript = "train.py"\n[slurm]\nnodes = 2\n'
                                       'partition = "short"\n')
    fake = ScriptedSlurm()
    monkeypatch.setattr(slurm_doctor, "slurm_client", lambda pool, login, inventory: SlurmClient(fake))
    report = slurm_doctor.run_slurm_doctor(load_job(tmp_path / "job.toml"), pool=None)  # type: ignore[arg-type]
    assert report.exit_code() == 1 and report.hosts == ["slurm"]
    assert report.cell("slurm", "partition") == CheckStatus.FAIL
    assert fake.ran("sbatch") == []
    assert {f.status for f in report.findings if f.check in ds.node_checks()} == {CheckStatus.SKIP}


def test_run_slurm_doctor_runs_doctors_node_checks_on_the_replies(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "job.toml").write_text('[job]\nname = "t"\nscript = "train.py"\n[slurm]\nnodes = 2\n')
    files = {"nodes": "c1\nc2\n",
             "node-0.out": reply_line("c1", 0, [dialed(1, "c2", "ephemeral", 40001)],
                                      [{"purpose": "ephemeral", "port": 40000},
                                       {"purpose": "master_port", "port": 29542}]),
             "node-1.out": reply_line("c2", 1, [dialed(0, "c1", "ephemeral", 40000),
                                                dialed(0, "c1", "master_port", 29542, ok=False)])}
    fake = ScriptedSlurm(files=files)
    monkeypatch.setattr(slurm_doctor, "slurm_client", lambda pool, login, inventory: SlurmClient(fake))
    report = slurm_doctor.run_slurm_doctor(load_job(tmp_path / "job.toml"), pool=None)  # type: ignore[arg-type]
    assert report.hosts == ["slurm", "c1", "c2"] and report.checks[:4] == ["slurm", "partition", "proctrack", "alloc"]
    (blocked,) = [f for f in report.findings if f.check == "firewall" and f.status == CheckStatus.FAIL]
    assert blocked.host == "c1" and "master port 29542" in blocked.message
    assert "198.18.0.0/24" not in blocked.fix and "198.18.0.12" in blocked.fix  # the peer's resolved address
    assert report.cell("slurm", "firewall") == CheckStatus.SKIP  # node checks stay on the node rows
    assert report.exit_code() == 1


# -- the slurm_check op, two tasks on this machine ---------------------------------------------

def test_two_tasks_meet_through_the_shared_directory_and_dial_each_other(tmp_path: Path) -> None:
    request = {"op": "slurm_check", "dir": str(tmp_path), "wait": 20, "select": ["hostname_resolution"],
               "rdzv_base": 29500, "rdzv_spread": 1000, "rdzv_tries": 200, "python": sys.executable}
    procs = []
    for rank in range(2):
        env = {**os.environ, "SLURM_PROCID": str(rank), "SLURM_NTASKS": "2", "SLURM_JOB_ID": "1234"}
        procs.append(subprocess.Popen([sys.executable, "-m", "node_agent"], cwd=ROOT, env=env, text=True,
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL))
    for p in procs:  # both start before either is read: they wait for each other
        assert p.stdin is not None
        p.stdin.write(json.dumps(request) + "\n")
        p.stdin.close()
    outs = [p.stdout.read() if p.stdout else "" for p in procs]  # the op's waits bound these reads
    assert [p.wait(timeout=30) for p in procs] == [0, 0]
    probes = [json.loads(o.split(RESULT_PREFIX, 1)[1])["probe"] for o in outs]
    (rdzv,) = [x for x in probes[0]["listeners"] if x["purpose"] == "master_port"]
    assert 29500 + 1234 % 1000 <= rdzv["port"] < 29500 + 1234 % 1000 + 200
    assert [(r["rank"], r["purpose"], r["ok"]) for r in probes[0]["results"]] == [(1, "ephemeral", True)]
    assert sorted((r["purpose"], r["ok"]) for r in probes[1]["results"]) == [("ephemeral", True),
                                                                              ("master_port", True)]
    assert probes[1]["head"] == probes[0]["hostname"] and probes[0]["missing"] == probes[0]["late"] == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["done-0.json", "done-1.json", "listen-0.json",
                                                          "listen-1.json"]


def test_a_task_whose_peer_never_comes_reports_it_missing_within_the_wait(tmp_path: Path) -> None:
    request = {"op": "slurm_check", "dir": str(tmp_path), "wait": 0.5, "select": ["hostname_resolution"]}
    env = {**os.environ, "SLURM_PROCID": "1", "SLURM_NTASKS": "2"}
    out = subprocess.run([sys.executable, "-m", "node_agent"], cwd=ROOT, env=env, text=True, capture_output=True,
                         input=json.dumps(request) + "\n", timeout=30).stdout
    reply = json.loads(out.split(RESULT_PREFIX, 1)[1])
    assert reply["probe"]["missing"] == [0] and reply["probe"]["results"] == []
    assert reply["probe"]["head"] is None and "hostname_resolution" in reply["facts"]


def test_inside_a_running_job_every_task_dials_the_jobs_own_store(tmp_path: Path) -> None:
    """The watchdog's re-probe: `master` names the job's store (here a listener of this test, then a
    closed port); the tasks dial it and each other, listen on nothing in the rendezvous range and
    gather no facts."""
    import socket

    store = socket.socket()
    store.bind(("127.0.0.1", 0))
    store.listen(8)
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    dead_port = closed.getsockname()[1]
    closed.close()
    for endpoint, reachable in ((f"127.0.0.1:{store.getsockname()[1]}", True), (f"127.0.0.1:{dead_port}", False)):
        request = {"op": "slurm_check", "dir": str(tmp_path / str(reachable)), "wait": 5, "facts": False,
                   "master": endpoint, "connect_timeout": 2}
        env = {**os.environ, "SLURM_PROCID": "0", "SLURM_NTASKS": "1"}
        out = subprocess.run([sys.executable, "-m", "node_agent"], cwd=ROOT, env=env, text=True,
                             capture_output=True, input=json.dumps(request) + "\n", timeout=30).stdout
        reply = json.loads(out.split(RESULT_PREFIX, 1)[1])
        (dialed,) = reply["probe"]["results"]
        assert (dialed["purpose"], dialed["port"], dialed["ok"]) == ("master_port", int(endpoint.split(":")[1]),
                                                                     reachable)
        assert [x["purpose"] for x in reply["probe"]["listeners"]] == ["ephemeral"]
        assert "facts" not in reply
    store.close()
