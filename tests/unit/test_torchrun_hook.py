"""node_agent/rank/torchrun.py's record of a rank that a signal ended without an error of its own: what
only torchrun (the rank's parent, which reaps it) or a look at its zombie can tell."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from node_agent.rank.torchrun import STOPPING, record_killed


@pytest.fixture
def ranks(tmp_path: Path) -> Path:
    (tmp_path / "ranks").mkdir()
    return tmp_path / "ranks"


def test_a_sigkill_is_recorded_as_the_ranks_own_end(ranks: Path) -> None:
    record_killed(str(ranks), 1, 4242, signal.SIGKILL, "torchrun")
    data = json.loads((ranks / "1.ended").read_text())
    assert (data["phase"], data["type"], data["local_rank"], data["pid"], data["signal"]) == \
        ("ended", "SIGKILL", 1, 4242, 9)
    assert "out of memory, or killed on the host" in data["message"] and data["by"] == "torchrun"
    assert not list(ranks.glob("*.tmp"))


def test_a_crash_is_recorded_too(ranks: Path) -> None:
    record_killed(str(ranks), 0, 7, signal.SIGSEGV, "supervisor")
    assert json.loads((ranks / "0.ended").read_text())["type"] == "SIGSEGV"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1])
def test_a_stop_request_is_not_a_ranks_own_end(ranks: Path, signum: int) -> None:
    record_killed(str(ranks), 0, 7, signum, "torchrun")
    assert not (ranks / "0.ended").exists()  # whoever sent it stops the job and says so


def test_nothing_is_recorded_once_ddpctl_is_stopping_the_job(ranks: Path) -> None:
    (ranks.parent / STOPPING).touch()
    record_killed(str(ranks), 0, 7, signal.SIGKILL, "torchrun")
    assert not (ranks / "0.ended").exists()


def test_a_rank_with_its_own_error_and_a_second_record_are_left_alone(ranks: Path) -> None:
    (ranks / "0.error").write_text("{}")
    record_killed(str(ranks), 0, 7, signal.SIGKILL, "torchrun")  # fail fast killed it: not news
    assert not (ranks / "0.ended").exists()
    record_killed(str(ranks), 1, 8, signal.SIGKILL, "supervisor")
    record_killed(str(ranks), 1, 8, signal.SIGSEGV, "torchrun")
    assert json.loads((ranks / "1.ended").read_text())["by"] == "supervisor"  # the first word stays
