"""Bounded state: which run directories go (the newest N runs kept, a restarted run's attempts as
one, never a run that may still run, never a directory ddpctl did not write), on a host's state
root and in runs/ here; keep_runs in the inventory; the rank files removed once the node's log
holds their lines; `ddpctl prune` through typer's CliRunner."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from inventory import ConfigError, load_inventory
from inventory.model import DEFAULT_KEEP_RUNS
from node_agent.ops import facts
from node_agent.ops.prune import prune_runs
from node_agent.ops.prunerule import RunDir, doomed
from node_agent.runtime import ranklogs
from orchestrator.cli import app
from orchestrator.hostops import prune as hostprune
from orchestrator.hostops.runrecord import RunRecord, write_record

NOW = 1_000_000.0


def names(dirs: list[RunDir]) -> list[str]:
    return [d.name for d in dirs]


@pytest.mark.parametrize(("dirs", "keep", "protect", "gone"), [
    ([RunDir("a", "a", 1, False), RunDir("b", "b", 3, False), RunDir("c", "c", 2, False)], 1, (), ["a", "c"]),
    ([RunDir("a", "a", 1, False), RunDir("b", "b", 3, False)], 2, (), []),
    ([RunDir("a", "a", 1, False), RunDir("b", "b", 3, False)], 0, (), ["a", "b"]),
    # a restarted run's attempts are one run, as old as its newest attempt
    ([RunDir("r.0", "r", 1, False), RunDir("r.1", "r", 5, False), RunDir("x", "x", 4, False)], 1, (), ["x"]),
    ([RunDir("r.0", "r", 1, False), RunDir("r.1", "r", 2, False), RunDir("x", "x", 4, False)], 1, (),
     ["r.0", "r.1"]),
    # never a run that may still run (one attempt running keeps them all), nor one protected
    ([RunDir("old", "old", 1, True), RunDir("new", "new", 9, False)], 0, (), ["new"]),
    ([RunDir("r.0", "r", 1, False), RunDir("r.1", "r", 2, True)], 0, (), []),
    ([RunDir("a", "a", 1, False), RunDir("b", "b", 2, False)], 0, ("a",), ["b"]),
])
def test_the_rule_keeps_the_newest_runs_and_every_live_one(dirs: list[RunDir], keep: int, protect: tuple[str, ...],
                                                            gone: list[str]) -> None:
    assert names(doomed(dirs, keep, protect)) == gone


# -- a host's state root ---------------------------------------------------------------------------

@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DDPCTL_STATE_ROOT", str(tmp_path / "state"))
    return tmp_path / "state" / "runs"


def node_run(runs: Path, job_id: str, age_s: float, *, node: int = 0, run_id: str | None = None,
             hostname: str | None = None, status: str = "exited", supervisor_pid: int = 0,
             output: bytes = b"line\n") -> Path:
    """A node's run state as a supervisor leaves it, last written `age_s` ago."""
    node_dir = runs / job_id / f"node{node}"
    node_dir.mkdir(parents=True)
    (node_dir / "state.json").write_text(json.dumps({
        "job_id": job_id, "run_id": run_id, "node_rank": node, "hostname": hostname or socket.gethostname(),
        "status": status, "pid": 0, "supervisor_pid": supervisor_pid}))
    (node_dir / "output.log").write_bytes(output)
    when = time.time() - age_s
    for path in (node_dir / "state.json", node_dir / "output.log", node_dir, node_dir.parent):
        os.utime(path, (when, when))
    return node_dir.parent


def left(runs: Path) -> list[str]:
    return sorted(p.name for p in runs.iterdir())


def test_a_host_keeps_its_newest_runs_and_says_what_it_removed(root: Path) -> None:
    for i, name in enumerate(["job one-0", "job two-1", "job three-2", "four-3"]):  # names with spaces
        node_run(root, name, 400 - i * 100, output=b"x" * 1000)
    dry = prune_runs(2, dry_run=True)
    assert [r.name for r in dry.removed] == ["job one-0", "job two-1"] and dry.dry_run
    assert left(root) == ["four-3", "job one-0", "job three-2", "job two-1"]  # a dry run removes nothing
    report = prune_runs(2)
    assert [r.name for r in report.removed] == ["job one-0", "job two-1"]
    assert all(r.bytes >= 1000 for r in report.removed) and report.removed[0].age_s >= 399
    assert report.kept == 2 and not report.errors
    assert left(root) == ["four-3", "job three-2"]


def test_a_restarted_runs_attempts_go_together(root: Path) -> None:
    node_run(root, "r-1.0", 500, run_id="r-1")
    node_run(root, "r-1.1", 50, run_id="r-1")
    node_run(root, "solo", 100)
    assert [r.name for r in prune_runs(1).removed] == ["solo"]  # r-1's newest attempt is the newest run
    assert left(root) == ["r-1.0", "r-1.1"]


def test_never_a_run_that_may_still_run(root: Path) -> None:
    node_run(root, "supervised", 900, status="running", supervisor_pid=os.getpid())
    node_run(root, "elsewhere", 800, hostname="another-host", status="running")  # a shared home's other host
    node_run(root, "dead", 700, status="running", supervisor_pid=2**22 + 1)  # its supervisor crashed
    node_run(root, "straggler", 600)
    env = dict(os.environ, DDPCTL_JOB_ID="straggler")  # a process still carrying the job's id
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    try:
        deadline = time.monotonic() + 10  # its environment is readable once it has started
        while b"DDPCTL_JOB_ID=straggler" not in Path(f"/proc/{proc.pid}/environ").read_bytes():
            assert time.monotonic() < deadline, "the process never showed its environment"
        report = prune_runs(0, protect=["protected"])
    finally:
        proc.kill()
        proc.wait()
    assert [r.name for r in report.removed] == ["dead"]
    assert set(report.running) == {"supervised", "elsewhere", "straggler"}


def test_a_protected_run_stays(root: Path) -> None:
    node_run(root, "run-7.0", 900, run_id="run-7")
    assert not prune_runs(0, protect=["run-7"]).removed


def test_never_a_directory_ddpctl_did_not_write(root: Path, tmp_path: Path) -> None:
    node_run(root, "ours", 900)
    (root / "notes").mkdir()  # somebody's own folder
    (root / "notes" / "todo.txt").write_text("keep me")
    (root / "a file").write_text("keep me")
    extra = node_run(root, "with extra", 900)
    (extra / "mine.txt").write_text("not ddpctl's")
    other = node_run(root, "renamed", 900)
    (other / "node0" / "state.json").write_text(json.dumps({"job_id": "another id", "hostname": "x"}))
    outside = tmp_path / "outside"
    node_run(outside, "linked", 900)
    (root / "linked").symlink_to(outside / "linked")  # a link: neither it nor what it points at
    report = prune_runs(0)
    assert [r.name for r in report.removed] == ["ours"]
    assert report.foreign == 5
    assert left(root) == ["a file", "linked", "notes", "renamed", "with extra"]
    assert (outside / "linked" / "node0" / "state.json").is_file()


def test_a_launch_prunes_in_the_facts_round_trip_and_doctor_never_does(root: Path) -> None:
    node_run(root, "old", 900)
    doctor_set, _ = facts.sub_facts({})
    assert "prune" not in doctor_set
    launch_set, _ = facts.sub_facts({"select": ["cpu_count", "prune"]})
    assert "prune" not in launch_set  # selected, but the request asks for no pruning
    asked = {"select": ["cpu_count", "prune"], "prune": {"keep": 0, "protect": [], "dry_run": False}}
    result = facts.collect(asked, time.monotonic())
    assert [r["name"] for r in result["facts"]["prune"]["removed"]] == ["old"]


def test_a_bad_keep_is_the_agents_error() -> None:
    with pytest.raises(ValueError, match="keep must be a whole number"):
        facts.fact_prune({"prune": {"keep": -1}})


# -- this machine's runs/ --------------------------------------------------------------------------

def here_run(runs: Path, name: str, age_s: float, *, record: RunRecord | None = None, summary: bool = True,
             detached: dict[str, object] | None = None) -> Path:
    path = runs / name
    path.mkdir(parents=True)
    (path / "node0.log").write_text("line\n")
    if summary:
        (path / "summary.json").write_text("{}")
    if record is not None:
        write_record(runs, record)
    if detached is not None:
        (path / "detached.json").write_text(json.dumps(detached))
    when = time.time() - age_s
    for p in [*path.iterdir(), path]:
        os.utime(p, (when, when))
    return path


def record(name: str, *, up_pid: int = 0, started: float = 0.0, detached: bool = False,
           hosts: tuple[str, ...] = ("node0", "node1")) -> RunRecord:
    return RunRecord(name, "job", hosts, None, up_pid=up_pid, started=started, detached=detached)


def test_here_the_newest_runs_stay_ordered_by_the_records_start(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    here_run(runs, "a", 10, record=record("a", started=time.time() - 3000))  # written lately, started first
    here_run(runs, "b", 2000, record=record("b", started=time.time() - 2000))
    here_run(runs, "c", 1000)  # no record: its mtime
    (runs / "user stuff").mkdir()
    report = hostprune.prune_here(runs, 2)
    assert [r.name for r in report.removed] == ["a"] and report.foreign == 1
    assert left(runs) == ["b", "c", "user stuff"]


def test_here_never_a_run_whose_up_lives_nor_a_detached_run_that_may_run(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    here_run(runs, "attached", 900, record=record("attached", up_pid=os.getpid(), started=time.time()), summary=False)
    here_run(runs, "reused pid", 900, record=record("reused pid", up_pid=os.getpid(), started=time.time() - 10**6))
    here_run(runs, "detached", 800, record=record("detached", detached=True), summary=False)
    here_run(runs, "old detached", 700, summary=False, detached={"job_id": "old detached", "started": {"node0": 1}})
    here_run(runs, "unrecorded", 600, summary=False)  # an older ddpctl's up may still write it
    asked_none = hostprune.prune_here(runs, 0, None, dry_run=True)
    assert [r.name for r in asked_none.removed] == ["reused pid"]
    asked = {"node0": frozenset({"detached"}), "node1": frozenset()}
    assert [r.name for r in hostprune.prune_here(runs, 0, asked, dry_run=True).removed] == [
        "reused pid", "old detached"]
    ended = {"node0": frozenset(), "node1": frozenset()}
    assert [r.name for r in hostprune.prune_here(runs, 0, ended).removed] == [
        "reused pid", "detached", "old detached"]
    assert left(runs) == ["attached", "unrecorded"]
    assert hostprune.live_here(runs) == ["attached"]


def test_the_summary_is_one_line_per_host() -> None:
    from node_agent.wire.replies_jobs import PrunedRun, PruneReport

    report = PruneReport("/x", (PrunedRun("a", 100_000_000, 1), PrunedRun("b", 20_000_000, 1),
                                PrunedRun("c", 0, 1)), 5, ())
    assert hostprune.summary("node1", report) == "pruned 3 old runs on node1 (120 MB)"
    assert hostprune.summary("node1", PruneReport("/x", (), 5, ())) is None
    dry = PruneReport("runs", (PrunedRun("a", 1500, 1),), 5, (), dry_run=True)
    assert hostprune.summary(hostprune.HERE, dry) == "would prune 1 old run here in runs (1.5 kB)"


# -- keep_runs in the inventory --------------------------------------------------------------------

def test_keep_runs_is_a_positive_whole_number_in_defaults(tmp_path: Path) -> None:
    path = tmp_path / "hosts.toml"
    path.write_text('[[hosts]]\nname = "n0"\n')
    assert load_inventory(path).keep_runs == DEFAULT_KEEP_RUNS
    path.write_text('[defaults]\nkeep_runs = 3\n[[hosts]]\nname = "n0"\n')
    assert load_inventory(path).keep_runs == 3
    for bad, message in (("0", "0 is out of range"), ('"3"', "expected an integer")):
        path.write_text(f'[defaults]\nkeep_runs = {bad}\n[[hosts]]\nname = "n0"\n')
        with pytest.raises(ConfigError, match=message) as err:
            load_inventory(path)
        assert err.value.key == "defaults.keep_runs" and err.value.line == 2
    path.write_text('[[hosts]]\nname = "n0"\nkeep_runs = 3\n')
    with pytest.raises(ConfigError, match="keep_runs"):
        load_inventory(path)  # the inventory's, not a host's


# -- the output kept once --------------------------------------------------------------------------

def test_rank_files_go_once_the_log_holds_their_lines_and_error_files_stay(tmp_path: Path) -> None:
    rank = tmp_path / "job_x" / "attempt_0" / "0"
    rank.mkdir(parents=True)
    (rank / "stdout.log").write_bytes(b"a\nb")
    (rank / "stderr.log").write_bytes(b"Traceback\n")
    (rank / "error.json").write_text("{}")
    out: list[bytes] = []
    logs = ranklogs.RankLogs(str(tmp_path), out.append)
    logs.poll()
    assert logs.discard() == 0  # not read to the end after torchrun's exit: nothing goes
    logs.poll(final=True)
    assert logs.discard() == 13
    logs.close()
    assert sorted(b"".join(out).splitlines()) == [b"[default0]:Traceback", b"[default0]:a", b"[default0]:b"]
    assert sorted(p.name for p in rank.iterdir()) == ["error.json"]


# -- ddpctl prune ----------------------------------------------------------------------------------

def test_prune_command_prunes_this_machine_as_a_host_and_here(root: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for i in range(3):
        node_run(root, f"job-{i}", 300 - i * 100)
        here_run(tmp_path / "runs", f"job-{i}", 300 - i * 100)
    runner = CliRunner()
    dry = runner.invoke(app, ["prune", "--keep", "1", "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert "would prune 2 old runs on localhost" in dry.output and "job-0, job-1" in dry.output
    assert "would prune 2 old runs here in runs" in dry.output
    assert len(left(root)) == 3
    done = runner.invoke(app, ["prune", "--keep", "1", "--json"])
    assert done.exit_code == 0, done.output
    data = json.loads(done.output)
    assert [r["name"] for r in data["hosts"]["localhost"]["removed"]] == ["job-0", "job-1"]
    assert left(root) == ["job-2"] and left(tmp_path / "runs") == ["job-2"]
    again = runner.invoke(app, ["prune", "--keep", "1"])
    assert "localhost: nothing to prune (1 run(s), keeping 1)" in again.output


def test_prune_command_names_a_bad_argument(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["prune", "some-job-id"])
    assert result.exit_code == 2 and "some-job-id is not a job file" in result.output
    assert "Traceback" not in result.output
