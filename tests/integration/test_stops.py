"""Every stop told as what it was, on the real cluster: `ddpctl down` from a second terminal while
`up` is attached is the headline (who, when), with its own exit code; the ranks' errors after it
are its consequences, never a first failure; torchrun's SignalException traceback is not shown;
with restarts, nothing is restarted and the verdict names the stop, not a host."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from orchestrator.launch.outcome import EXIT_STOPPED
from tests.cluster import Cluster
from tests.ddpctl_run import run_ddpctl, ssh_args, wait_for
from tests.integration.test_restarts import NEVER, finish, job_file, no_attempt_left, run_summary, start

pytestmark = pytest.mark.cluster

HEADLINE = re.compile(r"stopped by `ddpctl down` \(by \S+ on \S+ at \d\d:\d\d:\d\d\)")


def down_while_attached(cluster: Cluster, tmp_path: Path, restart: str) -> tuple[int, str, dict[str, object]]:
    job = job_file(tmp_path, cluster, "stop-me", [400, 0.1, 5, -1, NEVER, "raise", "0"], restart=restart)
    proc, runs, out = start(job, tmp_path, cluster)
    wait_for(lambda: "rank 1 step 5" in out.read_text(), 120, "step 5")
    down = run_ddpctl("down", str(job), *ssh_args(cluster))  # a second terminal
    assert down.returncode == 0, down.stdout + down.stderr
    code = finish(proc)
    return code, out.read_text(), run_summary(runs)


def test_down_from_a_second_terminal_is_the_headline_not_a_failure(cluster2: Cluster, tmp_path: Path) -> None:
    code, text, summary = down_while_attached(cluster2, tmp_path, "max_restarts = 0")
    assert code == EXIT_STOPPED, text[-4000:]
    assert "first failure" not in text, text[-4000:]
    assert "SignalException" not in text, text[-4000:]  # torchrun's reaction to the SIGTERM: one line instead
    last, account = text.rstrip().splitlines()[-2:]  # the verdict, then where the time went
    assert HEADLINE.search(last) and f"(exit {EXIT_STOPPED})" in last, last
    assert account == f"ddpctl: {summary['account']['line']}" and summary["account"]["outcome"] == "stopped", account
    assert re.search(r"^" + HEADLINE.pattern + r"$", text, re.MULTILINE), text[-4000:]  # the headline, alone
    assert HEADLINE.fullmatch(str(summary["stopped_by"])) and summary["exit_code"] == EXIT_STOPPED
    assert summary["first_failure"] is None and summary["root_cause"] is None


def test_down_with_restarts_restarts_nothing_and_names_the_stop(cluster2: Cluster, tmp_path: Path) -> None:
    code, text, summary = down_while_attached(cluster2, tmp_path, "max_restarts = 2")
    assert code == EXIT_STOPPED, text[-4000:]
    assert len(summary["attempts"]) == 1  # type: ignore[arg-type]
    reason = str(summary["stopped_because"])
    assert reason.startswith("not restarting: stopped by `ddpctl down`") and HEADLINE.search(reason), reason
    assert not re.search(r"not restarting: node\d", text)  # not the host down reached last
    assert f"stopped (exit {EXIT_STOPPED}) after 1 attempt(s)" in text, text[-4000:]
    wait_for(lambda: no_attempt_left(cluster2, summary, [0, 1]), 30, "no job process left")
