"""Collapsing rank stacks: identical stacks group, the odd one out comes first."""

from __future__ import annotations

import pytest

from orchestrator.hostops.stacks import Frame, RankStack, collapse, format_ranges, parse_host, report_text

SITE = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"
ALL_REDUCE = (Frame("all_reduce", SITE, "torch/distributed/distributed_c10d.py", 3252),
              Frame("train", "/work/train.py", "train.py", 42))
SLEEP = (Frame("sleep_forever", "/work/train.py", "train.py", 88),
         Frame("train", "/work/train.py", "train.py", 40))


@pytest.mark.parametrize(("ranks", "expected"), [
    ([0], "0"),
    ([0, 1, 2, 3], "0–3"),
    ([0, 1, 2, 3, 4, 5, 6, 8, 9, 10, 11, 12, 13, 14, 15], "0–6, 8–15"),
    ([5, 1, 3], "1, 3, 5"),
    ([2, 2, 3], "2–3"),
])
def test_format_ranges(ranks: list[int], expected: str) -> None:
    assert format_ranges(ranks) == expected


def test_identical_stacks_collapse_and_the_odd_one_out_is_first() -> None:
    stacks = [RankStack("node0" if r < 8 else "node1", r, r % 8, 100 + r, SLEEP if r == 7 else ALL_REDUCE)
              for r in range(16)]
    groups = collapse(stacks)
    assert [g.label() for g in groups] == ["rank 7 on node0", "ranks 0–6, 8–15"]
    assert groups[0].summary() == "sleep_forever in train.py:88"
    assert groups[1].summary() == "all_reduce in train.py:42"


def test_ranks_without_stacks_are_grouped_by_error() -> None:
    stacks = [RankStack("node0", 0, 0, 1, (), "permission denied"),
              RankStack("node0", 1, 1, 2, (), "permission denied"),
              RankStack("node1", 2, 0, 3, ALL_REDUCE)]
    groups = collapse(stacks)
    assert groups[0].label() == "rank 2 on node1"
    assert groups[1].summary() == "no stack: permission denied"


def test_parse_host_takes_the_main_thread() -> None:
    result = {"ranks": [{"rank": 3, "local_rank": 1, "pid": 77, "threads": [
        {"name": "Thread-1", "frames": [{"name": "wait", "file": "/x/threading.py", "line": 1}]},
        {"name": "MainThread", "frames": [{"name": "train", "file": "/w/train.py",
                                           "short_file": "train.py", "line": 9}]}]}]}
    (stack,) = parse_host("node1", result)
    assert (stack.rank, stack.local_rank, stack.pid) == (3, 1, 77)
    assert stack.frames == (Frame("train", "/w/train.py", "train.py", 9),)


def test_the_rank_wrappers_frames_at_per_host_paths_do_not_split_groups() -> None:
    def rank(rank: int, node: int) -> dict[str, object]:
        frames = [{"name": "train", "file": "/w/train.py", "line": 9},
                  {"name": "<module>", "file": "/w/train.py", "line": 20},
                  {"name": "_run_code", "file": "<frozen runpy>", "line": 88},
                  {"name": "run", "file": f"/home/u/.ddpctl/runs/j/node{node}/rankwrap.py", "line": 120}]
        return {"rank": rank, "local_rank": 0, "pid": 10 + rank, "threads": [{"name": "MainThread", "frames": frames}]}

    stacks = parse_host("node0", {"ranks": [rank(0, 0)]}) + parse_host("node1", {"ranks": [rank(1, 1)]})
    (group,) = collapse(stacks)
    assert [f.name for f in group.frames] == ["train", "<module>"]


def test_report_text_names_files_and_lines() -> None:
    from orchestrator.hostops.stacks import StacksReport

    report = StacksReport("job", collapse([RankStack("n0", 0, 0, 1, ALL_REDUCE)]), {"n1": "py-spy missing"})
    text = "\n".join(report_text(report))
    assert "rank 0 on n0: all_reduce in train.py:42" in text
    assert "train (train.py:42)" in text
    assert "n1: py-spy missing" in text


def test_a_host_without_py_spy_keeps_its_error_and_fix_apart_and_reports_show_both() -> None:
    from orchestrator.hostops.stacks import assemble, groups_text, report_json

    reply = {"ranks": [{"rank": 0, "local_rank": 0, "pid": 5}], "py_spy": None,
             "error": "py-spy is not installed on this host", "fix": "pip install py-spy"}
    report = assemble("job", {"n0": reply, "n1": {"ranks": [], "py_spy": None}}, {"n2": "unreachable"},
                      {"n2": "check the network"})
    assert report.host_errors == {"n0": "py-spy is not installed on this host", "n2": "unreachable"}
    assert report.host_fixes == {"n0": "pip install py-spy", "n2": "check the network"}
    assert report.answered == ("n0", "n1")
    assert groups_text(report) == ["rank 0 on n0: no stack: py-spy is not installed on this host"]
    assert report_text(report)[-2:] == ["n0: py-spy is not installed on this host (fix: pip install py-spy)",
                                        "n2: unreachable (fix: check the network)"]
    assert report_json(report)["host_errors"]["n0"] == "py-spy is not installed on this host (fix: pip install py-spy)"


@pytest.mark.parametrize(("answers", "failed", "absent"), [
    ({"n0": {"ranks": []}, "n1": {"ranks": []}}, {},
     "job job: no host has a rank of it running (checked 2 hosts: n0, n1)"),
    ({"n1": {"ranks": []}}, {"n0": "refused"},
     "job job: no host has a rank of it running (checked 1 of 2 hosts: n1; the others failed)"),
    ({}, {"n0": "refused", "n1": "refused"}, None),  # each failure says so itself
    ({"n0": {"ranks": [{"rank": 0, "pid": 1, "threads": []}]}, "n1": {"ranks": []}}, {}, None),
])
def test_a_job_no_answering_host_runs_is_absent(answers: dict[str, dict[str, object]], failed: dict[str, str],
                                               absent: str | None) -> None:
    from pathlib import Path

    from inventory import Host, Inventory
    from orchestrator.hostops.stacks import assemble, stacks_absent

    inventory = Inventory(hosts=(Host("n0", "198.18.0.10"), Host("n1", "198.18.0.11")), source=Path("hosts.toml"))
    found = stacks_absent(assemble("job", answers, failed), inventory)
    assert (found.message if found else None) == absent
    if found:
        assert found.fix == "check the job id: `ddpctl ps -i hosts.toml` lists running jobs and their ids"
