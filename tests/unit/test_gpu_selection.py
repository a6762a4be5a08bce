"""GPU selection per host (`gpus = [0, 2]`): parsing with located errors, the env and nproc the plan
gets from it, an explicit CUDA_VISIBLE_DEVICES against it, and the dry run that shows it."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from inventory import ConfigError, Host, Inventory, Job, JobOverrides, Rendezvous, load_inventory, load_job
from inventory.gpus import check_job_env
from orchestrator.cli import app
from orchestrator.launch.plan import build_plan
from orchestrator.launch.preflight import (
    CHECK_FACTS,
    LAUNCH_FACTS,
    NET_FACTS,
    launch_facts,
    resolve_nprocs,
    static_nprocs,
)
from orchestrator.remote.wire import Facts, HostFacts

runner = CliRunner()


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "hosts.toml"
    path.write_text(text, encoding="utf-8")
    return path


def line_of(path: Path, needle: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if needle in line)


# --- parsing ----------------------------------------------------------------------------------


def test_a_selection_loads_as_a_tuple_in_the_order_given_and_defaults_pass_it_on(tmp_path: Path) -> None:
    path = write(tmp_path, '[defaults]\ngpus = [1]\n'
                           '[[hosts]]\nname = "a"\ngpus = [2, 0]\n'
                           '[[hosts]]\nname = "b"\n'
                           '[[hosts]]\nname = "c"\ngpus = 4\n'
                           '[[hosts]]\nname = "d"\ngpus = "auto"\n'
                           '[[hosts]]\nname = "e"\ngpus = [\n  0,\n  3,\n]\n')
    a, b, c, d, e = load_inventory(path).hosts
    assert (a.gpus, b.gpus, c.gpus, d.gpus, e.gpus) == ((2, 0), (1,), 4, "auto", (0, 3))
    with pytest.raises(AttributeError):
        a.gpus.append(1)  # type: ignore[union-attr]


BAD_SELECTIONS = [
    ("empty", "gpus = []", "hosts[0].gpus", "the GPU selection is empty", 'write "auto" for all of them'),
    ("duplicate", "gpus = [0, 2, 0]", "hosts[0].gpus[2]", "GPU 0 is listed twice",
     "list each GPU once: gpus = [0, 2]"),
    ("negative", "gpus = [0, -1]", "hosts[0].gpus[1]", "GPU index -1 is negative", "start at 0"),
    ("bool", "gpus = [true]", "hosts[0].gpus[0]", "expected a GPU index, got boolean true",
     "the index nvidia-smi shows"),
    ("quoted", 'gpus = [0, "1"]', "hosts[0].gpus[1]", 'expected a GPU index, got string "1"',
     "write it without quotes: 1"),
    ("float", "gpus = [1.5]", "hosts[0].gpus[0]", "expected a GPU index, got float 1.5", None),
    ("nested", "gpus = [[0]]", "hosts[0].gpus[0]", "expected a GPU index, got an array", None),
    ("index-past-bound", "gpus = [1024]", "hosts[0].gpus[0]", "GPU index 1024 is beyond the 1024 GPUs",
     "the index nvidia-smi shows"),
    ("too-many", "gpus = [" + ", ".join(["0"] * 1025) + "]", "hosts[0].gpus",
     "selects 1025 GPUs, more than 1024 per host", '"auto"'),
    ("comma-string", 'gpus = "0,2"', "hosts[0].gpus",
     'expected a GPU count, "auto" or an array of GPU indices, got string "0,2"',
     "write the GPU indices as an array: gpus = [0, 2]"),
    ("digit-string", 'gpus = "4"', "hosts[0].gpus", 'got string "4"', "write the count without quotes: gpus = 4"),
    ("typo", 'gpus = "atuo"', "hosts[0].gpus", 'got string "atuo"', 'did you mean "auto"?'),
]


@pytest.mark.parametrize(("text", "key", "message", "hint"), [c[1:] for c in BAD_SELECTIONS],
                         ids=[c[0] for c in BAD_SELECTIONS])
def test_a_bad_selection_is_one_located_error(tmp_path: Path, text: str, key: str, message: str,
                                              hint: str | None) -> None:
    path = write(tmp_path, f'[[hosts]]\nname = "a"\n{text}\n')
    with pytest.raises(ConfigError) as info:
        load_inventory(path)
    err = info.value
    assert (err.file, err.line, err.key) == (path, 3, key)
    assert message in err.message
    if hint is not None:
        assert err.hint is not None and hint in err.hint
    assert str(err).startswith(f"{path}:3:")


def test_a_bad_selection_in_defaults_names_the_defaults_key(tmp_path: Path) -> None:
    path = write(tmp_path, '[defaults]\nuser = "x"\ngpus = [3, 3]\n[[hosts]]\nname = "a"\n')
    with pytest.raises(ConfigError) as info:
        load_inventory(path)
    assert (info.value.line, info.value.key) == (3, "defaults.gpus[1]")


@pytest.mark.parametrize(("text", "key", "env_key"), [
    ('[[hosts]]\nname = "a"\ngpus = [0, 2]\nenv = { CUDA_VISIBLE_DEVICES = "1" }\n',
     "hosts[0].gpus", "hosts[0].env.CUDA_VISIBLE_DEVICES"),
    ('[defaults]\ngpus = [0]\nenv = { CUDA_VISIBLE_DEVICES = "1" }\n[[hosts]]\nname = "a"\n',
     "defaults.gpus", "defaults.env.CUDA_VISIBLE_DEVICES"),
    ('[defaults]\ngpus = [0]\n[[hosts]]\nname = "a"\nenv = { CUDA_VISIBLE_DEVICES = "1" }\n',
     "defaults.gpus", "hosts[0].env.CUDA_VISIBLE_DEVICES"),
], ids=["same-host", "both-in-defaults", "host-env-over-default-selection"])
def test_an_inventory_env_naming_other_gpus_than_the_selection_is_an_error(
        tmp_path: Path, text: str, key: str, env_key: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_inventory(path)
    err = info.value
    assert err.key == key and err.line == line_of(path, "gpus =")
    assert env_key in err.message and '"1"' in err.message
    assert err.hint is not None and f"remove {env_key}" in err.hint


def test_a_hosts_own_selection_wins_over_a_defaults_env_and_an_equal_env_is_accepted(tmp_path: Path) -> None:
    path = write(tmp_path, '[defaults]\nenv = { CUDA_VISIBLE_DEVICES = "1" }\n'
                           '[[hosts]]\nname = "a"\ngpus = [0, 2]\n'
                           '[[hosts]]\nname = "b"\ngpus = [1]\n'
                           '[[hosts]]\nname = "c"\n')
    a, b, c = load_inventory(path).hosts
    job = make_job((a, b, c), nproc=1)
    env = {hl.host.name: hl.env for hl in build_plan(job, "t-1", {"a": 1, "b": 1, "c": 1}, 29500).hosts}
    assert env["a"]["CUDA_VISIBLE_DEVICES"] == "0,2"  # the host's own gpus, not [defaults].env
    assert env["b"]["CUDA_VISIBLE_DEVICES"] == "1"
    assert env["c"]["CUDA_VISIBLE_DEVICES"] == "1" and "CUDA_DEVICE_ORDER" not in env["c"]


# --- planning ---------------------------------------------------------------------------------

A = Host(name="a", address="198.18.0.1", gpus=(0, 2))
B = Host(name="b", address="198.18.0.2", gpus=(3, 1))
PLAIN = Host(name="p", address="198.18.0.3")


def make_job(hosts: tuple[Host, ...] = (A, B), nproc: int | str = "gpu", env: dict[str, str] | None = None,
             source: Path | None = None) -> Job:
    return Job(name="t", inventory=Inventory(hosts=hosts), hosts=hosts, script="train.py",
               nproc_per_node=nproc,  # type: ignore[arg-type]
               rendezvous=Rendezvous(master_port=29500), env=env or {}, source=source,
               base_dir=Path("/jobs"))


def facts(name: str, gpus: int, cpus: int = 32) -> HostFacts:
    return HostFacts(name, Facts(cpu_count=cpus, gpu_count=gpus))


def test_the_plan_sets_cuda_visible_devices_per_host_in_pci_order() -> None:
    a, b, p = build_plan(make_job((A, B, PLAIN), nproc=2), "t-1", {"a": 2, "b": 2, "p": 2}, 29500).hosts
    assert (a.env["CUDA_VISIBLE_DEVICES"], a.env["CUDA_DEVICE_ORDER"]) == ("0,2", "PCI_BUS_ID")
    assert b.env["CUDA_VISIBLE_DEVICES"] == "3,1"  # the order given: local rank 0 gets GPU 3
    assert "CUDA_VISIBLE_DEVICES" not in p.env and "CUDA_DEVICE_ORDER" not in p.env
    assert a.env["DDPCTL_JOB_ID"] == "t-1"


def test_an_explicit_device_order_is_kept() -> None:
    (a,) = build_plan(make_job((A,), nproc=2, env={"CUDA_DEVICE_ORDER": "FASTEST_FIRST"}), "t-1",
                      {"a": 2}, 29500).hosts
    assert (a.env["CUDA_VISIBLE_DEVICES"], a.env["CUDA_DEVICE_ORDER"]) == ("0,2", "FASTEST_FIRST")


def test_gpu_and_auto_resolve_to_the_selections_length_whatever_the_host_has() -> None:
    f = {"a": facts("a", gpus=8), "b": facts("b", gpus=4), "p": facts("p", gpus=2)}
    assert resolve_nprocs(make_job(nproc="gpu"), f) == {"a": 2, "b": 2}
    assert resolve_nprocs(make_job(nproc="auto"), f) == {"a": 2, "b": 2}
    assert resolve_nprocs(make_job((A, PLAIN), nproc="gpu"), f) == {"a": 2, "p": 2}
    assert resolve_nprocs(make_job(nproc="cpu"), f) == {"a": 32, "b": 32}
    assert resolve_nprocs(make_job(nproc=3), f) == {"a": 3, "b": 3}


def test_selections_of_unequal_length_are_unequal_gpu_counts() -> None:
    one = Host(name="b", address="198.18.0.2", gpus=(5,))
    with pytest.raises(ConfigError, match=r"unequal GPU counts \(a=2, b=1\)"):
        resolve_nprocs(make_job((A, one)), {"a": facts("a", 8), "b": facts("b", 8)})


def test_a_dry_run_needs_no_host_where_the_inventory_gives_every_hosts_gpus() -> None:
    assert static_nprocs(make_job(nproc="gpu")) == {"a": 2, "b": 2}
    assert static_nprocs(make_job(nproc="auto")) == {"a": 2, "b": 2}
    assert static_nprocs(make_job((A, PLAIN), nproc="gpu")) is None  # p's GPUs: only the host knows
    assert static_nprocs(make_job(nproc="cpu")) is None
    assert static_nprocs(make_job((A, PLAIN), nproc=4)) == {"a": 4, "p": 4}


def test_the_launch_reads_nvidia_smi_only_where_a_host_selects_gpus() -> None:
    assert "gpus" in launch_facts(make_job((A, PLAIN)), checks=True)
    assert launch_facts(make_job((PLAIN,)), checks=True) == LAUNCH_FACTS + NET_FACTS + CHECK_FACTS
    assert launch_facts(make_job((A,)), checks=False) == LAUNCH_FACTS


# --- an explicit CUDA_VISIBLE_DEVICES in the job ----------------------------------------------

JOB = 'inventory = "hosts.toml"\n[job]\nscript = "train.py"\nnproc_per_node = "gpu"\n'


def job_dir(tmp_path: Path, env: str = "") -> Path:
    write(tmp_path, '[[hosts]]\nname = "n0"\naddress = "198.18.7.1"\ngpus = [0, 2]\n'
                    '[[hosts]]\nname = "n1"\naddress = "198.18.7.2"\n')
    (tmp_path / "train.py").write_text("")
    job = tmp_path / "job.toml"
    job.write_text(JOB + "[rendezvous]\nmaster_port = 29555\n" + env)
    return job


def test_a_job_env_naming_other_gpus_is_an_error_at_its_key(tmp_path: Path) -> None:
    path = job_dir(tmp_path, '[env]\nNCCL_DEBUG = "INFO"\nCUDA_VISIBLE_DEVICES = "1"\n')
    with pytest.raises(ConfigError) as info:
        check_job_env(load_job(path))
    err = info.value
    assert (err.file, err.key, err.line) == (path, "env.CUDA_VISIBLE_DEVICES", line_of(path, "CUDA_VISIBLE"))
    assert "n0 (gpus = [0, 2])" in err.message and "n1" not in err.message
    assert err.hint is not None and "drop CUDA_VISIBLE_DEVICES" in err.hint


def test_a_dash_e_naming_other_gpus_names_the_flag(tmp_path: Path) -> None:
    job = load_job(job_dir(tmp_path, '[env]\nCUDA_VISIBLE_DEVICES = "0,2"\n'),
                   JobOverrides(env=(("CUDA_VISIBLE_DEVICES", "1"),)))
    with pytest.raises(ConfigError) as info:
        check_job_env(job)
    assert info.value.key == "--env" and info.value.line is None


def test_a_job_env_naming_the_selected_gpus_is_accepted(tmp_path: Path) -> None:
    check_job_env(load_job(job_dir(tmp_path, '[env]\nCUDA_VISIBLE_DEVICES = "0, 2"\n')))
    check_job_env(load_job(job_dir(tmp_path)))


# --- the dry run ------------------------------------------------------------------------------


def command_lines(output: str) -> list[list[str]]:
    return [shlex.split(line.split("command: ", 1)[1]) for line in output.splitlines() if "command: " in line]


def test_the_dry_run_shows_each_hosts_selection_and_resolves_gpu_without_the_hosts(tmp_path: Path) -> None:
    write(tmp_path, '[[hosts]]\nname = "n0"\naddress = "198.18.7.1"\ngpus = [0, 2]\n'
                    '[[hosts]]\nname = "n1"\naddress = "198.18.7.2"\ngpus = [1, 3]\n')
    (tmp_path / "train.py").write_text("")
    job = tmp_path / "job.toml"
    job.write_text(JOB + "[rendezvous]\nmaster_port = 29555\n")
    out = runner.invoke(app, ["up", str(job), "--dry-run", "--connect-timeout", "1"])
    assert out.exit_code == 0, out.output
    assert "n0 (node_rank 0, nproc 2 (gpu: its GPUs), ssh 198.18.7.1, cwd" in out.output
    assert "gpus = [0, 2])" in out.output
    assert "gpus = [1, 3])" in out.output
    n0, n1 = out.output.split("\nn1 (")
    assert "env: CUDA_VISIBLE_DEVICES=0,2" in n0 and "env: CUDA_VISIBLE_DEVICES=1,3" in n1
    assert "env: CUDA_DEVICE_ORDER=PCI_BUS_ID" in n1
    assert "world size 4" in out.output
    for argv in command_lines(out.output):
        assert argv[argv.index("--nproc-per-node") + 1] == "2"


def test_the_dry_run_refuses_a_job_env_against_a_selection_exit_2(tmp_path: Path) -> None:
    out = runner.invoke(app, ["up", str(job_dir(tmp_path)), "--dry-run", "-e", "CUDA_VISIBLE_DEVICES=1"])
    assert out.exit_code == 2
    assert "option --env" in out.output and "contradicts the GPU selection of n0" in out.output
    assert "command:" not in out.output and "Traceback" not in out.output


def test_up_stops_before_launch_on_a_gpu_the_host_does_not_have(tmp_path: Path) -> None:
    write(tmp_path, f'[[hosts]]\nname = "here"\naddress = "127.0.0.1"\npython = "{sys.executable}"\n'
                    "gpus = [1023]\n")
    (tmp_path / "train.py").write_text("raise SystemExit('must not run')\n")
    job = tmp_path / "job.toml"
    job.write_text('inventory = "hosts.toml"\n[job]\nscript = "train.py"\nnproc_per_node = 1\n'
                   "[rendezvous]\nmaster_port = \"auto\"\n")
    out = runner.invoke(app, ["up", str(job), "--runs-dir", str(tmp_path / "runs")])
    assert out.exit_code == 1, out.output
    assert "no rank was started" in out.output
    assert "gpus = [1023] selects GPU 1023" in out.output and "here" in out.output
    assert "must not run" not in out.output
