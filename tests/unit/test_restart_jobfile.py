"""The job file's [restart] table (inventory/restart.py) and the inventory's spare hosts
(`spare = true`): what loads, the located error of each bad value, which hosts a job starts on,
and the restart variables every host's environment carries (orchestrator/launch/plan.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from job_dir import write_job

from inventory import ConfigError, load_job
from inventory.model import RestartSpec
from orchestrator.launch.plan import ATTEMPT_ENV, CHECKPOINT_DIR_ENV, RUN_ID_ENV, build_plan, host_env

JOB = 'inventory = "hosts.toml"\n[job]\nscript = "train.py"\n'

# node0, spare1, node2, spare3, node4: the spares sit between working hosts, spare3 after spare1
SPARES = """\
[[hosts]]
name = "node0"
address = "198.18.0.10"

[[hosts]]
name = "spare1"
address = "198.18.0.11"
spare = true

[[hosts]]
name = "node2"
address = "198.18.0.12"

[[hosts]]
name = "spare3"
address = "198.18.0.13"
spare = true

[[hosts]]
name = "node4"
address = "198.18.0.14"
spare = false
"""


def load_error(path: Path) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_job(path)
    return info.value


def line_of(path: Path, text: str) -> int:
    return path.read_text().splitlines().index(text) + 1


# -- [restart] values --------------------------------------------------------------------------------


@pytest.mark.parametrize("extra", ["", "[restart]\n"], ids=["no-table", "empty-table"])
def test_without_restart_values_a_job_is_never_restarted(cluster: Path, extra: str) -> None:
    job = load_job(write_job(cluster, JOB + extra))
    assert job.restart == RestartSpec()
    assert job.restart.max_restarts == 0
    assert job.restart.min_nodes is None and job.restart.host_fault_exit_codes == ()
    assert job.restart.checkpoint_dir is None


def test_a_full_restart_table_loads_every_value(cluster: Path) -> None:
    job = load_job(write_job(cluster, JOB + "[restart]\nmax_restarts = 3\nmin_nodes = 2\n"
                             "host_fault_exit_codes = [75, 101]\ncheckpoint_dir = \"ckpt\"\n"
                             "backoff = 2.5\nmax_backoff = 30\n"))
    assert job.restart == RestartSpec(max_restarts=3, min_nodes=2, host_fault_exit_codes=(75, 101),
                                      checkpoint_dir="ckpt", backoff=2.5, max_backoff=30.0)
    assert isinstance(job.restart.max_backoff, float)
    assert len(job.hosts) == 3


@pytest.mark.parametrize(("body", "backoff", "max_backoff"), [
    ("backoff = 0\n", 0.0, 60.0),
    ("backoff = 120\n", 120.0, 120.0),  # max_backoff's default rises to a longer backoff
    ("max_backoff = 5\n", 5.0, 5.0),  # equal to the default backoff: allowed
], ids=["no-wait", "long-backoff-alone", "max-equal-to-backoff"])
def test_backoff_defaults_follow_each_other(cluster: Path, body: str, backoff: float, max_backoff: float) -> None:
    spec = load_job(write_job(cluster, JOB + "[restart]\n" + body)).restart
    assert (spec.backoff, spec.max_backoff) == (backoff, max_backoff)


def test_min_nodes_equal_to_the_host_count_loads(cluster: Path) -> None:
    assert load_job(write_job(cluster, JOB + "[restart]\nmin_nodes = 3\n")).restart.min_nodes == 3


# (case id, [restart] body, the line blamed, key, message part, hint part (None: not checked))
BAD_RESTART = [
    ("min-nodes-above-the-hosts", "min_nodes = 4", "min_nodes = 4", "restart.min_nodes",
     "min_nodes = 4 but the job runs on 3 host(s)", "use at most 3"),
    ("min-nodes-zero", "min_nodes = 0", "min_nodes = 0", "restart.min_nodes", "0 is out of range", None),
    ("negative-max-restarts", "max_restarts = -1", "max_restarts = -1", "restart.max_restarts",
     "-1 is out of range", "between 0 and 1000"),
    ("quoted-max-restarts", 'max_restarts = "3"', 'max_restarts = "3"', "restart.max_restarts",
     'expected an integer, got string "3"', "max_restarts = 3"),
    ("exit-code-zero", "host_fault_exit_codes = [75, 0]", "host_fault_exit_codes = [75, 0]",
     "restart.host_fault_exit_codes[1]", "0 is out of range", "between 1 and 255"),
    ("exit-code-256", "host_fault_exit_codes = [256]", "host_fault_exit_codes = [256]",
     "restart.host_fault_exit_codes[0]", "256 is out of range", "between 1 and 255"),
    ("exit-codes-not-a-list", "host_fault_exit_codes = 75", "host_fault_exit_codes = 75",
     "restart.host_fault_exit_codes", "expected a list of exit codes, got integer 75", "[75, 101]"),
    ("max-backoff-below-backoff", "backoff = 10\nmax_backoff = 5", "max_backoff = 5", "restart.max_backoff",
     "max_backoff = 5 is below backoff = 10", "doubles up to max_backoff"),
    ("backoff-past-an-hour", "backoff = 3601", "backoff = 3601", "restart.backoff", "3601 is out of range",
     "between 0 and 3600"),
    ("empty-checkpoint-dir", 'checkpoint_dir = ""', 'checkpoint_dir = ""', "restart.checkpoint_dir",
     "must not be empty", None),
    ("unknown-key", "max_restart = 3", "max_restart = 3", "restart.max_restart",
     'unknown key "max_restart" in [restart]', 'did you mean "max_restarts"?'),
]


@pytest.mark.parametrize(("body", "line", "key", "message", "hint"), [c[1:] for c in BAD_RESTART],
                         ids=[c[0] for c in BAD_RESTART])
def test_a_bad_restart_value_is_a_located_error(cluster: Path, body: str, line: str, key: str, message: str,
                                                hint: str | None) -> None:
    path = write_job(cluster, JOB + "[restart]\n" + body + "\n")
    err = load_error(path)
    assert (err.file, err.key, err.line) == (path, key, line_of(path, line))
    assert message in err.message
    if hint is not None:
        assert err.hint is not None and hint in err.hint


def test_a_negative_backoff_is_refused_at_its_key(cluster: Path) -> None:
    path = write_job(cluster, JOB + "[restart]\nbackoff = -1.5\n")
    err = load_error(path)
    assert (err.key, err.line) == ("restart.backoff", line_of(path, "backoff = -1.5"))


def test_restart_that_is_not_a_table_is_an_error(cluster: Path) -> None:
    err = load_error(write_job(cluster, "restart = 3\n" + JOB))
    assert err.key == "restart" and "expected a table" in err.message


def test_min_nodes_counts_the_hosts_the_job_selects(cluster: Path) -> None:
    path = write_job(cluster, JOB + 'hosts = ["node0", "node1"]\n[restart]\nmin_nodes = 3\n')
    err = load_error(path)
    assert err.key == "restart.min_nodes" and "runs on 2 host(s)" in err.message


def test_slurm_restarts_load_and_min_nodes_is_refused_there(cluster: Path) -> None:
    path = write_job(cluster, JOB + "[slurm]\nnodes = 2\n[restart]\nmax_restarts = 2\n")
    assert load_job(path).restart.max_restarts == 2
    path = write_job(cluster, JOB + "[slurm]\nnodes = 2\n[restart]\nmax_restarts = 2\nmin_nodes = 1\n")
    err = load_error(path)
    assert (err.file, err.key, err.line) == (path, "restart.min_nodes", line_of(path, "min_nodes = 1"))
    assert "Slurm" in err.message and "2 other node(s)" in err.message


# -- spare hosts -------------------------------------------------------------------------------------


@pytest.fixture
def spares(tmp_path: Path) -> Path:
    (tmp_path / "hosts.toml").write_text(SPARES, encoding="utf-8")
    (tmp_path / "train.py").write_text("print('hi')\n", encoding="utf-8")
    return tmp_path


def test_spares_wait_outside_the_job_in_inventory_order(spares: Path) -> None:
    job = load_job(write_job(spares, JOB))
    assert [h.name for h in job.hosts] == ["node0", "node2", "node4"]
    assert [h.name for h in job.spares] == ["spare1", "spare3"]
    assert all(h.spare for h in job.spares) and not any(h.spare for h in job.hosts)
    assert [h.name for h in job.inventory.hosts] == ["node0", "spare1", "node2", "spare3", "node4"]


def test_min_nodes_counts_working_hosts_not_spares(spares: Path) -> None:
    err = load_error(write_job(spares, JOB + "[restart]\nmin_nodes = 4\n"))
    assert err.key == "restart.min_nodes" and "runs on 3 host(s)" in err.message


def test_job_hosts_naming_a_spare_runs_on_it(spares: Path) -> None:
    job = load_job(write_job(spares, JOB + 'hosts = ["spare3", "node0"]\n'))
    assert [h.name for h in job.hosts] == ["spare3", "node0"]
    assert [h.name for h in job.spares] == ["spare1"]  # the one it runs on is no longer waiting


def test_an_inventory_of_spares_only_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "hosts.toml").write_text('[[hosts]]\nname = "node[0-1]"\naddress = "198.18.0.[10-11]"\n'
                                         "spare = true\n", encoding="utf-8")
    (tmp_path / "train.py").write_text("", encoding="utf-8")
    path = write_job(tmp_path, JOB)
    err = load_error(path)
    assert (err.file, err.key) == (path, "inventory")
    assert "every host of the inventory is a spare" in err.message
    # naming them runs the job on them
    assert [h.name for h in load_job(write_job(tmp_path, JOB + 'hosts = ["node1"]\n')).hosts] == ["node1"]


def test_spare_in_defaults_is_an_unknown_key(tmp_path: Path) -> None:
    inventory = tmp_path / "hosts.toml"
    inventory.write_text('[defaults]\nspare = true\n\n[[hosts]]\nname = "node0"\naddress = "198.18.0.10"\n',
                         encoding="utf-8")
    (tmp_path / "train.py").write_text("", encoding="utf-8")
    err = load_error(write_job(tmp_path, JOB))
    assert (err.file, err.key, err.line) == (inventory, "defaults.spare", 2)
    assert 'unknown key "spare" in [defaults]' in err.message


def test_spare_must_be_true_or_false(tmp_path: Path) -> None:
    inventory = tmp_path / "hosts.toml"
    inventory.write_text('[[hosts]]\nname = "node0"\naddress = "198.18.0.10"\n\n'
                         '[[hosts]]\nname = "node1"\naddress = "198.18.0.11"\nspare = "yes"\n', encoding="utf-8")
    (tmp_path / "train.py").write_text("", encoding="utf-8")
    err = load_error(write_job(tmp_path, JOB))
    assert (err.file, err.key) == (inventory, "hosts[1].spare")
    assert "expected true or false" in err.message


# -- what every host's environment says about the attempt -------------------------------------------


def test_a_job_without_restarts_runs_attempt_0_of_its_own_run(cluster: Path) -> None:
    job = load_job(write_job(cluster, JOB))
    plan = build_plan(job, "train-1", {h.name: 1 for h in job.hosts}, 29500)
    for hl in plan.hosts:
        assert hl.env[ATTEMPT_ENV] == "0"
        assert hl.env[RUN_ID_ENV] == "train-1" == hl.env["DDPCTL_JOB_ID"]
        assert CHECKPOINT_DIR_ENV not in hl.env


def test_checkpoint_dir_reaches_every_host(cluster: Path) -> None:
    job = load_job(write_job(cluster, JOB + '[restart]\nmax_restarts = 1\ncheckpoint_dir = "/scratch/ckpt"\n'))
    plan = build_plan(job, "train-2", {h.name: 2 for h in job.hosts}, 29500)
    assert [hl.env[CHECKPOINT_DIR_ENV] for hl in plan.hosts] == ["/scratch/ckpt"] * 3
    assert {hl.env[ATTEMPT_ENV] for hl in plan.hosts} == {"0"}


def test_the_jobs_own_restart_variables_win(cluster: Path) -> None:
    """A restarted attempt puts its number and run id in the job's env: host_env keeps them."""
    job = load_job(write_job(cluster, JOB + '[env]\nDDPCTL_ATTEMPT = "2"\nDDPCTL_RUN_ID = "run-x"\n'
                                      'DDPCTL_CHECKPOINT_DIR = "/mine"\n[restart]\ncheckpoint_dir = "ckpt"\n'))
    env = host_env(job, job.hosts[0], "run-x.2")
    assert (env[ATTEMPT_ENV], env[RUN_ID_ENV], env["DDPCTL_JOB_ID"]) == ("2", "run-x", "run-x.2")
    assert env[CHECKPOINT_DIR_ENV] == "/mine"
