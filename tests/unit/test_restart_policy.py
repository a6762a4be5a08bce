"""The restart policy as data (orchestrator/restarts/loop.py): how a failed attempt is classified
(host fault, error, deterministic, stopped), which hosts the next attempt runs on (spares, shrinking
to min_nodes), which hosts a failed pre-launch step blames, and runs/<run id>/summary.json."""

from __future__ import annotations

import json
import signal
from collections.abc import Sequence
from pathlib import Path

import pytest

from inventory import Host, Inventory, Job, Rendezvous
from inventory.model import RestartSpec
from orchestrator.checks.model import CheckStatus, Finding
from orchestrator.errors import HostError, HostErrorKind, HostsFailed
from orchestrator.launch.observer import Collected
from orchestrator.launch.options import LaunchOptions
from orchestrator.launch.plan import ATTEMPT_ENV, PREV_FAILURE_ENV, RUN_ID_ENV, host_env
from orchestrator.launch.preflight import ChecksFailed
from orchestrator.launch.result import HostLoss, HostRun, RankFailure, RunResult, RunState
from orchestrator.remote.wire import RankError
from orchestrator.restarts.loop import (
    AttemptRecord,
    Exclusion,
    Failure,
    NoHosts,
    RestartedRun,
    Restarts,
    Verdict,
    _hosts_failed,
    classify,
    restart_env,
)

A, B, C = (Host(n, f"198.18.0.{i + 1}") for i, n in enumerate("abc"))
S1, S2 = Host("s1", "198.18.1.1", spare=True), Host("s2", "198.18.1.2", spare=True)
TRACEBACK = 'Traceback (most recent call last):\n  File "train.py", line 40, in <module>\n    main()\n' \
            '  File "train.py", line 12, in main\n    load()\nFileNotFoundError: data.bin\n'


def make_job(min_nodes: int | None = None, codes: Sequence[int] = (), spares: Sequence[Host] = (S2, S1),
             master_addr: str | None = None) -> Job:
    """a, b, c run; the spares wait, in inventory order (s2 listed before s1), between them."""
    inventory = Inventory((A, *spares[:1], B, C, *spares[1:]))
    return Job("train", inventory, (A, B, C), script="train.py", rendezvous=Rendezvous(master_addr=master_addr),
               restart=RestartSpec(max_restarts=2, min_nodes=min_nodes, host_fault_exit_codes=tuple(codes),
                                   backoff=0.0, max_backoff=0.0))


def run(name: str, rank: int, tail: Sequence[str] = (), state: RunState = RunState.STOPPED,
        exit_code: int | None = None) -> HostRun:
    return HostRun(name, rank, "torchrun", state=state, exit_code=exit_code, tail=list(tail))


def error(message: str = "data.bin", kind: str = "FileNotFoundError", step: int | None = None,
          traceback: str = TRACEBACK, exit_code: int | None = None, host: str = "b") -> RankFailure:
    return RankFailure(host, 1, RankError(0, message, traceback, 100.0, None, rank=2, kind=kind, step=step,
                                          exit_code=exit_code))


def result(root: RankFailure | None = None, tails: dict[str, Sequence[str]] | None = None,
           steps: int | None = None, **fields: object) -> RunResult:
    """a, b, c ran; b failed (exit code 1) first, the others were stopped."""
    tails = tails or {}
    hosts = [run("a", 0, tails.get("a", ())), run("b", 1, tails.get("b", ()), RunState.FAILED, 1),
             run("c", 2, tails.get("c", ()))]
    return RunResult(job_id="train-1.0", run_dir=Path("runs/x"), hosts=hosts, exit_code=1, first_failure=hosts[1],
                     root_cause=root, steps=steps,
                     nprocs={"a": 2, "b": 2, "c": 2}, **fields)  # type: ignore[arg-type]


def record(number: int, verdict: Verdict | None, steps: int | None = None) -> AttemptRecord:
    return AttemptRecord(number, f"train-1.{number}", ["a", "b", "c"], Path(f"runs/x/attempt-{number}"), 1.0, 2.0,
                         1, verdict, steps)


def first_attempt(step: int = 7) -> AttemptRecord:
    """Attempt 0: FileNotFoundError after `step` optimizer steps, classified as a plain error."""
    verdict = classify(result(error(step=step), steps=step), make_job(), 0, [])
    assert verdict.kind is Failure.ERROR
    return record(0, verdict, step)


# -- host faults ---------------------------------------------------------------------------------------


def test_a_lost_host_is_a_host_fault_naming_it() -> None:
    loss = HostLoss("c", "no word from its supervisor for 30s", 1_700_000_000.0)
    verdict = classify(result(error(), loss=loss), make_job(), 0, [])
    assert verdict.kind is Failure.HOST_FAULT
    assert verdict.hosts == ("c",)
    assert verdict.reason.startswith(f"c lost at {loss.when()}") and "no word from its supervisor" in verdict.reason


@pytest.mark.parametrize("line", [
    "[  812.3] NVRM: Xid (PCI:0000:3b:00): 79, pid=4411, GPU has fallen off the bus.",
    "NVRM: Xid 79 on GPU 2",
    "RuntimeError: CUDA error: GPU has fallen off the bus",
    "CUDA error: uncorrectable ECC error encountered",
], ids=["xid-79-dmesg", "xid-79", "fallen-off-the-bus", "ecc"])
def test_a_hardware_error_in_a_hosts_output_blames_that_host(line: str) -> None:
    verdict = classify(result(error(step=9), tails={"c": ["step 9", line, "done"]}, steps=9), make_job(), 0, [])
    assert verdict.kind is Failure.HOST_FAULT
    assert verdict.hosts == ("c",)
    assert "hardware error" in verdict.reason and line.strip()[:60] in verdict.reason


NCCL_SYSTEM_LINE = "torch.distributed.DistBackendError: NCCL error: unhandled system error"


def test_ncclss_unhandled_system_error_blames_its_host_when_no_rank_failed_on_its_own() -> None:
    peer_died = error("Connection closed by peer", kind="DistNetworkError", step=9)
    verdict = classify(result(peer_died, tails={"c": [NCCL_SYSTEM_LINE]}, steps=9), make_job(), 0, [])
    assert verdict.kind is Failure.HOST_FAULT and verdict.hosts == ("c",)
    assert NCCL_SYSTEM_LINE in verdict.reason


def test_ncclss_unhandled_system_error_on_a_survivor_does_not_outrank_a_ranks_own_error() -> None:
    verdict = classify(result(error(step=9), tails={"c": [NCCL_SYSTEM_LINE]}, steps=9), make_job(), 0, [])
    assert verdict.kind is Failure.ERROR and verdict.hosts == ()
    assert verdict.reason == "rank 2 on b: FileNotFoundError: data.bin"


def test_hardware_text_in_the_root_errors_message_blames_its_host() -> None:
    root = error("CUDA error: an illegal memory access (Xid 13)", kind="RuntimeError", host="a")
    verdict = classify(result(root, steps=3), make_job(), 0, [])
    assert (verdict.kind, verdict.hosts) == (Failure.HOST_FAULT, ("a",))


def test_the_first_failed_host_is_named_first() -> None:
    tails = {"a": ["Xid 48"], "b": ["GPU has fallen off the bus"]}
    verdict = classify(result(error(), tails=tails, steps=3), make_job(), 0, [])
    assert verdict.hosts == ("b", "a")  # b is the first failure
    assert verdict.reason.startswith("b: ")


def test_a_rank_killed_by_sigkill_is_a_host_fault() -> None:
    tail = ["[ERROR] failed (exitcode: -9) local_rank: 1 (pid: 77) of binary: python",
            "  exitcode  : -9 (pid: 77)", "  error_file: <N/A>"]
    verdict = classify(result(tails={"b": tail}), make_job(), 0, [])
    assert (verdict.kind, verdict.hosts) == (Failure.HOST_FAULT, ("b",))
    assert "SIGKILL" in verdict.reason


def test_exitcode_minus_nine_is_not_exitcode_nine_nor_ninety() -> None:
    verdict = classify(result(error(step=3), tails={"b": ["  exitcode  : -90 (pid: 77)"]}, steps=3),
                       make_job(), 0, [])
    assert verdict.kind is Failure.ERROR


@pytest.mark.parametrize(("codes", "kind"), [
    ((75,), Failure.HOST_FAULT), ((101, 75), Failure.HOST_FAULT), ((101,), Failure.ERROR), ((), Failure.ERROR),
], ids=["listed", "listed-second", "not-listed", "none-listed"])
def test_a_rank_exiting_with_a_listed_code_is_a_host_fault(codes: tuple[int, ...], kind: Failure) -> None:
    root = error("exit code 75", kind="SystemExit", traceback="", exit_code=75, step=4)
    verdict = classify(result(root, steps=4), make_job(codes=codes), 0, [])
    assert verdict.kind is kind
    if kind is Failure.HOST_FAULT:
        assert verdict.hosts == ("b",) and "75" in verdict.reason and "host_fault_exit_codes" in verdict.reason
    else:
        assert verdict.hosts == () and verdict.reason == "rank 2 on b: SystemExit: exit code 75"


def test_torchruns_exitcode_line_counts_as_a_listed_code() -> None:
    verdict = classify(result(tails={"c": ["  exitcode  : 75 (pid: 9)"]}, steps=2), make_job(codes=(75,)), 0, [])
    assert (verdict.kind, verdict.hosts) == (Failure.HOST_FAULT, ("c",))


def test_a_listed_code_of_another_hosts_root_error_does_not_blame_this_host() -> None:
    root = error("exit code 75", kind="SystemExit", traceback="", exit_code=75, step=4, host="a")
    verdict = classify(result(root, steps=4), make_job(codes=(75,)), 0, [])
    assert verdict.hosts == ("a",)


# -- errors: retried, or deterministic -------------------------------------------------------------------


@pytest.mark.parametrize("steps", [None, 0])
def test_an_error_before_any_progress_on_attempt_0_is_deterministic(steps: int | None) -> None:
    verdict = classify(result(error(step=steps), steps=steps), make_job(), 0, [])
    assert verdict.kind is Failure.DETERMINISTIC
    assert "before any progress" in verdict.reason
    assert "rank 2 on b: FileNotFoundError: data.bin" in verdict.reason


def test_a_new_checkpoint_is_progress_on_attempt_0() -> None:
    verdict = classify(result(error(step=0), steps=0, checkpointed=True), make_job(), 0, [])
    assert verdict.kind is Failure.ERROR


def test_an_error_after_progress_is_retried_with_its_signature() -> None:
    verdict = classify(result(error(step=7), steps=7), make_job(), 0, [])
    assert verdict.kind is Failure.ERROR
    assert verdict.reason == "rank 2 on b: FileNotFoundError: data.bin"
    assert verdict.signature == ("FileNotFoundError", "data.bin", "train.py:12")  # the innermost frame
    assert verdict.step == 7 and verdict.hosts == ()


def test_the_same_error_at_the_same_step_as_the_attempt_before_is_deterministic() -> None:
    verdict = classify(result(error(step=7), steps=7), make_job(), 1, [first_attempt(7)])
    assert verdict.kind is Failure.DETERMINISTIC
    assert "attempt 1 failed exactly as attempt 0" in verdict.reason
    assert "7 optimizer step(s)" in verdict.reason and "no new checkpoint" in verdict.reason
    assert verdict.reason.endswith(": rank 2 on b: FileNotFoundError: data.bin")


def test_only_the_attempt_just_before_counts() -> None:
    older = first_attempt(7)
    other = record(1, classify(result(error("disk full", kind="OSError", step=3), steps=3), make_job(), 0, []), 3)
    verdict = classify(result(error(step=7), steps=7), make_job(), 2, [older, other])
    assert verdict.kind is Failure.ERROR


@pytest.mark.parametrize(("root", "checkpointed"), [
    (error(step=8), False),
    (error(step=7), True),
    (error("data.bin (retry)", step=7), False),
    (error(kind="OSError", step=7), False),
    (error(step=7, traceback=TRACEBACK.replace("line 12", "line 13")), False),
], ids=["further-step", "new-checkpoint", "other-message", "other-type", "raised-elsewhere"])
def test_the_same_error_after_progress_or_a_different_error_is_retried(root: RankFailure,
                                                                      checkpointed: bool) -> None:
    verdict = classify(result(root, steps=root.error.step, checkpointed=checkpointed), make_job(), 1,
                       [first_attempt(7)])
    assert verdict.kind is Failure.ERROR
    assert "exactly as" not in verdict.reason


def test_a_previous_host_fault_never_makes_an_error_deterministic() -> None:
    previous = record(0, Verdict(Failure.HOST_FAULT, "c lost", ("c",)))
    verdict = classify(result(error(step=0), steps=0), make_job(), 1, [previous])
    assert verdict.kind is Failure.ERROR


def test_a_consequence_is_not_blamed_on_the_rank_that_reported_it() -> None:
    """A peer's closed connection without a lost host: the failed host is named, not the rank's
    exception, and the verdict's signature is the job's, not that error's."""
    root = error("Connection closed by peer [198.18.0.1]:29500", kind="DistNetworkError", step=5)
    assert root.consequence
    verdict = classify(result(root, steps=5), make_job(), 0, [])
    assert verdict.kind is Failure.ERROR
    assert verdict.reason == "b failed (exit code 1)"
    assert "DistNetworkError" not in verdict.reason and "rank 2" not in verdict.reason
    assert verdict.signature == ("job", "b failed (exit code 1)")
    assert verdict.hosts == ()


@pytest.mark.parametrize(("fields", "reason"), [
    ({"cause": "rank 3 never joined the rendezvous\n  fix: open port 29500"}, "rank 3 never joined the rendezvous"),
    ({"hung": True}, "the job hung"),
], ids=["watchdog-cause", "hung"])
def test_without_a_rank_error_the_launch_cores_diagnosis_is_the_reason(fields: dict[str, object],
                                                                        reason: str) -> None:
    verdict = classify(result(steps=3, **fields), make_job(), 0, [])
    assert (verdict.kind, verdict.reason) == (Failure.ERROR, reason)


# -- stopped ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("fields", "reason"), [
    ({"signal": int(signal.SIGINT)}, "stopped by the user"),
    ({"signal": int(signal.SIGTERM)}, "stopped by SIGTERM"),
    ({"interrupted": True}, "stopped by the user"),
], ids=["ctrl-c", "sigterm", "interrupted"])
def test_a_stopped_run_is_not_retried(fields: dict[str, object], reason: str) -> None:
    loss = HostLoss("c", "gone", 1.0)  # outranked: the stop came first
    verdict = classify(result(error(step=5), steps=5, loss=loss, **fields), make_job(), 1, [first_attempt(5)])
    assert (verdict.kind, verdict.reason, verdict.hosts) == (Failure.STOPPED, reason, ())


def test_the_schedulers_end_is_not_retried_unless_it_names_a_failed_node() -> None:
    ended = "Slurm job 34 hit its time limit at 22:01:42: TIMEOUT after 00:01:00"
    verdict = classify(result(error(step=5), steps=5, ended_by=ended), make_job(), 1, [first_attempt(5)])
    assert (verdict.kind, verdict.reason, verdict.hosts) == (Failure.STOPPED, ended, ())
    node_fail = HostLoss("c", "Slurm marked node s3 NODE_FAIL", 1.0)  # Slurm ended it because a node failed
    verdict = classify(result(error(step=5), steps=5, ended_by="node fail", loss=node_fail), make_job(), 1,
                       [first_attempt(5)])
    assert (verdict.kind, verdict.hosts) == (Failure.HOST_FAULT, ("c",))


# -- the hosts of the next attempt ---------------------------------------------------------------------


def restarts(job: Job, tmp_path: Path) -> tuple[Restarts, Collected]:
    seen = Collected()
    return Restarts(job, make_backend=lambda j: None, observer=seen,  # type: ignore[arg-type,return-value]
                    options=LaunchOptions(runs_dir=tmp_path), max_restarts=2), seen


def names(hosts: Sequence[Host]) -> list[str]:
    return [h.name for h in hosts]


def test_a_spare_takes_the_place_of_a_faulty_host(tmp_path: Path) -> None:
    r, seen = restarts(make_job(), tmp_path)
    assert (names(r.hosts), names(r.spares)) == (["a", "b", "c"], ["s2", "s1"])
    r.exclude({"b": "b: hardware error in its output: Xid 79"}, 1)  # a verdict's reason names the host first
    assert names(r.hosts) == ["a", "c", "s2"]  # the spare comes last: the others keep their node ranks
    assert names(r.spares) == ["s1"]
    assert r.run.excluded == [Exclusion("b", "hardware error in its output: Xid 79", 1)]
    assert seen.notices == ["leaving b out of attempt 1 on: hardware error in its output: Xid 79",
                            "spare s2 takes a place in the next attempt"]


def test_two_faulty_hosts_take_two_spares_in_inventory_order(tmp_path: Path) -> None:
    r, seen = restarts(make_job(), tmp_path)
    r.exclude({"c": "lost", "a": "killed"}, 1)
    assert names(r.hosts) == ["b", "s2", "s1"] and r.spares == []
    assert [e.host for e in r.run.excluded] == ["c", "a"] and {e.from_attempt for e in r.run.excluded} == {1}
    assert [n for n in seen.notices if n.startswith("spare")] == ["spare s2 takes a place in the next attempt",
                                                                 "spare s1 takes a place in the next attempt"]


def test_a_spare_that_fails_in_turn_gives_way_to_the_next(tmp_path: Path) -> None:
    r, _ = restarts(make_job(), tmp_path)
    r.exclude({"b": "lost"}, 1)
    r.exclude({"s2": "lost"}, 2)
    assert names(r.hosts) == ["a", "c", "s1"]
    assert [(e.host, e.from_attempt) for e in r.run.excluded] == [("b", 1), ("s2", 2)]


def test_a_failing_waiting_spare_is_never_used(tmp_path: Path) -> None:
    r, _ = restarts(make_job(), tmp_path)
    r.exclude({"s2": "failed the pre-launch check [ssh]", "a": "lost"}, 1)
    assert names(r.hosts) == ["b", "c", "s1"]


def test_without_a_spare_the_job_shrinks_to_min_nodes(tmp_path: Path) -> None:
    r, seen = restarts(make_job(min_nodes=2, spares=()), tmp_path)
    r.exclude({"a": "lost"}, 1)
    assert names(r.hosts) == ["b", "c"]
    assert seen.notices[-1] == "no spare left: the job shrinks to 2 host(s) of 3 ([restart] min_nodes = 2)"
    with pytest.raises(NoHosts, match=r"1 host\(s\) left and no spare \(\[restart\] min_nodes = 2 needed"):
        r.exclude({"b": "lost"}, 2)


def test_spares_are_used_before_shrinking(tmp_path: Path) -> None:
    r, seen = restarts(make_job(min_nodes=1, spares=(S1,)), tmp_path)
    r.exclude({"a": "lost", "b": "lost"}, 1)
    assert names(r.hosts) == ["c", "s1"]
    assert "shrinks to 2 host(s) of 3" in seen.notices[-1]


def test_without_a_spare_or_min_nodes_there_are_no_hosts_to_go_on(tmp_path: Path) -> None:
    r, seen = restarts(make_job(spares=()), tmp_path)
    with pytest.raises(NoHosts, match=r"2 host\(s\) left and no spare \(all 3 needed"):
        r.exclude({"c": "lost"}, 1)
    assert seen.notices == ["leaving c out of attempt 1 on: lost"]
    assert r.run.excluded == [Exclusion("c", "lost", 1)]


def test_the_next_attempt_runs_on_the_hosts_left_with_its_own_variables(tmp_path: Path) -> None:
    r, _ = restarts(make_job(master_addr="a"), tmp_path)
    assert r.attempt_job(0, None).rendezvous.master_addr == "a"
    r.exclude({"a": "lost"}, 1)
    job = r.attempt_job(1, "attempt 0 at 12:00:00: a lost\n  while   saving")
    assert names(job.hosts) == ["b", "c", "s2"]
    assert job.rendezvous.master_addr is None and job.master_host.name == "b"  # the master left: the first host
    env = host_env(job, job.hosts[0], f"{r.run_id}.1")
    assert (env[ATTEMPT_ENV], env[RUN_ID_ENV]) == ("1", r.run_id)
    assert env[PREV_FAILURE_ENV] == "attempt 0 at 12:00:00: a lost while saving"
    assert r.job.env == {} and r.run.run_dir == tmp_path / r.run_id


def test_restart_env_keeps_one_line_of_at_most_1000_characters() -> None:
    assert restart_env("run", 0, None) == {ATTEMPT_ENV: "0", RUN_ID_ENV: "run"}
    env = restart_env("run", 3, "x\n" * 900)
    assert env[ATTEMPT_ENV] == "3" and "\n" not in env[PREV_FAILURE_ENV] and len(env[PREV_FAILURE_ENV]) == 1000


def test_a_zero_backoff_does_not_wait_or_say_so(tmp_path: Path) -> None:
    r, seen = restarts(make_job(), tmp_path)
    r.backoff(3)
    assert seen.notices == []


# -- hosts a failed pre-launch step blames -------------------------------------------------------------


def finding(check: str, status: CheckStatus, host: str | None, message: str = "refused") -> Finding:
    return Finding(check, status, host, message)


def test_failed_checks_blame_their_hosts() -> None:
    exc = ChecksFailed([finding("ssh", CheckStatus.FAIL, "b", "connection refused"),
                        finding("gpu", CheckStatus.WARN, "c", "1 GPU busy"),
                        finding("ports", CheckStatus.FAIL, "s2", "29500 is busy"),
                        finding("ssh", CheckStatus.OK, "a"),
                        finding("torch", CheckStatus.FAIL, "b", "no torch")])
    assert _hosts_failed(exc) == {"b": "failed the pre-launch check [ssh]: connection refused",
                                  "s2": "failed the pre-launch check [ports]: 29500 is busy"}


def test_a_failed_check_of_the_whole_cluster_blames_no_host() -> None:
    exc = ChecksFailed([finding("ssh", CheckStatus.FAIL, "b"), finding("versions", CheckStatus.FAIL, None)])
    assert _hosts_failed(exc) == {}


def test_failed_host_steps_blame_their_hosts() -> None:
    one = HostError("b", HostErrorKind.UNREACHABLE, "no route to host")
    two = HostError("c", HostErrorKind.SYNC, "disk full")
    assert _hosts_failed(HostsFailed("sync", [one, two])) == {"b": "sync failed: no route to host",
                                                               "c": "sync failed: disk full"}
    assert _hosts_failed(one) == {"b": "no route to host"}
    assert _hosts_failed(RuntimeError("b")) == {}


# -- summary.json --------------------------------------------------------------------------------------


def test_the_run_summary_lists_attempts_and_exclusions(tmp_path: Path) -> None:
    fault = Verdict(Failure.HOST_FAULT, "b: hardware error in its output: Xid 79", ("b",), step=12)
    done = RestartedRun("train-x", tmp_path / "train-x", 2,
                        attempts=[record(0, fault, 12), record(1, None, 40)],
                        excluded=[Exclusion("b", fault.reason, 1)], exit_code=0)
    path = done.write_summary()
    assert path == tmp_path / "train-x" / "summary.json"
    assert [p.name for p in path.parent.iterdir()] == ["summary.json"]  # the temporary file is gone
    data = json.loads(path.read_text())
    assert (data["run_id"], data["exit_code"], data["max_restarts"], data["restarts"]) == ("train-x", 0, 2, 1)
    assert data["stopped_because"] is None and data["signal"] is None
    assert data["excluded"] == [{"host": "b", "reason": fault.reason, "from_attempt": 1}]
    first, second = data["attempts"]
    assert (first["attempt"], first["steps"], first["run_dir"]) == (0, 12, "runs/x/attempt-0")
    assert first["failure"] == {"class": "host fault", "reason": fault.reason, "hosts": ["b"], "step": 12}
    assert (second["attempt"], second["failure"]) == (1, None)


def test_a_stopped_runs_summary_says_why(tmp_path: Path) -> None:
    r, _ = restarts(make_job(), tmp_path)
    r.run.attempts.append(record(0, Verdict(Failure.DETERMINISTIC, "the first attempt failed"), 0))
    stopped = r.stop("not restarting: the first attempt failed", 70)
    data = json.loads((tmp_path / r.run_id / "summary.json").read_text())
    assert stopped.exit_code == 70 and data["exit_code"] == 70 and data["restarts"] == 0
    assert data["stopped_because"] == "not restarting: the first attempt failed"
    assert data["attempts"][0]["failure"]["class"] == "deterministic"


def test_a_repeated_failure_with_no_rank_error_of_its_own_is_retried_while_the_steps_grow() -> None:
    peer_died = error("Connection closed by peer", kind="DistNetworkError")
    first = classify(result(peer_died, steps=500), make_job(), 0, [])
    assert first.kind is Failure.ERROR
    again = classify(result(peer_died, steps=900), make_job(), 1, [record(0, first, steps=500)])
    assert again.kind is Failure.ERROR
    stuck = classify(result(peer_died, steps=500), make_job(), 1, [record(0, first, steps=500)])
    assert stuck.kind is Failure.DETERMINISTIC and "failed exactly as attempt 0" in stuck.reason


def test_a_peers_death_before_any_step_on_the_first_attempt_is_not_deterministic() -> None:
    peer_died = error("Connection closed by peer", kind="DistNetworkError")
    assert classify(result(peer_died, steps=None), make_job(), 0, []).kind is Failure.ERROR
    assert classify(result(None, steps=None, hung=True), make_job(), 0, []).kind is Failure.ERROR


@pytest.mark.parametrize("code", [-9, 137, 247])
def test_a_hosts_torchrun_killed_by_sigkill_is_a_host_fault(code: int) -> None:
    res = result(error("Connection closed by peer", kind="DistNetworkError", step=9), steps=9)
    res.hosts[2].exit_code = code  # c's torchrun itself was SIGKILLed: no report, only its status
    verdict = classify(res, make_job(), 1, [])
    assert (verdict.kind, verdict.hosts) == (Failure.HOST_FAULT, ("c",))
    assert "killed (SIGKILL" in verdict.reason
