"""SIGTERM, grace, SIGKILL on real processes: node_agent.host.terminate and end_job, its job-id user."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator

from node_agent.host.procfs import alive
from node_agent.host.runstate import JobScan, end_job
from node_agent.host.terminate import terminate
from tests.unit.ports_listeners import reap

SLEEPER = "import time; print('ready', flush=True); time.sleep(600)"
STUBBORN = "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN)\n" + SLEEPER
# Obeys SIGTERM, but only after a moment: still alive when terminate() first looks.
SLOW_TO_GO = ("import signal, sys, time\n"
              "signal.signal(signal.SIGTERM, lambda *_: (time.sleep(0.2), sys.exit(0)))\n" + SLEEPER)
# Leads its own group; its child stays in that group and is not named to terminate().
GROUP = ("import subprocess, sys, time\n"
         "kid = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
         "print('ready', kid.pid, flush=True)\n"
         "time.sleep(600)\n")


@contextlib.contextmanager
def running(code: str, env: dict[str, str] | None = None, new_session: bool = False,
            bare: bool = False) -> Iterator[list[int]]:
    """Start python -c code; yields [its pid, *pids it printed after 'ready'], all SIGKILLed at exit.
    `bare`: `env` is its whole environment."""
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            env=dict(env or {}) if bare else {**os.environ, **(env or {})},
                            start_new_session=new_session)
    pids = [proc.pid]
    try:
        assert proc.stdout is not None
        words = proc.stdout.readline().split()
        assert words[:1] == ["ready"], f"{code!r} did not start"
        pids += [int(w) for w in words[1:]]
        yield pids  # an unreaped child is a zombie: alive() already says it is gone
    finally:
        reap(proc, pids[1:])


def test_a_process_that_obeys_sigterm_is_not_killed() -> None:
    with running(SLEEPER) as (pid,):
        done = terminate([pid], grace=10.0)
        assert (done.terminated, done.killed, done.left, done.errors) == ([pid], [], [], [])
        assert "-c" in done.commands[pid]
        assert not alive(pid)


def test_a_process_ignoring_sigterm_gets_sigkill_after_the_grace() -> None:
    with running(STUBBORN) as (pid,):
        done = terminate([pid], grace=0.5)
        assert (done.terminated, done.killed, done.left) == ([pid], [pid], [])
        assert not alive(pid)


def test_a_group_signal_reaches_a_member_not_named() -> None:
    with running(GROUP, new_session=True) as (leader, kid):
        done = terminate([leader], [leader], grace=10.0)
        assert done.terminated == [leader] and done.killed == []
        assert not alive(leader) and not alive(kid), "the group's other member outlived SIGTERM"


def test_without_the_group_an_unnamed_member_is_left_alone() -> None:
    with running(GROUP, new_session=True) as (leader, kid):
        terminate([leader], grace=10.0)
        assert not alive(leader) and alive(kid)


def test_a_member_found_during_the_grace_gets_sigkill() -> None:
    """`members` is asked again while waiting: a process that appears meanwhile (a job's late
    child, found by its job id) is among the survivors and is SIGKILLed too."""
    with running(SLOW_TO_GO) as (first,), running(STUBBORN) as (late,):
        asked = []

        def members() -> list[int]:
            asked.append(1)
            return [first] if len(asked) == 1 else [first, late]

        done = terminate([first], grace=2.0, members=members)
        assert done.killed == [late] and done.terminated == [first, late] and done.left == []
        assert not alive(late)


def test_end_job_ends_every_process_carrying_the_job_id() -> None:
    env = {"DDPCTL_JOB_ID": "end-job-test-1", "DDPCTL_NODE_RANK": "0"}
    with running(GROUP, env, new_session=True) as (leader, kid), running(STUBBORN, env) as (stubborn,), \
            running(SLEEPER, {"DDPCTL_JOB_ID": "another-job"}) as (bystander,):
        outcome = end_job("end-job-test-1", leader, 0.5, node_rank=0)
        assert outcome["terminated"] == sorted([leader, kid, stubborn])
        assert outcome["killed"] == [stubborn] and outcome["left"] == []
        assert set(outcome["commands"]) == {str(leader), str(kid), str(stubborn)}
        assert not any(alive(p) for p in (leader, kid, stubborn))
        assert alive(bystander), "a process of another job was ended"


def test_a_job_scan_matches_the_whole_id_and_this_node_only() -> None:
    """The id is matched whole (not as a prefix of another job's), wherever it sits in the
    environment; a process of another node rank on a shared process table is not this node's; one
    started after the first scan is found by the next."""
    job = "scan-test-1"
    with running(SLEEPER, {"DDPCTL_JOB_ID": job, "DDPCTL_NODE_RANK": "0"}) as (ours,), \
            running(SLEEPER, {"DDPCTL_JOB_ID": job}, bare=True) as (first_var,), \
            running(SLEEPER, {"DDPCTL_JOB_ID": job, "DDPCTL_NODE_RANK": "1"}) as (other_node,), \
            running(SLEEPER, {"DDPCTL_JOB_ID": job + "0", "DDPCTL_NODE_RANK": "0"}) as (other_job,):
        scan = JobScan(job, node_rank=0)
        assert scan() == sorted([ours, first_var])
        assert JobScan(job)() == sorted([ours, first_var, other_node])
        assert JobScan(job + "0", node_rank=0)() == [other_job]
        with running(SLEEPER, {"DDPCTL_JOB_ID": job}) as (late,):
            assert scan() == sorted([ours, first_var, late])
        assert late not in scan(), "a process gone is still listed"
