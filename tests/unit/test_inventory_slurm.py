"""The job file's [slurm] table: what it selects, what it means, and located errors for bad values."""

from __future__ import annotations

from pathlib import Path

import pytest

from inventory import ConfigError, JobOverrides, load_job
from inventory.specs import SlurmSpec, time_seconds

HEAD = '[job]\nscript = "train.py"\n'


def job_file(tmp_path: Path, text: str) -> Path:
    (tmp_path / "train.py").write_text("")
    path = tmp_path / "job.toml"
    path.write_text(HEAD + text)
    return path


def test_a_slurm_table_selects_slurm_and_backend_overrides_it(tmp_path: Path) -> None:
    path = job_file(tmp_path, '[slurm]\nnodes = 3\npartition = "gpu"\nsignal = "sigusr2@300"\n')
    job = load_job(path)
    assert job.backend == "slurm" and job.slurm == SlurmSpec(nodes=3, partition="gpu", signal="USR2@300")
    assert job.slurm.signal_name == "USR2" and job.slurm.signal_lead_s == 300
    assert load_job(path, JobOverrides(backend="ssh")).slurm is None
    plain = job_file(tmp_path, "")
    assert load_job(plain).backend == "ssh"
    assert load_job(plain, JobOverrides(backend="slurm")).slurm == SlurmSpec()


def test_lists_and_defaults(tmp_path: Path) -> None:
    job = load_job(job_file(tmp_path, '[slurm]\nextra_sbatch = ["#SBATCH --exclusive", " --mail-type=END"]\n'
                                      'setup = ["module load cuda", "echo \\"$HOSTNAME\\""]\nrequeue = true\n'
                                      "time = 90\n"))
    spec = job.slurm
    assert spec is not None
    assert spec.extra_sbatch == ("--exclusive", "--mail-type=END")
    assert spec.setup == ("module load cuda", 'echo "$HOSTNAME"')
    assert spec.requeue and spec.signal == "USR1@90" and spec.time == "90" and spec.time_s == 5400
    assert spec.python == "python3" and spec.login is None and spec.nodes == 1


@pytest.mark.parametrize(("text", "seconds"), [
    ("30", 1800), ("5:30", 330), ("01:00:00", 3600), ("2-00", 172800), ("1-02:03", 93780),
    ("1-00:00:10", 86410), ("UNLIMITED", None), ("1:2:3:4", None), ("", None),
])
def test_slurm_time_forms(text: str, seconds: int | None) -> None:
    assert time_seconds(text) == seconds


# (table body, key, message part, hint part)
BAD = [
    ("nodse = 2", "slurm.nodse", 'unknown key "nodse" in [slurm]', 'did you mean "nodes"?'),
    ("nodes = 0", "slurm.nodes", "0 is out of range", None),
    ('nodes = "2"', "slurm.nodes", "expected an integer", "nodes = 2"),
    ('partition = "gpu debug"', "slurm.partition", "whitespace", None),
    ('time = "soon"', "slurm.time", "is not a Slurm time limit", "HH:MM:SS"),
    ('mem = "lots"', "slurm.mem", "is not a Slurm memory size", "64G"),
    ('extra_sbatch = ["exclusive"]', "slurm.extra_sbatch[0]", "is not an sbatch option", "--exclusive"),
    ('extra_sbatch = ["--a\\n#SBATCH --b"]', "slurm.extra_sbatch[0]", "newline", None),
    ('setup = ["module load a\\nrm -rf /"]', "slurm.setup[0]", "newline", None),
    ('requeue = "yes"', "slurm.requeue", "expected true or false", None),
    ('signal = "KILL@90"', "slurm.signal", "is not a signal and a lead time", "USR1@90"),
    ('signal = "USR1@99999"', "slurm.signal", "is not a signal and a lead time", None),
    ("gpus_per_node = -1", "slurm.gpus_per_node", "out of range", None),
    ('login = "-oProxyCommand=x"', "slurm.login", 'starts with "-"', None),
]


@pytest.mark.parametrize(("body", "key", "message", "hint"), BAD, ids=[b[1] + ":" + b[0][:12] for b in BAD])
def test_bad_slurm_values_are_located(tmp_path: Path, body: str, key: str, message: str, hint: str | None) -> None:
    path = job_file(tmp_path, f"[slurm]\n{body}\n")
    with pytest.raises(ConfigError) as info:
        load_job(path)
    err = info.value
    assert err.key == key and message in err.message and err.file == path
    assert err.line is not None
    if hint is not None:
        assert err.hint is not None and hint in err.hint


def test_master_addr_and_nproc_words_on_slurm(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="master_addr does not apply to a Slurm job") as info:
        load_job(job_file(tmp_path, '[rendezvous]\nmaster_addr = "10.0.0.1"\n[slurm]\nnodes = 2\n'))
    assert info.value.key == "rendezvous.master_addr"
    with pytest.raises(ConfigError, match=r"needs slurm\.gpus_per_node"):
        load_job(job_file(tmp_path, 'nproc_per_node = "gpu"\n[slurm]\nnodes = 2\n'))
    job = load_job(job_file(tmp_path, 'nproc_per_node = "gpu"\n[slurm]\ngpus_per_node = 4\n'))
    assert job.nproc_per_node == "gpu"


def test_the_script_is_checked_here_unless_it_lives_on_the_cluster(tmp_path: Path) -> None:
    path = job_file(tmp_path, "[slurm]\nnodes = 2\n")
    (tmp_path / "train.py").unlink()
    with pytest.raises(ConfigError, match="script not found"):
        load_job(path)
    path.write_text(HEAD + '[slurm]\nlogin = "login.example"\n')
    assert load_job(path).slurm is not None  # from a laptop: the script is on the cluster's filesystem
