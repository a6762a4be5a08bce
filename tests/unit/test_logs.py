"""`ddpctl logs`: each line labelled [host:rank] with the time its node wrote it, the hosts' lines
merged by time; the node agent's logs op run on this machine over a fake run state."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from inventory import Host
from node_agent.host.runstate import proc_start_ticks
from orchestrator.cli import app
from orchestrator.errors import HostError
from orchestrator.hostops.jobs import job_logs, merge_logs
from orchestrator.remote.pool import HostPool
from orchestrator.remote.wire import LogLine, decode_log_event

LOCAL = Host(name="node0", address="127.0.0.1", python=sys.executable)


def line(host: str, t: float, text: str, rank: str | None = "0") -> LogLine:
    return LogLine(t, host, rank, text)


# name: (streams as (time, text) per host, expected (host, text) order)
MERGES: dict[str, tuple[list[list[tuple[float, str]]], list[tuple[str, str]]]] = {
    "interleaved by time": ([[(1, "a1"), (3, "a3")], [(2, "b2"), (4, "b4")]],
                            [("h0", "a1"), ("h1", "b2"), ("h0", "a3"), ("h1", "b4")]),
    "ties keep host order": ([[(5, "a"), (5, "a'")], [(5, "b")], [(5, "c")]],
                             [("h0", "a"), ("h0", "a'"), ("h1", "b"), ("h2", "c")]),
    "a host's own order even where its clock steps back": (
        [[(1, "a1"), (9, "a9"), (2, "a2")], [(3, "b3")]],
        [("h0", "a1"), ("h1", "b3"), ("h0", "a9"), ("h0", "a2")]),
    "one host": ([[(2, "x"), (1, "y")]], [("h0", "x"), ("h0", "y")]),
    "an empty host": ([[], [(1, "b")], []], [("h1", "b")]),
    "no hosts": ([], []),
    "one host far ahead": ([[(10, "a10"), (11, "a11")], [(1, "b1"), (2, "b2"), (12, "b12")]],
                           [("h1", "b1"), ("h1", "b2"), ("h0", "a10"), ("h0", "a11"), ("h1", "b12")]),
}


@pytest.mark.parametrize("case", sorted(MERGES))
def test_merge_orders_hosts_by_time_and_keeps_each_hosts_order(case: str) -> None:
    streams, expected = MERGES[case]
    merged = merge_logs([[line(f"h{i}", t, text) for t, text in s] for i, s in enumerate(streams)])
    assert [(m.host, m.text) for m in merged] == expected


def test_merge_reads_each_host_lazily() -> None:
    def stream(host: str, n: int) -> Iterator[LogLine]:
        for i in range(n):
            yield line(host, float(i), f"{host}{i}")

    merged = merge_logs([stream("a", 10**9), stream("b", 10**9)])
    assert [m.text for m in (next(merged), next(merged), next(merged))] == ["a0", "b0", "a1"]


def test_labels_are_ups_labels() -> None:
    assert line("node0", 0, "x", "3").label == "node0:3"
    assert line("node0", 0, "x", "local1").label == "node0:local1"
    assert line("node0", 0, "x", None).label == "node0"


def test_a_log_event_decodes_to_lines_with_time_and_rank() -> None:
    fields = {"times": [[2, 1.5], [1, 2.0]], "labels": [[1, None], [2, "3"]], "text": "start\nstep 1\n"}
    assert decode_log_event("n1", fields) == [LogLine(1.5, "n1", None, "start"), LogLine(1.5, "n1", "3", "step 1"),
                                             LogLine(2.0, "n1", "3", "")]


@pytest.mark.parametrize("fields", [{"times": [[1, 1.0]], "labels": [[2, "0"]], "text": "a\nb"},
                                    {"times": [[1, 1.0]], "text": "a"},
                                    {"times": "x", "labels": [[1, "0"]], "text": "a"}])
def test_a_malformed_log_event_is_the_hosts_error(fields: dict[str, object]) -> None:
    with pytest.raises(HostError, match="malformed log event"):
        decode_log_event("n1", fields)


# -- the node agent's logs op on this machine ---------------------------------------------------

def fake_run(root: Path, job_id: str, chunks: list[bytes], *, times: list[float] | None,
             ranks: dict[int, int], pid: int = 0) -> Path:
    """A node's run state as the supervisor leaves it: output.log written chunk by chunk, output.idx
    (None: an older supervisor's run, without one), the rank wrapper's milestone files."""
    state = root / "runs" / job_id / "node1"
    (state / "ranks").mkdir(parents=True)
    append(state, chunks, times)
    for local, rank in ranks.items():
        (state / "ranks" / f"{local}.started").write_text(json.dumps({"rank": rank, "local_rank": local}))
    (state / "ranks" / "7.started.tmp").write_text("{")  # being written: ignored
    (state / "state.json").write_text(json.dumps({
        "job_id": job_id, "job_name": job_id.split("-")[0], "node_rank": 1, "hostname": socket.gethostname(),
        "pid": pid, "start_ticks": proc_start_ticks(pid) if pid else None, "log": str(state / "output.log"),
        "started_at": time.time()}))
    return state


def append(state: Path, chunks: list[bytes], times: list[float] | None) -> None:
    log = state / "output.log"
    end = log.stat().st_size if log.exists() else 0
    with open(log, "ab") as out:
        for chunk in chunks:
            out.write(chunk)
    if times is not None:
        with open(state / "output.idx", "a") as idx:
            for chunk, t in zip(chunks, times, strict=True):
                end += len(chunk)
                idx.write(f"{end} {t:.3f}\n")


@pytest.fixture
def state_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "state"
    monkeypatch.setenv("DDPCTL_STATE_ROOT", str(root))  # inherited by the local agent
    return root


def collected(job: str, follow: bool = False) -> tuple[list[tuple[float, str, str]], bool]:
    out: list[LogLine] = []
    fan = job_logs(HostPool(), [LOCAL], job, follow, out.extend)
    assert not fan.failed, fan.failed
    return [(m.time, m.label, m.text) for m in out], fan.succeeded["node0"].found


def test_each_line_gets_its_chunks_time_and_its_global_rank(state_root: Path) -> None:
    fake_run(state_root, "j-1", [b"torchrun starting\n[default0]:a", b"lpha\n[default1]:beta\n",
                                 b"[tp3]:gamma\r\n[default0]:\xff\n", b"no newline at the end"],
             times=[10.0, 11.0, 12.5, 13.0], ranks={0: 4, 1: 5})
    lines, found = collected("j")
    assert found
    assert lines == [(10.0, "node0", "torchrun starting"),
                     (11.0, "node0:4", "alpha"),  # written by the time its second chunk was
                     (11.0, "node0:5", "beta"),
                     (12.5, "node0:local3", "gamma"),  # no milestone names local rank 3
                     (12.5, "node0:4", "\ufffd"),
                     (13.0, "node0", "no newline at the end")]


def test_a_run_without_an_index_takes_the_logs_mtime(state_root: Path) -> None:
    state = fake_run(state_root, "old-1", [b"[default0]:one\n[default1]:two\n"], times=None, ranks={0: 0})
    os.utime(state / "output.log", (1000.0, 1234.5))
    assert collected("old-1")[0] == [(1234.5, "node0:0", "one"), (1234.5, "node0:local1", "two")]


def test_lines_past_the_index_take_the_logs_mtime_once_the_job_is_over(state_root: Path) -> None:
    state = fake_run(state_root, "lag-1", [b"[default0]:indexed\n"], times=[5.0], ranks={0: 0})
    with open(state / "output.log", "ab") as out:
        out.write(b"[default0]:not yet indexed\n")
    os.utime(state / "output.log", (1000.0, 2000.0))
    assert collected("lag-1")[0] == [(5.0, "node0:0", "indexed"), (2000.0, "node0:0", "not yet indexed")]


def test_an_unknown_job_is_not_found(state_root: Path) -> None:
    assert collected("nope") == ([], False)


def test_a_long_log_comes_whole_in_order(state_root: Path) -> None:
    chunks = [b"".join(b"[default%d]:line %d of a longer log\n" % (i % 2, i) for i in range(j, j + 1000))
              for j in range(0, 60000, 1000)]  # ~2 MiB: several events
    fake_run(state_root, "long-1", chunks, times=[float(t) for t in range(60)], ranks={0: 0, 1: 1})
    lines, _ = collected("long-1")
    assert [text for _, _, text in lines] == [f"line {i} of a longer log" for i in range(60000)]
    assert [label for _, label, _ in lines[:3]] == ["node0:0", "node0:1", "node0:0"]
    assert lines[-1][0] == 59.0


def test_follow_sends_indexed_lines_as_they_come_and_the_rest_when_the_job_ends(state_root: Path) -> None:
    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        state = fake_run(state_root, "live-1", [b"[default0]:first\n"], times=[1.0], ranks={0: 0}, pid=job.pid)
        got: list[LogLine] = []
        arrived = threading.Condition()

        def sink(batch: list[LogLine]) -> None:
            with arrived:
                got.extend(batch)
                arrived.notify_all()

        def wait_for(n: int) -> list[str]:
            with arrived:
                assert arrived.wait_for(lambda: len(got) >= n, timeout=20), got
                return [m.text for m in got]

        follower = threading.Thread(target=job_logs, args=(HostPool(), [LOCAL], "live-1", True, sink))
        follower.start()
        assert wait_for(1) == ["first"]
        with open(state / "output.log", "ab") as out:  # the pump wrote it; its index entry is not out yet
            out.write(b"[default0]:second\n")
        with arrived:  # three of the op's passes: the unindexed line must not come
            assert not arrived.wait_for(lambda: len(got) > 1, timeout=0.6), got
        assert [m.text for m in got] == ["first"]
        with open(state / "output.idx", "a") as idx:
            idx.write(f"{(state / 'output.log').stat().st_size} 2.000\n")
        assert wait_for(2) == ["first", "second"]
        with open(state / "output.log", "ab") as out:
            out.write(b"[default0]:third, never indexed\n")
        job.kill()
        job.wait()
        follower.join(20)
        assert not follower.is_alive()
        assert [(m.label, m.text) for m in got] == [("node0:0", "first"), ("node0:0", "second"),
                                                    ("node0:0", "third, never indexed")]
        assert got[1].time == 2.0
    finally:
        job.kill()


# -- through the CLI ----------------------------------------------------------------------------

def test_logs_prints_host_and_rank_labels(state_root: Path) -> None:
    fake_run(state_root, "cli-1", [b"torchrun up\n[default0]:epoch=0\n[default1]:epoch=0\n"], times=[1.0],
             ranks={0: 2, 1: 3})
    result = CliRunner().invoke(app, ["logs", "cli-1"])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == ["[localhost] torchrun up", "[localhost:2] epoch=0",
                                          "[localhost:3] epoch=0"]


def test_two_hosts_lines_are_merged_by_time(state_root: Path, tmp_path: Path) -> None:
    # Both "hosts" are this machine: each replays the same log, so every line comes twice, the
    # first host's first (equal times keep the inventory's order)
    fake_run(state_root, "two-1", [b"[default0]:a\n", b"[default0]:b\n"], times=[1.0, 2.0], ranks={0: 0})
    (tmp_path / "hosts.toml").write_text(
        f'[defaults]\npython = "{sys.executable}"\n[[hosts]]\nname = "h0"\naddress = "127.0.0.1"\n'
        '[[hosts]]\nname = "h1"\naddress = "127.0.0.1"\n')
    result = CliRunner().invoke(app, ["logs", "two-1", "-i", str(tmp_path / "hosts.toml")])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == ["[h0:0] a", "[h1:0] a", "[h0:0] b", "[h1:0] b"]
