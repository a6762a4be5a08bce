"""Doctor's `checkpoint` check: [restart] checkpoint_dir writable on every host, and shared or
host-local. The judgement from recorded facts (pure), the node agent's fact on real directories,
and two doctor sessions on this machine (no cluster) that tell a shared directory from two."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from doctor_fixtures import HOSTS, context, doctor_here, observe

from inventory import Host
from node_agent.ops import facts
from node_agent.wire.layout import DOCTOR_MARKER_PREFIX as MARKER_PREFIX
from orchestrator.checks import checkpoint
from orchestrator.checks.gather import checkpoint_markers, facts_request
from orchestrator.checks.model import CheckStatus, DoctorContext, Finding, Observations
from orchestrator.checks.registry import run_checks

FAIL, WARN, INFO, OK, SKIP = (CheckStatus.FAIL, CheckStatus.WARN, CheckStatus.INFO, CheckStatus.OK,
                              CheckStatus.SKIP)
NAMES = [h.name for h in HOSTS]  # node0, node1, node2


def ck(seen: list[str] | None = None, **over: Any) -> dict[str, Any]:
    """One host's checkpoint fact: writable, and (seen) the peers' markers it saw."""
    fact: dict[str, Any] = {"path": "/srv/job/ckpt", "existed": True, "writable": True}
    if seen is not None:
        fact["seen"] = seen
    return {**fact, **over}


def judge(*per_host: dict[str, Any] | None, n: int = 3, errors: dict[int, dict[str, str]] | None = None
          ) -> list[Finding]:
    obs = observe({i: {"checkpoint": f} for i, f in enumerate(per_host) if f is not None}, errors,
                  checkpoint_dir="ckpt")
    if n < 3:
        obs = Observations(replace(obs.ctx, hosts=HOSTS[:n]), {h: obs.facts[h] for h in NAMES[:n]},
                           obs.failed, obs.probes)
    return checkpoint.check(obs)


def by(findings: list[Finding], status: CheckStatus) -> list[Finding]:
    return [f for f in findings if f.status == status]


# -- the judgement (pure) ------------------------------------------------------------------------

def test_without_a_checkpoint_dir_the_check_only_says_it_skipped() -> None:
    findings = checkpoint.check(observe())
    assert [(f.status, f.host) for f in findings] == [(SKIP, None)]
    assert "checkpoint_dir" in findings[0].message


def test_every_host_seeing_every_other_marker_is_shared_by_all() -> None:
    findings = judge(ck(["node1", "node2"]), ck(["node0", "node2"]), ck(["node0", "node1"]))
    assert by(findings, WARN) == by(findings, FAIL) == []
    (shared,) = [f for f in findings if f.host is None]
    assert shared.status == OK and "shared by all 3 hosts" in shared.message
    assert {f.host for f in by(findings, OK)} == {None, *NAMES}


def test_one_sighting_is_enough_for_a_pair_since_the_first_to_look_sees_the_other() -> None:
    # node0 looked first and saw both; the others removed nothing of node0's but looked later,
    # after node0 had removed its marker
    findings = judge(ck(["node1", "node2"]), ck(["node2"]), ck([]))
    (shared,) = [f for f in findings if f.host is None]
    assert shared.status == OK and "all 3 hosts" in shared.message


def test_no_host_seeing_another_is_host_local_with_a_shared_filesystem_fix() -> None:
    findings = judge(ck([]), ck([]), ck([]))
    (local,) = [f for f in findings if f.host is None]
    assert local.status == WARN
    assert "host-local on each host" in local.message and "starts from scratch" in local.message
    assert "filesystem every host mounts" in local.fix
    assert "node0 saw the marker of no other host" in local.evidence


def test_a_directory_shared_by_some_hosts_names_who_shares_it() -> None:
    findings = judge(ck(["node1"]), ck(["node0"]), ck([]))
    (part,) = [f for f in findings if f.host is None]
    assert part.status == WARN
    assert "node0, node1 share it" in part.message and "node2 has its own" in part.message
    assert "filesystem every host mounts" in part.fix


def test_a_host_that_cannot_create_it_fails_naming_host_path_and_os_error() -> None:
    error = "[Errno 20] Not a directory: '/srv/job/file/ckpt'"
    findings = judge(ck(["node2"]), ck(path="/srv/job/file/ckpt", writable=False, step="mkdir", error=error),
                     ck(["node0"]))
    (bad,) = by(findings, FAIL)
    assert bad.host == "node1" and bad.check == "checkpoint"
    assert "cannot create checkpoint_dir /srv/job/file/ckpt on node1" in bad.message and error in bad.message
    assert "mkdir -p /srv/job/file/ckpt" in bad.fix
    (shared,) = [f for f in findings if f.host is None]  # the others still share theirs
    assert shared.status == OK and "the 2 hosts that checked it (of 3)" in shared.message


def test_a_failed_write_and_a_hung_filesystem_are_failures_too() -> None:
    findings = judge(ck([], writable=False, step="write", error="[Errno 28] No space left on device"),
                     ck([], writable=False, step="timeout", error="no answer from the filesystem within 10s"),
                     ck([]))
    write, hung = by(findings, FAIL)
    assert "cannot write a file in checkpoint_dir /srv/job/ckpt on node0" in write.message
    assert "No space left" in write.message
    assert hung.host == "node1" and "did not answer" in hung.message and "hung network mount" in hung.fix
    assert [f.host for f in findings if f.host is None] == []  # one host left: nothing to compare


def test_a_single_host_job_gets_the_writable_check_only() -> None:
    findings = judge(ck(existed=False), n=1)
    assert [(f.status, f.host) for f in findings] == [(OK, "node0")]
    assert "writable (doctor created it)" in findings[0].message


def test_a_host_that_could_not_look_is_reported_not_guessed() -> None:
    findings = judge(ck(["node1"]), ck(["node0"]), ck(None, list_error="its session ended without a result"))
    (unknown,) = by(findings, INFO)
    assert unknown.host == "node2" and "could not tell" in unknown.message
    (shared,) = [f for f in findings if f.host is None]
    assert shared.status == OK and "2 hosts that checked it (of 3)" in shared.message


def test_a_sub_fact_error_or_a_left_marker_is_a_warning() -> None:
    findings = judge(None, ck([], cleanup_error="[Errno 13] Permission denied"), ck([]),
                     errors={0: {"checkpoint": "RuntimeError: boom"}})
    warned = {f.host: f for f in by(findings, WARN)}
    assert "could not check" in warned["node0"].message and "boom" in warned["node0"].evidence
    assert "could not remove its marker" in warned["node1"].message
    assert ".ddpctl-doctor-*" in warned["node1"].fix


def test_the_check_runs_with_the_others_and_a_clean_cluster_stays_clean() -> None:
    facts_ = {i: {"checkpoint": ck([n for n in NAMES if n != NAMES[i]])} for i in range(3)}
    findings = run_checks(observe(facts_, checkpoint_dir="ckpt"))
    assert [f for f in findings if f.status.rank >= WARN.rank] == []
    assert any(f.check == "checkpoint" and f.host is None and f.status == OK for f in findings)


def test_the_request_carries_the_dir_and_with_the_probe_every_marker() -> None:
    markers = checkpoint_markers(HOSTS)
    assert len(set(markers.values())) == 3
    assert all(m.startswith(f"{MARKER_PREFIX}{h}-") and facts.valid_marker(m) for h, m in markers.items())
    ctx = context(checkpoint_dir="ckpt", checkpoint_markers=markers)
    held = facts_request(ctx, HOSTS[1], probe=True)["checkpoint"]
    assert held == {"dir": "ckpt", "marker": markers["node1"], "peers": markers}
    assert facts_request(ctx, HOSTS[1], probe=False)["checkpoint"] == {"dir": "ckpt", "marker": None, "peers": {}}
    assert "checkpoint" not in facts_request(ctx, HOSTS[1], probe=True, select=["python"])
    assert "checkpoint" not in facts_request(context(), HOSTS[1], probe=True)


# -- the node agent's fact, on real directories --------------------------------------------------

def request(workdir: Path, ckpt: str, **spec: Any) -> dict[str, Any]:
    return {"workdir": str(workdir), "checkpoint": {"dir": ckpt, **spec}}


def test_a_missing_relative_dir_is_created_under_the_workdir_and_no_marker_stays(tmp_path: Path) -> None:
    got = facts.fact_checkpoint(request(tmp_path, "runs/ckpt"))
    assert got == {"path": str(tmp_path / "runs/ckpt"), "existed": False, "writable": True}
    assert list((tmp_path / "runs/ckpt").iterdir()) == []
    again = facts.fact_checkpoint(request(tmp_path, "runs/ckpt"))
    assert again["existed"] is True and again["writable"] is True


def test_an_absolute_or_home_dir_ignores_the_workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert facts.fact_checkpoint(request(tmp_path / "wd", str(tmp_path / "abs")))["path"] == str(tmp_path / "abs")
    home = facts.fact_checkpoint(request(tmp_path / "wd", "~/ckpt"))
    assert home["path"] == str(tmp_path / "home/ckpt") and home["writable"] is True
    assert (tmp_path / "home/ckpt").is_dir() and not (tmp_path / "wd").exists()


def test_a_dir_under_a_regular_file_cannot_be_created(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a directory\n")
    got = facts.fact_checkpoint(request(tmp_path, "file/sub"))
    assert got["writable"] is False and got["step"] == "mkdir"
    assert got["path"] == str(tmp_path / "file/sub")
    assert "Not a directory" in got["error"] and str(tmp_path / "file") in got["error"]
    assert (tmp_path / "file").read_text() == "not a directory\n"


def test_a_failed_write_removes_nothing_it_did_not_create(tmp_path: Path) -> None:
    taken = MARKER_PREFIX + "node0-taken"
    (tmp_path / taken).write_text("someone else's\n")
    got = facts.fact_checkpoint(request(tmp_path, ".", marker=taken, peers={"node0": taken}))
    assert got["writable"] is False and got["step"] == "write" and "File exists" in got["error"]
    assert (tmp_path / taken).read_text() == "someone else's\n"


@pytest.mark.parametrize("bad", ["../escape", "/etc/passwd", "ordinary-file", MARKER_PREFIX + "a/b"])
def test_a_marker_name_that_is_not_a_plain_marker_is_never_used(tmp_path: Path, bad: str) -> None:
    got = facts.fact_checkpoint(dict(request(tmp_path / "ck", ".", marker=bad, peers={"x": bad}), _keep_marker=True))
    assert got["writable"] is True and "marker" not in got  # its own name, removed at once
    assert list((tmp_path / "ck").iterdir()) == []


def test_in_a_held_session_the_marker_stays_until_settled_then_only_it_goes(tmp_path: Path) -> None:
    mine, peer, absent = (MARKER_PREFIX + n for n in ("a-1", "b-2", "c-3"))
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / peer).write_text("")
    (tmp_path / "ck" / "last.pt").write_text("weights")
    req = dict(request(tmp_path, "ck", marker=mine, peers={"a": mine, "b": peer, "c": absent}), _keep_marker=True)
    got = facts.fact_checkpoint(req)
    assert got["marker"] == mine and (tmp_path / "ck" / mine).read_bytes() == facts.MARKER_TEXT
    settled = facts.settle_checkpoint(req, {"facts": {"checkpoint": got}})
    assert settled == {"seen": ["b"]}
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == sorted([peer, "last.pt"])
    assert facts.settle_checkpoint(req, {"facts": {"checkpoint": {"path": str(tmp_path)}}}) is None


def test_a_filesystem_that_hangs_is_an_error_and_its_late_marker_is_removed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    release = threading.Event()
    real = facts._try_checkpoint
    finished: list[dict[str, Any]] = []

    def slow(req: dict[str, Any], keep: bool) -> dict[str, Any]:
        release.wait(10)
        out = real(req, keep)
        finished.append(out)
        return out

    monkeypatch.setattr(facts, "_try_checkpoint", slow)
    monkeypatch.setattr(facts, "CHECKPOINT_TIMEOUT_S", 0.05)
    mine = MARKER_PREFIX + "a-1"
    got = facts.fact_checkpoint(dict(request(tmp_path, "ck", marker=mine, peers={"a": mine, "b": "x"}),
                                     _keep_marker=True))
    assert got["writable"] is False and got["step"] == "timeout" and "within 0.05s" in got["error"]
    release.set()
    deadline = time.monotonic() + 10
    while not (finished and list((tmp_path / "ck").iterdir()) == []) and time.monotonic() < deadline:
        time.sleep(0.01)  # the worker removes its late marker right after the write
    assert finished and finished[0]["writable"] is True and finished[0]["marker"] == mine
    assert list((tmp_path / "ck").iterdir()) == []


def test_the_facts_op_runs_the_sub_fact_only_when_asked(tmp_path: Path) -> None:
    table, _ = facts.sub_facts({"select": ["checkpoint"], "checkpoint": {"dir": "ck"}})
    assert list(table) == ["checkpoint"]
    assert facts.sub_facts({"select": ["checkpoint"]})[0] == {}
    assert "checkpoint" not in facts.sub_facts({"workdir": str(tmp_path)})[0]


# -- doctor's sessions on this machine: the markers across hosts ---------------------------------

def local_ctx(tmp_path: Path, workdirs: dict[str, Path], ckpt: str) -> DoctorContext:
    hosts = tuple(Host(name=name, address="127.0.0.1", python="/nonexistent/python9", workdir=str(wd))
                  for name, wd in workdirs.items())
    return DoctorContext(hosts=hosts, master=hosts[0], master_addr="127.0.0.1", master_port=None,
                         workdirs={h.name: str(wd) for h, wd in zip(hosts, workdirs.values(), strict=True)},
                         timeout_s=60, checkpoint_dir=ckpt)


def checkpoint_findings(ctx: DoctorContext) -> list[Finding]:
    report = doctor_here(ctx)
    assert "checkpoint" in report.checks
    return [f for f in report.findings if f.check == "checkpoint"]


def markers_left(root: Path) -> list[str]:
    return [str(p) for p in root.rglob(f"{MARKER_PREFIX}*")]


def test_two_sessions_in_one_directory_see_each_other_and_leave_nothing(tmp_path: Path) -> None:
    found = checkpoint_findings(local_ctx(tmp_path, {"a": tmp_path, "b": tmp_path}, "ckpt"))
    (shared,) = [f for f in found if f.host is None]
    assert shared.status == OK and "shared by all 2 hosts" in shared.message, found
    assert {f.host for f in found if f.status == OK} == {None, "a", "b"}
    assert (tmp_path / "ckpt").is_dir() and markers_left(tmp_path) == []


def test_two_sessions_in_their_own_directories_are_host_local_and_leave_nothing(tmp_path: Path) -> None:
    found = checkpoint_findings(local_ctx(tmp_path, {"a": tmp_path / "a", "b": tmp_path / "b"}, "ckpt"))
    (local,) = [f for f in found if f.host is None]
    assert local.status == WARN and "host-local on each host" in local.message, found
    assert (tmp_path / "a/ckpt").is_dir() and (tmp_path / "b/ckpt").is_dir()
    assert markers_left(tmp_path) == []


def test_a_job_without_a_checkpoint_dir_has_no_checkpoint_column(tmp_path: Path) -> None:
    ctx = replace(local_ctx(tmp_path, {"a": tmp_path}, "ckpt"), checkpoint_dir=None)
    report = doctor_here(ctx)
    assert "checkpoint" not in report.checks and "workdir" in report.checks
    assert os.listdir(tmp_path) == []
