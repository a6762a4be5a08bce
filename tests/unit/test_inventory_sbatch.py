"""[slurm] mem as sbatch --mem reads it, and extra_sbatch options ddpctl sets itself refused with
the [slurm] key to use (issue 27); doctor's check allocation asks for what the job asks for."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from inventory import ConfigError, load_job
from inventory.sbatch import OWNED, SBATCH_OPTIONS, allocation_options, split_options
from inventory.specs import SlurmSpec
from orchestrator.checks import slurm_nodes as ds

HEAD = '[job]\nscript = "train.py"\n[slurm]\n'


def slurm_of(tmp_path: Path, text: str) -> SlurmSpec:
    (tmp_path / "train.py").write_text("")
    path = tmp_path / "job.toml"
    path.write_text(HEAD + text)
    spec = load_job(path).slurm
    assert spec is not None
    return spec


def error_of(tmp_path: Path, text: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        slurm_of(tmp_path, text)
    assert info.value.file == tmp_path / "job.toml"
    return info.value


# --- 3. mem: what Slurm 22.05's str_to_mbytes takes (verified against sbatch --mem on this machine) --

@pytest.mark.parametrize(("given", "written"), [
    ("1g", "1G"), ("64GB", "64G"), ("64gb", "64G"), ("500Mb", "500M"), ("1KB", "1K"), ("2t", "2T"),
    ("1024", "1024"), ("0", "0"), ("007G", "7G"), ("+1G", "1G"), (" 64G ", "64G"),
])
def test_mem_takes_what_sbatch_takes_and_writes_it_one_way(tmp_path: Path, given: str, written: str) -> None:
    assert slurm_of(tmp_path, f"mem = {json.dumps(given)}\n").mem == written


@pytest.mark.parametrize("given", ["1.5G", "1P", "1GiB", "1B", "G", "1 G", "1g2", "10GBB", "-1", "1e3", "0x10",
                                   "lots", "9223372036854775808", "8796093022208T"])
def test_mem_refuses_what_sbatch_refuses(tmp_path: Path, given: str) -> None:
    err = error_of(tmp_path, f"mem = {json.dumps(given)}\n")
    assert (err.key, err.line) == ("slurm.mem", 4)
    assert "Slurm memory size" in err.message or "more memory than Slurm can count" in err.message


# --- 4. extra_sbatch ----------------------------------------------------------------------------


@pytest.mark.parametrize(("option", "message", "fix"), [
    ("--nodes=1", '"--nodes=1" sets the node count, which ddpctl sets from [slurm] nodes',
     "write nodes = 1 in [slurm] and drop this item"),
    ("--nodes 3", '"--nodes 3" sets the node count', "write nodes = 3 in [slurm]"),
    ("-N 2", '"-N 2" (-N is --nodes) sets the node count', "write nodes = 2 in [slurm]"),
    ("-N2", '"-N2" (-N is --nodes) sets the node count', "write nodes = 2 in [slurm]"),
    ("-HN2", '"-HN2" (-N is --nodes) sets the node count', "write nodes = 2 in [slurm]"),
    ("#SBATCH --exclusive --time=30 # two options", '"--time=30" sets the time limit, which ddpctl sets from '
     "[slurm] time", 'write time = "30" in [slurm]'),
    ("--ntasks-per-n=1", '"--ntasks-per-n=1" (sbatch reads it as --ntasks-per-node) sets the tasks per node, which '
     "ddpctl must set itself: ddpctl runs one task per node", "drop this item"),
    ("-n 4", '"-n 4" (-n is --ntasks) sets the task count, which ddpctl must set itself', "drop this item"),
    ("--gpus-per-task=1", '"--gpus-per-task=1" gives each task its own GPUs', "write gpus_per_node = 1 in [slurm]"),
    ("--mem=64GB", '"--mem=64GB" sets the memory per node, which ddpctl sets from [slurm] mem',
     'write mem = "64GB" in [slurm]'),
    ("-o out.txt", '"-o out.txt" (-o is --output) sets where the batch output goes, which ddpctl must set itself: '
     "ddpctl writes it to the job's state directory", "drop this item"),
    ("--requeue", '"--requeue" lets Slurm requeue the job, which ddpctl sets from [slurm] requeue',
     "write requeue = true in [slurm]"),
    ("--no-requeue", '"--no-requeue" stops Slurm requeueing the job', "write requeue = false in [slurm]"),
    ("--signal=B:USR2@120", '"--signal=B:USR2@120" sets the early-warning signal', 'write signal = "USR2@120"'),
    ("-J mine", '"-J mine" (-J is --job-name) names the job, which ddpctl must set itself', "drop this item"),
    ("--comment=x", "sets the job's comment, which ddpctl must set itself", "drop this item"),
    ("-D /scratch", '"-D /scratch" (-D is --chdir) sets the job\'s directory, which ddpctl sets from [slurm] '
     "workdir", 'write workdir = "/scratch" in [slurm]'),
    ("--part=gpu", '"--part=gpu" (sbatch reads it as --partition) sets the partition', 'write partition = "gpu"'),
    ("-A proj", "sets the account, which ddpctl sets from [slurm] account", 'write account = "proj"'),
    ("--qos=high", "sets the QOS", 'write qos = "high"'),
    ("-c 8", "sets the CPUs per task", "write cpus_per_task = 8"),
    ("--gpus-per-node=4", "sets the GPUs per node", "write gpus_per_node = 4"),
    ("-G 8", "asks for GPUs for the whole job", "write gpus_per_node = 8"),
    ("-C a100", "sets the node features", 'write constraint = "a100"'),
    ("--open-mode=truncate", "sets how the batch output file is opened", "drop this item"),
    ("--parsable", "changes what sbatch prints", "drop this item"),
    ("--wrap=hostname", "replaces the batch script", "drop this item"),
    ("-a 1-4", "makes the job an array of jobs", "drop this item"),
    ("-W", "makes sbatch wait for the job to end", "drop this item"),
    ("--test-only", "submits nothing", "drop this item"),
    ("-M other", "sends the job to another cluster", "drop this item"),
    ("--node=1", '"--node=1" may abbreviate --nodefile, --nodelist, --nodes: sbatch refuses a prefix that starts '
     "several options", "write the option out in full"),
    ("--ti 30", '"--ti 30" may abbreviate --time, --time-min', "write the option out in full"),
])
def test_an_option_ddpctl_sets_is_an_error_naming_the_key_to_use(tmp_path: Path, option: str, message: str,
                                                                 fix: str) -> None:
    err = error_of(tmp_path, f'extra_sbatch = ["--exclusive", {json.dumps(option)}]\n')
    assert (err.key, err.line) == ("slurm.extra_sbatch[1]", 4)
    assert message in err.message and err.hint is not None and fix in err.hint


@pytest.mark.parametrize("option", ["--exclusive", "--mail-type=END", "-w node1", "--nodelist=n[1-2]", "-x n3",
                                    "--gres=gpu:4", "--hint=nomultithread", "-k", "--tmp=10G", "--mem-per-cpu=4G",
                                    "--reservation=maint", "--nodefile=hosts", "--time-min=30", "--ntasks-per-core=1"])
def test_options_that_leave_the_job_shape_alone_pass_through(tmp_path: Path, option: str) -> None:
    assert slurm_of(tmp_path, f"extra_sbatch = [{json.dumps(option)}]\n").extra_sbatch == (option,)


def test_an_option_sbatch_refuses_beside_mem_is_an_error_only_where_mem_is_set(tmp_path: Path) -> None:
    err = error_of(tmp_path, 'mem = "64G"\nextra_sbatch = ["--mem-per-cpu=4G"]\n')
    assert err.message == 'sbatch refuses "--mem-per-cpu=4G" beside --mem, which ddpctl passes from [slurm] mem'
    assert slurm_of(tmp_path, 'extra_sbatch = ["--mem-per-gpu=4G"]\n').extra_sbatch == ("--mem-per-gpu=4G",)


def test_an_open_quote_is_an_error(tmp_path: Path) -> None:
    err = error_of(tmp_path, 'extra_sbatch = ["--comment=\\"x"]\n')
    assert "cannot be read as sbatch options" in err.message


def test_every_owned_option_is_one_sbatch_has_and_no_other_is_a_prefix_of_one() -> None:
    assert set(OWNED) <= SBATCH_OPTIONS
    # a full option name is read as itself: none outside OWNED may then start an owned one
    assert not [(n, o) for n in SBATCH_OPTIONS - set(OWNED) for o in OWNED if o.startswith(n)]


def test_split_options_reads_a_line_as_sbatch_does() -> None:
    got = [(g.name, g.value, g.long) for g in split_options("--exclusive -HN2 --time 30 -p gpu --x=1 # -N 9")]
    assert got == [("exclusive", None, True), ("H", None, False), ("N", "2", False), ("time", "30", True),
                   ("p", "gpu", False), ("x", "1", True)]


def test_doctor_allocation_takes_the_jobs_extra_options_but_those_that_say_when_it_may_start() -> None:
    extra = ("--exclusive", "--begin=now+1h", "-d afterok:12", "--mail-user=a@b", "-H", "--hint=nomultithread",
             "--dep=singleton", "--deadline=tomorrow", "-w n1")
    assert allocation_options(extra) == ("--exclusive", "--hint=nomultithread", "-w n1")
    spec = SlurmSpec(nodes=2, partition="gpu", mem="64G", extra_sbatch=extra)
    lines = [line for line in ds.batch_script(spec, "/s").splitlines() if line.startswith("#SBATCH")]
    assert lines == ["#SBATCH --partition=gpu", "#SBATCH --mem=64G", "#SBATCH --exclusive",
                     "#SBATCH --hint=nomultithread", "#SBATCH -w n1"]
