"""The fault model as data (orchestrator/launch/faults.py): how a host's link moves between
connected, silent, re-attached and lost; which lost_after wins (flag, job file, default) and its
floor; the node's own limit; docs/running.md's table generated from the code; [supervise] in a job file."""

from __future__ import annotations

from pathlib import Path

import pytest
from job_dir import write_job
from typer.testing import CliRunner

from inventory import ConfigError, load_job
from inventory.jobfile import MIN_LOST_AFTER_S
from orchestrator.cli import app
from orchestrator.launch import faults
from orchestrator.launch.faults import (
    DEFAULT_LOST_AFTER,
    MIN_LOST_AFTER,
    NODE_FACTOR,
    FaultLimits,
    Link,
    LinkState,
    fault_table,
    fault_table_markdown,
    limits_for,
    link_state_after,
)

RUNNING = Path(__file__).resolve().parents[2] / "docs" / "running.md"
LIMITS = FaultLimits(lost_after=30.0, silent_after=8.0)
C, S, R, L = LinkState.CONNECTED, LinkState.SILENT, LinkState.REATTACHED, LinkState.LOST

# (case id, state the link is in, seconds without contact, state it moves to (None: stays))
TRANSITIONS = [
    ("connected-just-heard-stays", C, 0.0, None),
    ("connected-quiet-below-silent_after-stays", C, 7.99, None),
    ("connected-quiet-silent_after-goes-silent", C, 8.0, S),
    ("connected-quiet-lost_after-is-lost-at-once", C, 30.0, L),
    ("silent-still-quiet-stays-silent", S, 20.0, None),
    ("silent-heard-again-is-connected", S, 1.0, C),
    ("silent-quiet-lost_after-is-lost", S, 30.0, L),
    ("lost-heard-again-stays-lost", L, 0.0, None),
    ("lost-quiet-forever-stays-lost", L, 1e9, None),
    ("reattached-heard-stays", R, 0.0, None),
    ("reattached-quiet-again-goes-silent-again", R, 8.0, S),
    ("reattached-quiet-lost_after-is-lost", R, 30.0, L),
]


@pytest.mark.parametrize(("state", "quiet", "expected"), [c[1:] for c in TRANSITIONS],
                         ids=[c[0] for c in TRANSITIONS])
def test_judge_moves_a_link_by_how_long_it_has_been_quiet(
        state: LinkState, quiet: float, expected: LinkState | None) -> None:
    assert link_state_after(Link("b", state), quiet, LIMITS) is expected


def test_a_link_records_when_it_entered_its_state() -> None:
    link = Link("b")
    link.enter(LinkState.SILENT)
    assert link.state is LinkState.SILENT and link.since > 0


# (case id, job file's lost_after, --lost-after, lost_after chosen)
CHOICES = [
    ("neither-is-the-default-60", None, None, DEFAULT_LOST_AFTER),
    ("job-file-alone", 30.0, None, 30.0),
    ("flag-alone", None, 45.0, 45.0),
    ("flag-wins-over-a-longer-job-file", 30.0, 20.0, 20.0),
    ("flag-wins-over-a-shorter-job-file", 30.0, 45.0, 45.0),
    ("flag-below-the-minimum-is-raised-to-it", 30.0, 5.0, MIN_LOST_AFTER),
    ("job-file-below-the-minimum-is-raised-to-it", 5.0, None, MIN_LOST_AFTER),
]


@pytest.mark.parametrize(("job", "flag", "expected"), [c[1:] for c in CHOICES], ids=[c[0] for c in CHOICES])
def test_limits_for_prefers_the_flag_then_the_job_file_then_the_default(
        job: float | None, flag: float | None, expected: float) -> None:
    assert limits_for(job, flag).lost_after == expected


def test_the_default_lost_after_is_60_s_and_the_minimum_leaves_room_for_one_retry() -> None:
    assert DEFAULT_LOST_AFTER == 60.0
    assert MIN_LOST_AFTER == faults.SILENT_AFTER + faults.RETRY_EVERY == 10.0


@pytest.mark.parametrize(("lost_after", "node_after"), [(60.0, 90.0), (40.0, 60.0), (10.0, 15.0)])
def test_the_node_gives_up_one_and_a_half_times_later_than_the_control_plane(
        lost_after: float, node_after: float) -> None:
    assert NODE_FACTOR == 1.5
    assert FaultLimits(lost_after=lost_after).node_after == node_after
    assert limits_for(None, lost_after).node_after == node_after


def test_the_fault_table_states_the_actual_limits_of_a_non_default_job() -> None:
    rows = fault_table(FaultLimits(lost_after=42.0))
    text = "\n".join(" | ".join(row) for row in rows)
    lost = next(row for row in rows if row[0].startswith("the host is lost:"))
    assert "lost_after = 42 s" in lost[1] and lost[2] == "control plane"
    node = next(row for row in rows if row[0] == "the node ends its own job")
    assert "1.5 x lost_after = 63 s" in node[1] and node[2] == "node"
    assert "60 s" not in text and "90 s" not in text  # nothing left of the defaults


def test_the_default_fault_table_names_every_limit() -> None:
    text = "\n".join(" | ".join(row) for row in fault_table())
    for part in ("every 2 s", "8 s without a line", "lost_after = 60 s", "= 90 s without a heartbeat",
                 "--lost-after", "[supervise] lost_after"):
        assert part in text


def test_the_markdown_table_has_a_header_and_one_line_per_row() -> None:
    lines = fault_table_markdown().splitlines()
    assert lines[:2] == ["| what | when | decided by |", "| --- | --- | --- |"]
    assert lines[2:] == [f"| {what} | {when} | {side} |" for what, when, side in fault_table()]


def test_the_docs_show_the_fault_table_generated_from_the_code() -> None:
    """docs/running.md's fault model is fault_table_markdown(), verbatim: regenerate it when a
    limit changes."""
    assert fault_table_markdown() in RUNNING.read_text(encoding="utf-8")


def test_the_job_files_minimum_lost_after_is_the_fault_models() -> None:
    assert MIN_LOST_AFTER_S == MIN_LOST_AFTER


# -- [supervise] in a job file, and --lost-after --------------------------------------------------

JOB = 'inventory = "hosts.toml"\n[job]\nscript = "train.py"\n'


@pytest.mark.parametrize(("extra", "expected"), [
    ("", None),
    ("[supervise]\n", None),
    ("[supervise]\nlost_after = 30\n", 30.0),
    ("[supervise]\nlost_after = 10\n", 10.0),
], ids=["no-section", "empty-section", "thirty", "the-minimum"])
def test_supervise_lost_after_loads_as_seconds(cluster: Path, extra: str, expected: float | None) -> None:
    job = load_job(write_job(cluster, JOB + extra))
    assert job.lost_after == expected
    assert job.lost_after is None or isinstance(job.lost_after, float)


# (case id, [supervise] text, message part, key, hint part)
BAD_SUPERVISE = [
    ("below-the-minimum", "lost_after = 5\n", "5 is out of range", "supervise.lost_after",
     f"between {MIN_LOST_AFTER_S} and"),
    ("quoted-number", 'lost_after = "60"\n', 'expected an integer, got string "60"', "supervise.lost_after",
     "write it without quotes: lost_after = 60"),
    ("fraction", "lost_after = 30.5\n", "expected an integer, got float 30.5", "supervise.lost_after",
     "whole number"),
    ("unknown-key", "lost_aftr = 30\n", 'unknown key "lost_aftr" in [supervise]', "supervise.lost_aftr",
     'did you mean "lost_after"?'),
]


@pytest.mark.parametrize(("body", "message", "key", "hint"), [c[1:] for c in BAD_SUPERVISE],
                         ids=[c[0] for c in BAD_SUPERVISE])
def test_a_bad_supervise_section_is_a_located_error(cluster: Path, body: str, message: str, key: str,
                                                   hint: str) -> None:
    path = write_job(cluster, JOB + "[supervise]\n" + body)
    with pytest.raises(ConfigError) as info:
        load_job(path)
    err = info.value
    assert message in err.message
    assert (err.file, err.key) == (path, key)
    assert err.line == path.read_text().splitlines().index(body.rstrip("\n")) + 1
    assert err.hint is not None and hint in err.hint


def test_supervise_that_is_not_a_table_is_an_error(cluster: Path) -> None:
    path = write_job(cluster, "supervise = 30\n" + JOB)
    with pytest.raises(ConfigError) as info:
        load_job(path)
    assert info.value.key == "supervise" and "expected a table" in info.value.message


def write_up_job(tmp_path: Path) -> Path:
    (tmp_path / "hosts.toml").write_text('[[hosts]]\nname = "n0"\naddress = "198.18.7.1"\n')
    (tmp_path / "train.py").write_text("")
    return write_job(tmp_path, 'inventory = "hosts.toml"\n[job]\nscript = "train.py"\n'
                               "[rendezvous]\nmaster_port = 29555\n")


@pytest.mark.parametrize(("value", "exit_code"), [("5", 2), ("9.9", 2), ("10", 0), ("30", 0)])
def test_up_refuses_a_lost_after_below_the_minimum(tmp_path: Path, value: str, exit_code: int) -> None:
    out = CliRunner().invoke(app, ["up", str(write_up_job(tmp_path)), "--lost-after", value, "--dry-run"])
    assert out.exit_code == exit_code, out.output
    if exit_code == 2:
        assert "--lost-after" in out.output and "10" in out.output
