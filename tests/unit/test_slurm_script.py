"""Golden tests of the Slurm batch script and node script for the [slurm] options, and how a
job file's [slurm] table becomes the plan's nodes and torchrun options."""

from __future__ import annotations

import os
import shlex
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from inventory import ConfigError, load_job
from inventory.slurm_table import node_hosts, nproc_for
from inventory.specs import SlurmSpec
from node_agent.wire.layout import slurm_state_dir as state_dir
from orchestrator.launch.backends.slurm import batch_request, exit_code_of
from orchestrator.launch.backends.slurm_script import render_batch, sbatch_argv
from orchestrator.launch.options import LaunchOptions
from orchestrator.launch.plan import LaunchPlan, build_plan
from orchestrator.remote.agent import agent_argv
from orchestrator.remote.slurm_client import node_script

GOLDEN = Path(__file__).parent / "golden"
STATE = "/home/alice/.ddpctl/runs/train-20261123-120000-abcd"
JOB_ID = "train-20261123-120000-abcd"

FULL = """
[slurm]
nodes = 4
partition = "gpu"
account = "proj42"
qos = "high"
time = "1-12:00:00"
gpus_per_node = 8
cpus_per_task = 64
mem = "480G"
constraint = "a100&ib"
python = "/opt/venv/bin/python"
extra_sbatch = ["#SBATCH --exclusive", "--mail-type=END"]
setup = ["module load cuda/12.4", "source /opt/venv/bin/activate"]
requeue = true
signal = "USR1@120"
"""


def plan_for(tmp_path: Path, slurm: str, nproc: str = "8", env: str = "") -> LaunchPlan:
    (tmp_path / "train.py").write_text("")
    (tmp_path / "job.toml").write_text(f'[job]\nname = "train"\nscript = "train.py"\nargs = ["--lr", "0.1"]\n'
                                       f"nproc_per_node = {nproc}\n{slurm}\n[env]\n{env}\n")
    job = load_job(tmp_path / "job.toml")
    assert job.slurm is not None
    hosts = node_hosts(job, job.slurm)
    job = replace(job, hosts=hosts, base_dir=Path("/home/alice/proj"))
    return build_plan(job, JOB_ID, {h.name: nproc_for(job, job.slurm) for h in hosts}, 29500)  # type: ignore[arg-type]


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("DDPCTL_UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert text == path.read_text(), f"{name} changed (DDPCTL_UPDATE_GOLDEN=1 rewrites it)"


def test_minimal_job_script(tmp_path: Path) -> None:
    plan = plan_for(tmp_path, "[slurm]\nnodes = 2", nproc="2")
    assert plan.job.slurm is not None
    check_golden("slurm-minimal.sbatch", render_batch(plan, plan.job.slurm, STATE, plan.master_port))
    check_golden("slurm-minimal.node.sh", node_script(plan.job.slurm))


def test_every_option_script(tmp_path: Path) -> None:
    plan = plan_for(tmp_path, FULL, nproc='"gpu"')
    spec = plan.job.slurm
    assert spec is not None
    script = render_batch(plan, spec, STATE, plan.master_port)
    check_golden("slurm-full.sbatch", script)
    check_golden("slurm-full.node.sh", node_script(spec))
    assert "--gpus-per-task" not in script and "#SBATCH --gpus-per-node=8" in script
    # torchrun passes the early warning to the ranks as a Python signal
    assert "--signals-to-handle SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1" in plan.hosts[0].display()
    assert plan.hosts[0].nproc == 8 and len(plan.hosts) == 4 and plan.world_size == 32


def test_rendered_scripts_are_valid_bash(tmp_path: Path) -> None:
    plan = plan_for(tmp_path, FULL, nproc='"gpu"')
    assert plan.job.slurm is not None
    for name, body in (("job.sbatch", render_batch(plan, plan.job.slurm, STATE, 29500)),
                       ("node.sh", node_script(plan.job.slurm))):
        (tmp_path / name).write_text(body)
        assert body.startswith("#!/bin/bash\n")
        checked = subprocess.run(["bash", "-n", str(tmp_path / name)], capture_output=True, text=True, check=False)
        assert checked.returncode == 0, (name, checked.stderr)


def test_paths_with_spaces_go_as_sbatch_arguments_not_script_lines() -> None:
    argv = sbatch_argv("/home/a b/.ddpctl/runs/x", "/work/my proj")
    assert argv[:2] == ["sbatch", "--parsable"]
    assert "--chdir=/work/my proj" in argv and "--output=/home/a b/.ddpctl/runs/x/batch.out" in argv
    assert state_dir("/home/a b/", "x") == "/home/a b/.ddpctl/runs/x"


def test_the_node_script_quotes_the_interpreter_and_paths(tmp_path: Path) -> None:
    text = node_script(SlurmSpec(python="/opt/my env/bin/python"))
    exec_line = text[text.index("\nexec ") + 1:]  # the agent's bootstrap spans lines, quoted as one word
    assert shlex.split(exec_line) == ["exec", *agent_argv("/opt/my env/bin/python")]
    plan = plan_for(tmp_path, "[slurm]\nnodes = 2", nproc="2")
    assert plan.job.slurm is not None
    script = render_batch(plan, plan.job.slurm, "/home/a b/s", 29500)
    (s_line,) = [line for line in script.splitlines() if line.startswith("S=")]
    assert shlex.split(s_line) == ["S=/home/a b/s"]
    assert '--input="$S/node.in"' in script and 'bash "$S/node.sh"' in script


def test_every_node_reads_one_request_and_takes_its_rank_from_slurm(tmp_path: Path) -> None:
    plan = plan_for(tmp_path, FULL, nproc='"gpu"', env='API_TOKEN = "s3cret"')
    assert plan.job.slurm is not None
    request = batch_request(plan, plan.job.slurm, LaunchOptions())
    assert request["op"] == "supervise" and request["batch"] is True
    assert request["node_rank_env"] == "SLURM_PROCID" and "node_rank" not in request
    assert request["forward_signals"] == ["USR1"] and request["env"]["API_TOKEN"] == "s3cret"  # type: ignore[index]
    assert request["program"] == ["train.py", "--lr", "0.1"] and request["cwd"] == str(tmp_path)
    assert request["heartbeat_timeout"] == 0  # nobody sends heartbeats: the scheduler's signals stop it
    assert request["metrics_dir"] == ""  # no [slurm.metrics]: no textfile


def test_every_node_writes_its_textfile_where_slurm_metrics_says(tmp_path: Path) -> None:
    plan = plan_for(tmp_path, '[slurm]\nnodes = 2\nmetrics = { textfile_dir = "/var/lib/prometheus/node-exporter" }\n'
                    '[metrics]\nevery = "2s"\nkeep_ended = "1m"')
    assert plan.job.slurm is not None
    request = batch_request(plan, plan.job.slurm, LaunchOptions())
    assert (request["metrics_dir"], request["metrics_every"], request["metrics_keep"]) == (
        "/var/lib/prometheus/node-exporter", 2.0, 60.0)
    with pytest.raises(ConfigError) as bad:
        plan_for(tmp_path, '[slurm]\nmetrics = { textfile_dir = "prom" }')
    assert bad.value.key == "slurm.metrics.textfile_dir" and "absolute path" in str(bad.value)


@pytest.mark.parametrize(("show", "code"), [
    ({"ExitCode": "0:0"}, 1), ({"ExitCode": "3:0"}, 3), ({"ExitCode": "0:9"}, 137), ({}, 1),
])
def test_exit_code_of_scontrol(show: dict[str, str], code: int) -> None:
    assert exit_code_of(show) == code
