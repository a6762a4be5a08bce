"""Doctor's `metrics_dir` check: on each host with a metrics_dir (node_exporter's textfile directory),
whether the job can write its textfile there and a node_exporter reads it. The judgement from recorded
facts (pure), the node agent's fact on this machine (real directories, a real fake node_exporter
process), on Python 3.8, and doctor and the launch's request."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from doctor_fixtures import HOSTS, doctor_here, observe
from test_agent_shipping import PY38

from inventory import Host
from node_agent.ops import facts, metricsdir
from node_agent.wire.layout import DOCTOR_MARKER_PREFIX
from orchestrator.checks import metrics_dir
from orchestrator.checks.gather import facts_request
from orchestrator.checks.model import CheckStatus, DoctorContext, Finding
from orchestrator.checks.registry import run_checks
from orchestrator.checks.spec import Runs
from orchestrator.launch.preflight import CHECK_FACTS
from orchestrator.remote.agent import call_agent
from orchestrator.remote.transport import LocalTransport
from orchestrator.remote.wire import MetricsDirFact, parse_facts

WARN, OK, SKIP, INFO = CheckStatus.WARN, CheckStatus.OK, CheckStatus.SKIP, CheckStatus.INFO
DIR = "/var/lib/node_exporter/textfile"
READER = {"pid": 812, "dirs": [DIR], "disabled": False, "reads": True}
GOOD = {"path": DIR, "user": "work", "exists": True, "is_dir": True, "writable": True, "exporters": [READER]}
WITH_DIR = tuple(replace(h, metrics_dir=DIR) for h in HOSTS)


def judge(*per_host: dict[str, Any] | None, hosts: tuple[Host, ...] = WITH_DIR,
          errors: dict[int, dict[str, str]] | None = None) -> list[Finding]:
    changes = {i: {"metrics_dir": f} for i, f in enumerate(per_host) if f is not None}
    return metrics_dir.check(observe(changes, errors, hosts=hosts))


def one(fact: dict[str, Any]) -> Finding:
    """node0's only finding, with a metrics_dir on node0 alone."""
    (found,) = judge(fact, hosts=(WITH_DIR[0], *HOSTS[1:]))
    assert (found.check, found.host) == ("metrics_dir", "node0")
    return found


# -- the judgement (pure) ------------------------------------------------------------------------

def test_without_a_metrics_dir_anywhere_the_check_only_says_it_skipped() -> None:
    findings = judge(GOOD, hosts=HOSTS)
    assert [(f.status, f.host) for f in findings] == [(SKIP, None)]
    assert "textfile_dir" in findings[0].message
    assert metrics_dir.SPEC.shown(observe().ctx) is False
    assert metrics_dir.SPEC.shown(observe(hosts=WITH_DIR).ctx) is True


def test_a_writable_dir_that_node_exporter_reads_passes_on_each_host_with_one() -> None:
    findings = judge(GOOD, None, GOOD, hosts=(WITH_DIR[0], HOSTS[1], WITH_DIR[2]))  # node1 has none: not judged
    assert [(f.status, f.host) for f in findings] == [(OK, "node0"), (OK, "node2")]
    assert findings[0].message == f"metrics_dir {DIR} is writable by work and node_exporter reads it"
    assert findings[0].evidence == f"node_exporter pid 812: --collector.textfile.directory={DIR}"


def test_a_missing_dir_is_a_warning_naming_host_dir_and_the_flag_node_exporter_has() -> None:
    other = {"pid": 9, "dirs": ["/srv/textfile"], "disabled": False, "reads": False}
    found = one({**GOOD, "exists": False, "is_dir": False, "writable": None, "exporters": [other]})
    assert found.status == WARN  # never a failure: the job trains, and `up` must not stop
    assert found.message == f"metrics_dir {DIR} does not exist on node0: the job's metrics would go nowhere"
    assert f"mkdir -p {DIR}" in found.fix and f"--collector.textfile.directory={DIR}" in found.fix
    assert "[defaults.metrics] textfile_dir" in found.fix
    assert "--collector.textfile.directory=/srv/textfile" in found.evidence  # the path it may have meant


def test_a_file_in_its_place_is_a_warning() -> None:
    found = one({**GOOD, "is_dir": False, "writable": None, "exporters": []})
    assert found.status == WARN and found.message == (f"metrics_dir {DIR} on node0 is not a directory: the job's "
                                                      "metrics would go nowhere")


def test_a_dir_the_user_cannot_write_is_a_warning_with_chown() -> None:
    found = one({**GOOD, "writable": False, "step": "write", "error": "[Errno 13] Permission denied"})
    assert found.status == WARN
    assert found.message == f"work cannot write in metrics_dir {DIR} on node0: the job's metrics would go nowhere"
    assert found.evidence == "[Errno 13] Permission denied"
    assert f"sudo chown work {DIR}" in found.fix


def test_a_dir_that_does_not_answer_says_so() -> None:
    found = one({"path": DIR, "user": "work", "writable": False, "step": "timeout",
                 "error": "no answer from the filesystem within 10s"})
    assert found.status == WARN and "did not answer: no answer from the filesystem" in found.message


def test_no_node_exporter_is_a_warning_that_says_what_it_cannot_see() -> None:
    found = one({**GOOD, "exporters": []})
    assert found.status == WARN
    assert found.message == f"no node_exporter process on node0: nothing reads metrics_dir {DIR}"
    assert "hidepid" in found.evidence and "container" in found.evidence
    assert f"--collector.textfile.directory={DIR}" in found.fix


@pytest.mark.parametrize(("reader", "flag"), [
    ({"dirs": ["/srv/other"]}, "--collector.textfile.directory=/srv/other"),
    ({"dirs": [], "disabled": True}, "--no-collector.textfile"),
    ({"dirs": []}, "no --collector.textfile.directory"),
])
def test_a_node_exporter_reading_elsewhere_is_a_warning_naming_its_flag(reader: dict[str, Any], flag: str) -> None:
    found = one({**GOOD, "exporters": [{**READER, "reads": False, **reader}]})
    assert found.status == WARN
    assert found.message == f"node_exporter on node0 does not read metrics_dir {DIR}: it runs with {flag}"
    assert "pid 812" in found.evidence


def test_another_users_node_exporter_with_another_path_is_a_note_not_a_warning() -> None:
    found = one({**GOOD, "exporters": [{**READER, "dirs": ["/textfile"], "reads": None}]})
    assert found.status == INFO
    assert found.message == f"could not tell whether node_exporter on node0 reads metrics_dir {DIR}"
    assert "--collector.textfile.directory=/textfile" in found.evidence and "container" in found.evidence


def test_one_reader_among_several_node_exporters_is_enough() -> None:
    found = one({**GOOD, "exporters": [{**READER, "pid": 5, "reads": False, "dirs": ["/x"]}, READER]})
    assert found.status == OK and "pid 812" in found.evidence and "pid 5" not in found.evidence


def test_proc_unreadable_is_a_note_and_a_leftover_test_file_a_warning() -> None:
    findings = judge({**GOOD, "exporters": None, "proc_error": "[Errno 13] /proc", "cleanup_error": "busy"},
                     hosts=(WITH_DIR[0],))
    assert [(f.status, f.message) for f in findings] == [
        (WARN, f"doctor could not remove its test file in metrics_dir {DIR} on node0"),
        (INFO, f"metrics_dir {DIR} is writable; could not tell whether a node_exporter on node0 reads it")]
    assert findings[1].evidence == "[Errno 13] /proc"


def test_a_fact_that_failed_is_a_warning_with_its_error() -> None:
    (found,) = judge(None, hosts=(WITH_DIR[0],), errors={0: {"metrics_dir": "RuntimeError: boom"}})
    assert (found.status, found.host) == (WARN, "node0")
    assert found.message == f"could not check metrics_dir {DIR} on node0" and found.evidence == "RuntimeError: boom"


def test_an_unreachable_host_leaves_it_to_the_ssh_check() -> None:
    obs = observe({0: {"metrics_dir": GOOD}, 1: {"metrics_dir": GOOD}}, hosts=WITH_DIR[:2])
    obs.facts.pop("node0")
    assert [f.host for f in metrics_dir.check(obs)] == ["node1"]


def test_it_runs_before_a_launch_and_never_fails_it() -> None:
    broken = {"path": DIR, "user": "work", "exists": False}
    findings = run_checks(observe({0: {"metrics_dir": broken}}, hosts=(WITH_DIR[0], *HOSTS[1:])), Runs.LAUNCH)
    assert [(f.check, f.status) for f in findings if f.check == "metrics_dir"] == [("metrics_dir", WARN)]
    assert [f for f in findings if f.status == CheckStatus.FAIL] == []


def test_only_hosts_with_a_metrics_dir_are_asked_in_doctor_and_before_a_launch() -> None:
    ctx = observe(hosts=(WITH_DIR[0], *HOSTS[1:])).ctx
    assert facts_request(ctx, ctx.hosts[0], probe=True)["metrics_dir"] == DIR
    assert "metrics_dir" not in facts_request(ctx, ctx.hosts[1], probe=True)
    assert "metrics_dir" in CHECK_FACTS
    assert facts_request(ctx, ctx.hosts[0], probe=False, select=list(CHECK_FACTS))["metrics_dir"] == DIR
    assert "metrics_dir" not in facts_request(ctx, ctx.hosts[0], probe=False, select=["python"])
    assert "metrics_dir" in facts.sub_facts({"metrics_dir": DIR})[0]
    assert "metrics_dir" not in facts.sub_facts({})[0]


# -- node_exporter's argv (pure) -----------------------------------------------------------------

@pytest.mark.parametrize(("argv", "parsed"), [
    (["/usr/bin/node_exporter", "--collector.textfile.directory=/a"], (["/a"], False)),
    (["/bin/prometheus-node-exporter", "--collector.textfile.directory", "/a", "--web.listen-address=:9100"],
     (["/a"], False)),
    (["node_exporter", "--collector.textfile.directory=/a", "--collector.textfile.directory=/b"],
     (["/a", "/b"], False)),
    (["node_exporter", "--no-collector.textfile"], ([], True)),
    (["node_exporter", "--collector.textfile.directory"], ([], False)),  # no value after it
    (["/usr/bin/python3", "node_exporter", "--collector.textfile.directory=/a"], None),  # argv[0] decides
    ([], None),
])
def test_textfile_dirs_reads_both_flag_forms(argv: list[str], parsed: tuple[list[str], bool] | None) -> None:
    assert metricsdir.textfile_dirs(argv) == parsed


# -- the node agent's fact, on this machine ------------------------------------------------------

@pytest.fixture
def exporter(tmp_path: Path) -> Iterator[Any]:
    """Starts fake node_exporters: this interpreter under a link named node_exporter, sleeping,
    with the given flags after its -c program (they are its argv, as /proc shows them)."""
    link = tmp_path / "bin" / "node_exporter"
    link.parent.mkdir()
    link.symlink_to(sys.executable)
    started: list[subprocess.Popen[bytes]] = []

    def start(*flags: str) -> int:
        proc = subprocess.Popen([str(link), "-S", "-c", "import time; time.sleep(120)", *flags])
        started.append(proc)
        deadline = time.monotonic() + 10
        while metricsdir.textfile_dirs(proc_argv(proc.pid)) is None and time.monotonic() < deadline:
            time.sleep(0.02)  # until its argv is in /proc
        return proc.pid

    yield start
    for proc in started:
        proc.kill()
        proc.wait()


def proc_argv(pid: int) -> list[str]:
    try:
        return [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
    except OSError:
        return []


def mine(fact: dict[str, Any], pid: int) -> dict[str, Any]:
    (found,) = [e for e in fact["exporters"] if e["pid"] == pid]
    return found


def test_a_writable_dir_read_by_a_node_exporter_by_name_and_through_a_link(tmp_path: Path, exporter: Any) -> None:
    textfile = tmp_path / "textfile"
    textfile.mkdir()
    (tmp_path / "alias").symlink_to(textfile)
    by_name = exporter(f"--collector.textfile.directory={textfile}")
    by_link = exporter("--collector.textfile.directory", str(tmp_path / "alias"))  # another name, same directory
    elsewhere = exporter(f"--collector.textfile.directory={tmp_path}")
    fact = metricsdir.fact_metrics_dir({"metrics_dir": str(textfile)})
    assert (fact["exists"], fact["is_dir"], fact["writable"]) == (True, True, True)
    assert list(textfile.iterdir()) == []  # its test file is gone
    assert mine(fact, by_name) == {"pid": by_name, "dirs": [str(textfile)], "disabled": False, "reads": True}
    assert mine(fact, by_link)["reads"] is True
    assert mine(fact, elsewhere)["reads"] is False
    md = parse_facts("a", {"facts": {"metrics_dir": fact}}, 0.0, 0.0).facts.metrics_dir
    assert isinstance(md, MetricsDirFact) and metrics_dir.judge("a", md)[0].status == OK


def test_a_missing_dir_and_a_file_are_neither_created_nor_written(tmp_path: Path) -> None:
    missing = metricsdir.fact_metrics_dir({"metrics_dir": str(tmp_path / "nope")})
    assert (missing["exists"], missing["is_dir"], "writable" in missing) == (False, False, False)
    assert not (tmp_path / "nope").exists()
    (tmp_path / "file").write_text("x")
    a_file = metricsdir.fact_metrics_dir({"metrics_dir": str(tmp_path / "file")})
    assert (a_file["exists"], a_file["is_dir"], "writable" in a_file) == (True, False, False)
    assert (tmp_path / "file").read_text() == "x"


@pytest.mark.skipif(not os.path.isdir("/sys"), reason="no /sys")
def test_a_dir_not_even_root_can_write_in_is_not_writable_with_the_os_error() -> None:
    fact = metricsdir.fact_metrics_dir({"metrics_dir": "/sys"})  # sysfs: EACCES for root too
    assert (fact["is_dir"], fact["writable"], fact["step"]) == (True, False, "write")
    assert "Errno" in fact["error"]
    md = parse_facts("a", {"facts": {"metrics_dir": fact}}, 0.0, 0.0).facts.metrics_dir
    assert md is not None and "cannot write in metrics_dir /sys on a" in metrics_dir.judge("a", md)[0].message


def test_a_failed_write_leaves_no_test_file_and_a_marker_prefix_names_it(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    names: list[str] = []
    real_write = os.write

    def failing_write(fd: int, data: bytes) -> int:
        names.append(os.readlink(f"/proc/self/fd/{fd}"))
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(metricsdir.os, "write", failing_write)
    out = metricsdir.try_write(str(tmp_path))
    monkeypatch.setattr(metricsdir.os, "write", real_write)
    assert out == {"writable": False, "step": "write", "error": "[Errno 28] No space left on device"}
    assert Path(names[0]).name.startswith(DOCTOR_MARKER_PREFIX) and not Path(names[0]).name.endswith(".prom")
    assert list(tmp_path.iterdir()) == []


def test_a_dir_that_hangs_is_reported_after_the_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metricsdir, "WRITE_TIMEOUT_S", 0.2)
    hung = threading.Event()  # the directory answers once it is set: never, while the fact is read

    def look(path: str) -> dict[str, object]:
        hung.wait(60)
        return {}

    monkeypatch.setattr(metricsdir, "look", look)
    out = metricsdir.fact_metrics_dir({"metrics_dir": str(tmp_path)})
    assert not hung.is_set()  # answered while the look still hung
    hung.set()
    assert (out["step"], out["writable"], "exporters" in out) == ("timeout", False, False)
    md = parse_facts("a", {"facts": {"metrics_dir": out}}, 0.0, 0.0).facts.metrics_dir
    assert md is not None and "did not answer" in metrics_dir.judge("a", md)[0].message


@pytest.mark.skipif(PY38 is None, reason="no python3.8 on this machine")
def test_the_fact_runs_on_python_3_8(tmp_path: Path, exporter: Any) -> None:
    pid = exporter(f"--collector.textfile.directory={tmp_path}")
    host = Host(name="a", address="127.0.0.1", python=str(PY38))
    result = call_agent(LocalTransport(host), "facts", {"select": ["metrics_dir"], "metrics_dir": str(tmp_path)}).result
    assert result["errors"] == {}
    md = parse_facts("a", result, 0.0, 0.0).facts.metrics_dir
    assert md is not None and md.writable is True and md.exporters is not None
    assert [e.reads for e in md.exporters if e.pid == pid] == [True]


# -- doctor on this machine ----------------------------------------------------------------------

def test_doctor_warns_about_a_missing_metrics_dir_and_has_its_column(tmp_path: Path) -> None:
    host = Host(name="a", address="127.0.0.1", workdir=str(tmp_path), metrics_dir=str(tmp_path / "textfile"))
    ctx = DoctorContext(hosts=(host,), master=host, master_addr="127.0.0.1", master_port=None,
                        workdirs={"a": str(tmp_path)}, timeout_s=60)
    report = doctor_here(ctx)
    assert "metrics_dir" in report.checks
    found = [f for f in report.findings if f.check == "metrics_dir"]
    assert [(f.status, f.host) for f in found] == [(WARN, "a")], found
    assert found[0].message.startswith(f"metrics_dir {tmp_path / 'textfile'} does not exist on a")
